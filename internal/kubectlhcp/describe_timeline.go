package kubectlhcp

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

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
