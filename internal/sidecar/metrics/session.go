package metrics

import (
	"time"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// The session outcome series: hcp_sessions_total{capability, outcome} and
// hcp_session_duration_seconds{capability, outcome}, recorded by the
// callee sidecar where a task ends (the terminal transition of its
// session, or its rejection). With the scrape's callee label they give a
// success ratio per Callee and capability, the SLO a team alerts on.
const (
	capabilityLabel = "capability"
	outcomeLabel    = "outcome"
)

// Outcomes of hcp_sessions_total: L2's terminal states, with a FAILED
// session whose L2 reason is "timeout" (it ran past its maximum duration)
// counted apart as TIMED_OUT.
const (
	OutcomeCompleted = string(session.StateCompleted)
	OutcomeFailed    = string(session.StateFailed)
	OutcomeTimedOut  = "TIMED_OUT"
	OutcomeAborted   = string(session.StateAborted)
	OutcomeRejected  = string(session.StateRejected)
)

// SessionDurationBuckets span what a session lasts: from a second to a
// day (a session's maximum duration defaults to an hour, and may be more).
var SessionDurationBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400}

// Outcome maps a session's L2 final state and reason to its outcome label.
// A state that is not terminal (a bug of the caller) is returned as it is.
func Outcome(finalState, reason string) string {
	if finalState == OutcomeFailed && reason == session.ReasonTimeout {
		return OutcomeTimedOut
	}
	return finalState
}

// SessionEnded records a session that reached its terminal state after
// running for took: one hcp_sessions_total and one
// hcp_session_duration_seconds observation, outcome from Outcome.
// capability is the session's, which the L3 gate checked against the
// Callee's: a bounded set of values.
func (m *Metrics) SessionEnded(capability, finalState, reason string, took time.Duration) {
	if m == nil {
		return
	}
	o := Outcome(finalState, reason)
	m.SessionsTotal.WithLabelValues(capability, o).Inc()
	m.SessionDuration.WithLabelValues(capability, o).Observe(max(took, 0).Seconds())
}

// TaskRejected records a task_submit answered with task_rejected:
// hcp_sessions_total{outcome="REJECTED"}. The capability is the task's
// when callee declares it, else "": the caller writes it, and a caller
// must not be able to make new series (nil callee: a task refused before
// the Callee was read, such as an expired one).
func (m *Metrics) TaskRejected(callee *v1alpha1.Callee, capability string) {
	if m == nil {
		return
	}
	label := ""
	if callee != nil {
		for _, c := range callee.Spec.Capabilities {
			if c.Name == capability {
				label = capability
				break
			}
		}
	}
	m.SessionsTotal.WithLabelValues(label, OutcomeRejected).Inc()
}
