package kubectlhcp

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// annotationDecidingPod is the callee sidecar's annotation naming the pod
// that decided the task (internal/sidecar/callee.AnnotationDecidingPod;
// the plugin does not import the sidecar).
const annotationDecidingPod = "hcp.io/deciding-pod"

// reasonAccepted is status.reason when the gate admitted the task.
const reasonAccepted = "accepted"

// Verdicts of Decision.
const (
	verdictAdmitted = "admitted"
	verdictRejected = "rejected"
)

func newDescribeCommand(env *Env) *cobra.Command {
	return &cobra.Command{
		Use:   "describe SESSION",
		Short: "Show a session: its timeline, the L3 decision that admitted it, the owning pod, its Events",
		Example: `  kubectl hcp describe 4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10
  kubectl hcp describe 4b1c -n lab`,
		Args: exactArgs(1, "SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return RunDescribe(cmd.Context(), env, args[0])
		},
	}
}

// exactArgs is cobra.ExactArgs with an error that says what is missing.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return &ExitError{Code: ExitFailure, Err: fmt.Errorf("%s takes %s (got %d arguments); see %s --help", cmd.CommandPath(), what, len(args), cmd.CommandPath())}
		}
		return nil
	}
}

// Description is what describe shows of a session.
type Description struct {
	Session *hcpv1alpha1.HCPSession
	// Pod is the owning pod (status.podName), nil when it is gone or unset;
	// PodErr says why it could not be read.
	Pod    *corev1.Pod
	PodErr string
	// Events are the Kubernetes Events about the session.
	Events []corev1.Event
	// EventsErr says why the Events could not be listed.
	EventsErr string
	// Policies are the CapabilityPolicies that select the session's callee
	// now (status.matchedCallees): where to look when the admitting rule is
	// no longer recorded.
	Policies []string
}

// RunDescribe shows the session named name.
func RunDescribe(ctx context.Context, env *Env, name string) error {
	c, ns, err := env.clientAndNamespace()
	if err != nil {
		return err
	}
	hs, err := getSession(ctx, c, ns, name)
	if err != nil {
		return &ExitError{Code: ExitFailure, Err: err}
	}
	d := Description{Session: hs}
	if pod := hs.Status.PodName; pod != "" {
		p := &corev1.Pod{}
		switch err := c.Get(ctx, client.ObjectKey{Namespace: hs.Namespace, Name: pod}, p); {
		case err == nil:
			d.Pod = p
		case apierrors.IsNotFound(err):
			d.PodErr = "gone"
		default:
			d.PodErr = err.Error()
		}
	}
	var policies hcpv1alpha1.CapabilityPolicyList
	if err := c.List(ctx, &policies, client.InNamespace(hs.Namespace)); err == nil {
		for _, p := range policies.Items {
			if slices.Contains(p.Status.MatchedCallees, hs.Spec.CalleeID) {
				d.Policies = append(d.Policies, p.Name)
			}
		}
	}
	var events corev1.EventList
	if err := c.List(ctx, &events, client.InNamespace(hs.Namespace), client.MatchingFieldsSelector{Selector: fields.AndSelectors(
		fields.OneTermEqualSelector("involvedObject.name", hs.Name),
		fields.OneTermEqualSelector("involvedObject.kind", "HCPSession"),
	)}); err != nil {
		d.EventsErr = err.Error()
	} else {
		for _, e := range events.Items {
			if e.InvolvedObject.UID == "" || e.InvolvedObject.UID == hs.UID {
				d.Events = append(d.Events, e)
			}
		}
	}
	return RenderDescription(env.Streams.Out, d, env.now())
}

// TimelineEntry is one dated line of a session's timeline.
type TimelineEntry struct {
	At   time.Time
	What string
	// Source: status (what the HCPSession records) or event (a Kubernetes
	// Event).
	Source string
}

