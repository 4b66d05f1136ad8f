package kubectlhcp

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// RenderDescription writes d as kubectl describe does: fields, the L3
// decision, the pod, the timeline.
func RenderDescription(w io.Writer, d Description, now time.Time) error {
	renderFields(w, d.Session, now)
	renderDecision(w, d)
	renderPod(w, d)
	_, _ = fmt.Fprintln(w, "\nTimeline:")
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for _, e := range Timeline(d.Session, d.Events) {
		_, _ = fmt.Fprintf(tw, "  %s\t%s\t%s\n", e.At.UTC().Format(time.RFC3339), relative(e.At, now), e.What)
	}
	_ = tw.Flush()
	if d.EventsErr != "" {
		_, _ = fmt.Fprintf(w, "  (Events could not be listed: %s)\n", d.EventsErr)
	} else if len(d.Events) == 0 {
		_, _ = fmt.Fprintln(w, "  (no Kubernetes Events about this session)")
	}
	return nil
}

// fieldWriter writes "Key:  value" lines aligned.
type fieldWriter struct{ tw *tabwriter.Writer }

func newFieldWriter(w io.Writer) fieldWriter {
	return fieldWriter{tw: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
}

func (f fieldWriter) field(k, v string) { _, _ = fmt.Fprintf(f.tw, "%s:\t%s\n", k, v) }
func (f fieldWriter) flush()            { _ = f.tw.Flush() }

// renderFields writes what the session is, its state and its times.
func renderFields(w io.Writer, hs *hcpv1alpha1.HCPSession, now time.Time) {
	st := hs.Status
	f := newFieldWriter(w)
	defer f.flush()
	f.field("Name", hs.Name)
	f.field("Namespace", hs.Namespace)
	owner := ""
	for _, r := range hs.OwnerReferences {
		if r.Kind == "Callee" {
			owner = " (Callee " + r.Name + ")"
		}
	}
	f.field("Callee", hs.Spec.CalleeID+owner)
	f.field("Caller", hs.Spec.CallerID)
	f.field("Capability", hs.Spec.Capability)
	if hs.Spec.Intent != "" {
		f.field("Intent", oneLine(hs.Spec.Intent, 200))
	}
	state := string(stateOf(hs))
	if st.Reason != "" {
		state += " (" + st.Reason + ")"
	}
	f.field("State", state)
	if st.Message != "" && st.Reason != reasonAccepted {
		f.field("Message", oneLine(st.Message, 300))
	}
	if p := st.Progress; p != nil {
		f.field("Progress", strings.TrimSpace(percentText(p)+" "+progressText(p)))
	}
	events := fmt.Sprintf("%d (last sequence %d", st.EventCount, st.LastSequence)
	if st.CallerAckedSequence > 0 {
		events += fmt.Sprintf(", caller acknowledged up to %d", st.CallerAckedSequence)
	}
	f.field("Events sent", events+")")
	f.field("Created", timeAndAge(hs.CreationTimestamp.Time, now))
	if st.StartedAt != nil {
		f.field("Started", timeAndAge(st.StartedAt.Time, now))
	}
	if st.CompletedAt != nil {
		f.field("Ended", timeAndAge(st.CompletedAt.Time, now))
	}
	f.field("Duration", sessionDuration(hs, now))
	if st.TokenExpiresAt != nil && !stateOf(hs).IsTerminal() {
		f.field("Expires", st.TokenExpiresAt.UTC().Format(time.RFC3339)+" (max duration "+orDash(string(hs.Spec.MaxDuration))+")")
	}
	if hs.Spec.AbortRequested {
		abort := "yes"
		if r := hs.Annotations[AnnotationAbortReason]; r != "" {
			abort += ", reason: " + oneLine(r, 200) + " (annotation " + AnnotationAbortReason + ")"
		}
		f.field("Abort requested", abort)
	}
	if r := st.Result; r != nil {
		if r.Summary != "" {
			f.field("Result", oneLine(r.Summary, 300))
		}
		for _, a := range r.Artifacts {
			f.field("  Artifact", a.URI)
		}
	}
	if e := st.Error; e != nil && (e.Code != "" || e.Message != "") {
		s := strings.TrimPrefix(e.Code+": "+oneLine(e.Message, 300), ": ")
		if e.Recoverable {
			s += " (recoverable)"
		}
		f.field("Error", s)
	}
}

// renderDecision writes the L3 decision.
func renderDecision(w io.Writer, d Description) {
	hs := d.Session
	dec := DecisionOf(hs, d.Events)
	_, _ = fmt.Fprintln(w, "\nL3 decision:")
	f := newFieldWriter(w)
	defer f.flush()
	f.field("  Verdict", dec.Verdict)
	if dec.Detail != "" {
		f.field("  Rule", dec.Detail)
	} else if dec.Verdict == verdictAdmitted {
		rule := "not recorded any more (status.message names the admitting CapabilityPolicy rule only while the session is RUNNING after admission)"
		if len(d.Policies) > 0 {
			rule += "; CapabilityPolicies selecting callee " + hs.Spec.CalleeID + " now: " + strings.Join(d.Policies, ", ")
		}
		f.field("  Rule", rule)
	}
	if hs.Spec.RiskLevel != "" {
		f.field("  Risk", string(hs.Spec.RiskLevel)+" (assessed)")
	}
	if hs.Spec.DataClassification != "" {
		f.field("  Data class", string(hs.Spec.DataClassification))
	}
	if hs.Spec.MaxDuration != "" {
		f.field("  Max duration", string(hs.Spec.MaxDuration))
	}
	if dec.DecidedBy != "" {
		f.field("  Decided by", "pod "+dec.DecidedBy)
	}
}

// renderPod writes the owning pod.
func renderPod(w io.Writer, d Description) {
	_, _ = fmt.Fprintln(w, "\nPod:")
	f := newFieldWriter(w)
	defer f.flush()
	switch name := d.Session.Status.PodName; {
	case name == "":
		f.field("  Name", "<none> (no pod owns the session yet)")
	case d.Pod != nil:
		f.field("  Name", d.Pod.Name)
		f.field("  Status", podStatus(d.Pod))
		if d.Pod.Spec.NodeName != "" {
			f.field("  Node", d.Pod.Spec.NodeName)
		}
		if d.Pod.Status.PodIP != "" {
			f.field("  IP", d.Pod.Status.PodIP)
		}
	default:
		f.field("  Name", name+" ("+d.PodErr+")")
	}
}

func timeAndAge(t, now time.Time) string {
	return t.UTC().Format(time.RFC3339) + " (" + relative(t, now) + ")"
}

// relative is "5m ago", or "in 3m" for a time ahead; API timestamps have
// whole seconds, so within a second it is "just now".
func relative(t, now time.Time) string {
	switch d := now.Sub(t); {
	case d > -time.Second && d < time.Second:
		return "just now"
	case d < 0:
		return "in " + shortDuration(-d)
	default:
		return shortDuration(d) + " ago"
	}
}

// podStatus is the pod's phase, readiness and restarts, as one phrase.
func podStatus(p *corev1.Pod) string {
	s := string(p.Status.Phase)
	if p.DeletionTimestamp != nil {
		s = "Terminating"
	}
	ready := "not ready"
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			ready = "ready"
		}
	}
	var restarts int32
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		restarts += cs.RestartCount
	}
	s += ", " + ready
	if restarts > 0 {
		s += fmt.Sprintf(", %d restarts", restarts)
	}
	return s
}
