package main

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type condTime struct {
	status corev1.ConditionStatus
	at     metav1.Time
}

// status computes the Pod status from what runs, as the kubelet's
// generateAPIPodStatus does. w.mu is held.
func (w *podWorker) status(now metav1.Time) corev1.PodStatus {
	pod := w.pod
	s := corev1.PodStatus{
		HostIP:    w.r.hostIP,
		HostIPs:   []corev1.HostIP{{IP: w.r.hostIP}},
		StartTime: w.startTime,
		QOSClass:  pod.Status.QOSClass,
	}
	if w.ip != "" && w.sandboxReady {
		s.PodIP = w.ip
		s.PodIPs = []corev1.PodIP{{IP: w.ip}}
	}

	var unreadyRegular, incompleteInit []string
	anyRunning, anyRestarting, allRegularReady := false, false, true
	for _, c := range w.ctrs {
		cs := w.containerStatus(c)
		switch c.kind {
		case kindRegular:
			s.ContainerStatuses = append(s.ContainerStatuses, cs)
			if !cs.Ready {
				allRegularReady = false
				unreadyRegular = append(unreadyRegular, c.spec.Name)
			}
			if cs.State.Running != nil {
				anyRunning = true
			}
			if c.hadRun && cs.State.Running == nil {
				anyRestarting = true
			}
		default:
			s.InitContainerStatuses = append(s.InitContainerStatuses, cs)
			complete := (c.kind == kindInit && cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0) ||
				(c.kind == kindSidecar && cs.Started != nil && *cs.Started)
			if !complete && !w.initialized {
				incompleteInit = append(incompleteInit, c.spec.Name)
			}
			if c.kind == kindSidecar && !cs.Ready {
				allRegularReady = false
				unreadyRegular = append(unreadyRegular, c.spec.Name)
			}
		}
	}

	switch {
	case w.phase != "":
		s.Phase = w.phase
	case !w.initialized:
		s.Phase = corev1.PodPending
	case anyRunning || anyRestarting:
		s.Phase = corev1.PodRunning
	default:
		s.Phase = corev1.PodPending
	}

	s.Conditions = w.conditions(now, s.Phase, allRegularReady, unreadyRegular, incompleteInit)
	if w.volumeErr != "" && !w.initialized {
		s.Message = w.volumeErr
	}
	return s
}

// conditions are the kubelet's pod conditions, with the ones others own
// (PodScheduled, readiness gates, DisruptionTarget) kept as they are.
func (w *podWorker) conditions(now metav1.Time, phase corev1.PodPhase, allRegularReady bool, unreadyRegular, incompleteInit []string) []corev1.PodCondition {
	pod := w.pod
	cond := func(t corev1.PodConditionType, ok bool, reason, msg string) corev1.PodCondition {
		st := corev1.ConditionFalse
		if ok {
			st = corev1.ConditionTrue
			reason, msg = "", ""
		}
		return corev1.PodCondition{Type: t, Status: st, Reason: reason, Message: msg, LastTransitionTime: w.transition(t, st, now)}
	}
	terminal := phase == corev1.PodSucceeded || phase == corev1.PodFailed
	readyReason, readyMsg := "ContainersNotReady", fmt.Sprintf("containers with unready status: [%s]", strings.Join(unreadyRegular, " "))
	if terminal {
		readyReason, readyMsg = "PodCompleted", ""
		allRegularReady = false
	}
	initReason, initMsg := "ContainersNotInitialized", fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(incompleteInit, " "))
	podReady := allRegularReady
	gatesReason, gatesMsg := readyReason, readyMsg
	if podReady {
		var missing []string
		for _, g := range pod.Spec.ReadinessGates {
			if !conditionTrue(pod.Status.Conditions, g.ConditionType) {
				missing = append(missing, string(g.ConditionType))
			}
		}
		if len(missing) > 0 {
			podReady = false
			gatesReason, gatesMsg = "ReadinessGatesNotReady", fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", strings.Join(missing, ", "))
		}
	}
	out := []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, w.sandboxReady, "", ""),
		cond(corev1.PodInitialized, w.initialized, initReason, initMsg),
		cond(corev1.ContainersReady, allRegularReady, readyReason, readyMsg),
		cond(corev1.PodReady, podReady, gatesReason, gatesMsg),
	}
	for _, c := range pod.Status.Conditions {
		switch c.Type {
		case corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady:
		default:
			out = append(out, c)
		}
	}
	return out
}

// transition keeps a condition's lastTransitionTime while its status stays.
func (w *podWorker) transition(t corev1.PodConditionType, st corev1.ConditionStatus, now metav1.Time) metav1.Time {
	if w.condTimes == nil {
		w.condTimes = map[corev1.PodConditionType]condTime{}
		for _, c := range w.pod.Status.Conditions {
			w.condTimes[c.Type] = condTime{status: c.Status, at: c.LastTransitionTime}
		}
	}
	if ct, ok := w.condTimes[t]; ok && ct.status == st {
		return ct.at
	}
	now = metav1.NewTime(now.Rfc3339Copy().Time)
	w.condTimes[t] = condTime{status: st, at: now}
	return now
}

func conditionTrue(cs []corev1.PodCondition, t corev1.PodConditionType) bool {
	for _, c := range cs {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (w *podWorker) containerStatus(c *ctr) corev1.ContainerStatus {
	cs := corev1.ContainerStatus{
		Name:                 c.spec.Name,
		Image:                c.spec.Image,
		ImageID:              c.imageID,
		ContainerID:          c.containerID,
		RestartCount:         c.restartCount,
		Ready:                c.ready,
		Started:              new(c.started),
		State:                c.state,
		LastTerminationState: c.lastState,
	}
	if cs.State.Waiting == nil && cs.State.Running == nil && cs.State.Terminated == nil {
		reason := "ContainerCreating"
		if c.kind == kindRegular && !w.initialized && w.hasInit() {
			reason = "PodInitializing"
		}
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason}
	}
	return cs
}

func (w *podWorker) hasInit() bool {
	for _, c := range w.ctrs {
		if c.kind != kindRegular {
			return true
		}
	}
	return false
}