// Timeline builds a session's timeline from what its status records
// (creation, start, conditions, checkpoint, last event, end) and its
// Events, oldest first. The HCPSession is a read model that keeps the
// latest state with its times, so a state passed through in between (a
// PAUSED that was resumed) shows only through an Event or a condition.
func Timeline(hs *hcpv1alpha1.HCPSession, events []corev1.Event) []TimelineEntry {
	st := hs.Status
	var out []TimelineEntry
	add := func(at time.Time, src, format string, args ...any) {
		if !at.IsZero() {
			out = append(out, TimelineEntry{At: at, What: fmt.Sprintf(format, args...), Source: src})
		}
	}
	created := "created PENDING: task_submit received, the L3 gate ran"
	if hs.Annotations[hcpv1alpha1.AnnotationAdmitted] == "true" {
		created = "created admitted: task_submit received, the L3 gate admitted it" // no concurrency limit: the create decided
	}
	if p := hs.Annotations[annotationDecidingPod]; p != "" {
		created += " in pod " + p
	}
	add(hs.CreationTimestamp.Time, "status", "%s", created)
	if st.StartedAt != nil {
		what := "RUNNING: admitted, task_accepted sent, task handed to the harness"
		if st.State == hcpv1alpha1.SessionRunning && st.Reason == reasonAccepted && st.Message != "" {
			what += " (" + st.Message + ")"
		}
		add(st.StartedAt.Time, "status", "%s", what)
	}
	for _, c := range st.Conditions {
		switch c.Type {
		case hcpv1alpha1.ConditionReady, "Reconciling", "Stalled":
			// Derived from the state: the state lines say it.
			continue
		}
		what := fmt.Sprintf("condition %s=%s", c.Type, c.Status)
		if c.Reason != "" {
			what += " (" + c.Reason + ")"
		}
		if c.Message != "" {
			what += ": " + oneLine(c.Message, 200)
		}
		add(c.LastTransitionTime.Time, "status", "%s", what)
	}
	if cp := st.LastCheckpoint; cp != nil && cp.CreatedAt != nil {
		what := "last checkpoint " + cp.ID
		if cp.Description != "" {
			what += ": " + cp.Description
		}
		if cp.Resumable {
			what += " (resumable)"
		}
		add(cp.CreatedAt.Time, "status", "%s", what)
	}
	if st.LastEventAt != nil {
		what := fmt.Sprintf("last event #%d", st.LastSequence)
		if p := st.Progress; p != nil {
			what += fmt.Sprintf(" (progress %s %s)", percentText(p), progressText(p))
		}
		add(st.LastEventAt.Time, "status", "%s", strings.TrimSpace(what))
	}
	if stateOf(hs).IsTerminal() && st.CompletedAt != nil {
		what := string(stateOf(hs))
		if st.Reason != "" {
			what += " (" + st.Reason + ")"
		}
		switch {
		case st.Error != nil && (st.Error.Code != "" || st.Error.Message != ""):
			what += ": " + strings.TrimPrefix(st.Error.Code+": "+oneLine(st.Error.Message, 200), ": ")
		case st.Result != nil && st.Result.Summary != "":
			what += ": " + oneLine(st.Result.Summary, 200)
		case st.Message != "":
			what += ": " + oneLine(st.Message, 200)
		}
		add(st.CompletedAt.Time, "status", "%s", what)
	}
	for _, e := range events {
		at := eventTime(e)
		what := fmt.Sprintf("%s %s: %s", e.Type, e.Reason, oneLine(e.Message, 200))
		if e.Count > 1 {
			what += fmt.Sprintf(" (x%d)", e.Count)
		}
		if src := eventSource(e); src != "" {
			what += " [" + src + "]"
		}
		add(at, "event", "%s", what)
	}
	slices.SortStableFunc(out, func(a, b TimelineEntry) int { return a.At.Compare(b.At) })
	return out
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.FirstTimestamp.IsZero():
		return e.FirstTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

func eventSource(e corev1.Event) string {
	if e.ReportingController != "" {
		if e.ReportingInstance != "" {
			return e.ReportingController + "/" + e.ReportingInstance
		}
		return e.ReportingController
	}
	if e.Source.Component != "" {
		if e.Source.Host != "" {
			return e.Source.Component + "/" + e.Source.Host
		}
		return e.Source.Component
	}
	return ""
}

// Decision is the L3 decision as the session records it.
type Decision struct {
	// Verdict: admitted, rejected, or undecided (PENDING).
	Verdict string
	// Detail names the admitting policy and rule, or the rejection reason
	// and message; empty when no longer recorded.
	Detail    string
	DecidedBy string
}

// DecisionOf reads the L3 decision from the session: the verdict from its
// state, the admitting rule from status.message while the session is
// RUNNING after admission (the sidecar replaces it at the next state
// change) or from an Event that names it, the rejection from
// status.reason/message/error.
func DecisionOf(hs *hcpv1alpha1.HCPSession, events []corev1.Event) Decision {
	st := hs.Status
	d := Decision{DecidedBy: hs.Annotations[annotationDecidingPod]}
	if d.DecidedBy == "" {
		d.DecidedBy = st.PodName
	}
	switch stateOf(hs) {
	case hcpv1alpha1.SessionPending:
		d.Verdict = "undecided (the gate is deciding, or its pod went away before it decided)"
		return d
	case hcpv1alpha1.SessionRejected:
		d.Verdict = verdictRejected
		code, msg := st.Reason, st.Message
		if st.Error != nil {
			code, msg = st.Error.Code, st.Error.Message
		}
		d.Detail = strings.TrimPrefix(code+": "+msg, ": ")
		return d
	}
	d.Verdict = verdictAdmitted
	if st.Reason == reasonAccepted && st.Message != "" {
		d.Detail = st.Message
		return d
	}
	for _, e := range events {
		if strings.Contains(e.Message, "admitted by") {
			d.Detail = oneLine(e.Message, 300)
			return d
		}
	}
	return d
}

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
