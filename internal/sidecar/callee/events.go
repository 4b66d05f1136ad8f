package callee

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/hcp-io/hcp-operator/internal/sidecar/events"
)

// Reasons of the Kubernetes Events the callee sidecar records.
//
// On the Callee, for every decision and outcome (the recorder aggregates
// similar ones and rate-limits each reason apart: events.NewBroadcaster):
// TaskAccepted, TaskRejected, SessionCompleted, SessionFailed,
// SessionAborted. On the HCPSession, for what happened to that session
// that a person looks into: SessionFailed and SessionAborted (Warning),
// SessionHandedOver (released at a drain), SessionTakenOver (claimed by
// another replica: Warning when its replica was gone).
const (
	EventTaskAccepted      = "TaskAccepted"
	EventTaskRejected      = "TaskRejected"
	EventSessionCompleted  = "SessionCompleted"
	EventSessionFailed     = "SessionFailed"
	EventSessionAborted    = "SessionAborted"
	EventSessionHandedOver = "SessionHandedOver"
	EventSessionTakenOver  = "SessionTakenOver"
)

// event records an Event on the Callee, if there is a recorder.
func (s *Sidecar) event(typ, reason, format string, args ...any) {
	if s.rec != nil {
		s.rec.Eventf(events.Ref("Callee", s.ns, s.cfg.ObjectName, ""), typ, reason, format, args...)
	}
}

// sessionEvent records an Event on the HCPSession name (uid: kubectl
// describe selects its Events by it), if there is a recorder.
func (s *Sidecar) sessionEvent(name string, uid types.UID, typ, reason, format string, args ...any) {
	if s.rec != nil {
		s.rec.Eventf(events.Ref("HCPSession", s.ns, name, uid), typ, reason, format, args...)
	}
}
