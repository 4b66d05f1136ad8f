package kubectlhcp

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// Which pod's log `kubectl hcp logs` shows, and from when: pure functions
// of the versions of the session it sees; logs.go streams.

// arrivalSlack is how much earlier than the moment the plugin saw a
// session on a pod its log is shown from: the watch's latency, and the
// skew between this machine's clock and the node's (log lines carry the
// node's time).
const arrivalSlack = 2 * time.Second

// logTarget is a pod whose harness log to show, and from when.
type logTarget struct {
	Pod string
	// Since: lines from this time on (zero: everything the pod kept).
	Since time.Time
}

// ownerPod is the pod running the session: status.podName, or for a
// session admitted at creation that no status write has named a pod for
// yet, the pod that decided it. "" while no pod owns it (between a
// release at a drain and the takeover, or before the gate decided).
func ownerPod(hs *hcpv1alpha1.HCPSession) string {
	if p := hs.Status.PodName; p != "" {
		return p
	}
	if (hs.Status.State == "" || hs.Status.State == hcpv1alpha1.SessionPending) && handover(hs) == nil {
		return hs.Annotations[annotationDecidingPod]
	}
	return ""
}

// handover is the session's Handover condition, if any.
func handover(hs *hcpv1alpha1.HCPSession) *metav1.Condition {
	return meta.FindStatusCondition(hs.Status.Conditions, hcpv1alpha1.ConditionHandover)
}

// arrivedAt is when the session arrived on pod, as far as the session
// records it: the Handover condition's time when a takeover by that pod
// is what it records (the time is the taking sidecar's clock, on the
// pod's node); else zero (unknown).
func arrivedAt(hs *hcpv1alpha1.HCPSession, pod string) time.Time {
	c := handover(hs)
	if c == nil || c.Reason != "TakenOver" || !strings.Contains(c.Message, "pod "+pod) {
		return time.Time{}
	}
	return c.LastTransitionTime.Time
}

// firstTarget is where `logs` starts: the session's pod, from when the
// session arrived there (its creation, when it never moved; the takeover
// it records; else everything the pod kept). Pod "" when no pod owns it.
func firstTarget(hs *hcpv1alpha1.HCPSession) logTarget {
	pod := ownerPod(hs)
	if pod == "" {
		return logTarget{}
	}
	if handover(hs) == nil {
		return logTarget{Pod: pod, Since: hs.CreationTimestamp.Add(-arrivalSlack)}
	}
	if at := arrivedAt(hs, pod); !at.IsZero() {
		return logTarget{Pod: pod, Since: at.Add(-arrivalSlack)}
	}
	return logTarget{Pod: pod}
}

// followPlan is what logs -f decides as it sees the session change.
type followPlan struct {
	cur logTarget
	// left: no pod owns the session since it left cur.Pod.
	left bool
	done bool
}

// followStep is what to do after a version of the session.
type followStep struct {
	// Next, when set, is the pod to show now: the current pod's log ends
	// (once it has written what it still writes, or after a grace) and
	// Next's follows from Next.Since.
	Next *logTarget
	// Left: the session left the current pod and no pod owns it yet
	// (released at a drain): the pod's log is shown to its end, but not
	// reopened.
	Left bool
	// Done: the session ended (or was deleted); show the rest of the
	// current pod's log and stop.
	Done bool
	// Note is a line for stderr: what happened to the session.
	Note string
}

// start is the first step of logs -f, from the session as first read.
func (p *followPlan) start(hs *hcpv1alpha1.HCPSession) followStep {
	t := firstTarget(hs)
	if t.Pod == "" {
		return followStep{Note: fmt.Sprintf("session %s is %s and no pod owns it now; waiting for one", hs.Name, stateText(hs))}
	}
	p.cur = t
	return followStep{Next: &t}
}

// observe is the step after a later version of the session, seen at
// seenAt (this machine's clock).
func (p *followPlan) observe(hs *hcpv1alpha1.HCPSession, seenAt time.Time) followStep {
	if p.done {
		return followStep{}
	}
	var step followStep
	pod := ownerPod(hs)
	if pod == "" && p.cur.Pod != "" && !p.left && !stateOf(hs).IsTerminal() {
		p.left = true
		step.Left = true
		step.Note = fmt.Sprintf("session %s left pod %s (%s); waiting for the pod that takes it over", hs.Name, p.cur.Pod, stateText(hs))
	}
	if pod != "" && (pod != p.cur.Pod || p.left) {
		since := seenAt.Add(-arrivalSlack)
		// The recorded takeover time is exact (the node's clock), unless
		// it is an earlier takeover's: the condition keeps its first time
		// while it stays True, so a time before the current pod's arrival
		// is not this one's.
		if at := arrivedAt(hs, pod); !at.IsZero() && at.After(p.cur.Since.Add(arrivalSlack)) && at.Before(seenAt.Add(arrivalSlack)) {
			since = at.Add(-arrivalSlack)
		}
		t := logTarget{Pod: pod, Since: since}
		step.Next = &t
		p.left = false
		step.Note = fmt.Sprintf("session %s is on pod %s (%s); following pod %s", hs.Name, pod, stateText(hs), pod)
		if p.cur.Pod != "" && p.cur.Pod != pod {
			step.Note = fmt.Sprintf("session %s moved from pod %s to pod %s (%s); following pod %s", hs.Name, p.cur.Pod, pod, stateText(hs), pod)
		}
		p.cur = t
	}
	if stateOf(hs).IsTerminal() {
		p.done = true
		step.Done = true
		step.Note = strings.TrimPrefix(step.Note+"; ", "; ") + fmt.Sprintf("session %s ended %s", hs.Name, stateText(hs))
	}
	return step
}

// gone is the step after the session was deleted.
func (p *followPlan) gone(name string) followStep {
	p.done = true
	return followStep{Done: true, Note: fmt.Sprintf("session %s was deleted", name)}
}

// stateText is the state with its reason: "PAUSED (harness_moved)".
func stateText(hs *hcpv1alpha1.HCPSession) string {
	s := string(stateOf(hs))
	if r := hs.Status.Reason; r != "" {
		s += " (" + r + ")"
	}
	return s
}
