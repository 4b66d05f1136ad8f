package kubectlhcp

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// Verdicts of Decision.
const (
	verdictAdmitted = "admitted"
	verdictRejected = "rejected"
)

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
