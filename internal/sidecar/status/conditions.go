package status

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// sessionReasons is the condition reason of each L2 state.
var sessionReasons = map[v1alpha1.SessionState]string{
	v1alpha1.SessionPending:   v1alpha1.ReasonSessionPending,
	v1alpha1.SessionRunning:   v1alpha1.ReasonSessionRunning,
	v1alpha1.SessionPaused:    v1alpha1.ReasonSessionPaused,
	v1alpha1.SessionAborting:  v1alpha1.ReasonSessionAborting,
	v1alpha1.SessionCompleted: v1alpha1.ReasonSessionCompleted,
	v1alpha1.SessionFailed:    v1alpha1.ReasonSessionFailed,
	v1alpha1.SessionAborted:   v1alpha1.ReasonSessionAborted,
	v1alpha1.SessionRejected:  v1alpha1.ReasonSessionRejected,
}

// maxConditionMessage bounds the messages copied from status.message.
const maxConditionMessage = 1024

// SetConditions derives an HCPSession's kstatus conditions from its state,
// so that kstatus (Flux, kpt, kubectl wait) and Argo CD read a session the
// way they read any other object:
//
//   - COMPLETED: Ready=True.
//   - FAILED, ABORTED, REJECTED: Ready=False and Stalled=True: the session
//     ended without doing its task, and nothing will change that.
//   - PENDING, RUNNING, PAUSED, ABORTING: Ready=False and Reconciling=True.
//
// Reconciling and Stalled are present only while True (abnormal-true
// polarity). Reasons are the state in CamelCase (Completed, Failed...); the
// message is status.reason and status.message. A status without a state
// (the caller sidecar's view, or an undecided claim) is left alone. The
// result depends only on the status and, for a condition whose status
// changes, on now: deriving again changes nothing, so it costs no write.
func SetConditions(st *v1alpha1.HCPSessionStatus, now time.Time) {
	reason, ok := sessionReasons[st.State]
	if !ok {
		return
	}
	msg := st.Reason
	if st.Message != "" {
		if msg != "" {
			msg += ": "
		}
		msg += st.Message
	}
	if msg == "" {
		msg = string(st.State)
	}
	if len(msg) > maxConditionMessage {
		msg = msg[:maxConditionMessage-3] + "..."
	}
	set := func(typ string, status metav1.ConditionStatus) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(now),
		})
	}
	switch {
	case st.State == v1alpha1.SessionCompleted:
		set(v1alpha1.ConditionReady, metav1.ConditionTrue)
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionReconciling)
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionStalled)
	case st.State.IsTerminal():
		set(v1alpha1.ConditionReady, metav1.ConditionFalse)
		set(v1alpha1.ConditionStalled, metav1.ConditionTrue)
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionReconciling)
	default:
		set(v1alpha1.ConditionReady, metav1.ConditionFalse)
		set(v1alpha1.ConditionReconciling, metav1.ConditionTrue)
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionStalled)
	}
}
