package caller

import (
	"encoding/json"
	"time"
)

// TaskState is what the caller sidecar knows about one submitted task.
type TaskState string

// Task states.
const (
	// TaskPending: published (or about to be), no task_accepted or
	// task_rejected yet; republished with the same message_id until one
	// arrives or the attempts run out.
	TaskPending TaskState = "pending"
	// TaskAccepted: the callee accepted the task (its session runs).
	TaskAccepted TaskState = "accepted"
	// TaskRejected: the callee rejected the task.
	TaskRejected TaskState = "rejected"
	// TaskUnanswered: every attempt timed out without an answer. A late
	// answer still moves the task to accepted or rejected.
	TaskUnanswered TaskState = "unanswered"
	// TaskExpired: the task's expires_at or deadline passed before it was
	// answered; it is no longer republished. A late answer still counts.
	TaskExpired TaskState = "expired"
)

// answered reports whether the callee has answered.
func (s TaskState) answered() bool { return s == TaskAccepted || s == TaskRejected }

// TaskRecord is the durable record of one task_submit.
type TaskRecord struct {
	MessageID  string    `json:"message_id"`
	CalleeID   string    `json:"callee_id"`
	Capability string    `json:"capability"`
	State      TaskState `json:"state"`
	// SessionID is the session the callee is expected to create
	// (topology.SessionID) until task_accepted names the real one.
	SessionID string `json:"session_id,omitempty"`
	// Envelope is the encoded task_submit, kept while the task is pending
	// so that a restarted sidecar republishes the identical message.
	Envelope      json.RawMessage `json:"envelope,omitempty"`
	Attempts      int             `json:"attempts"`
	SubmittedAt   time.Time       `json:"submitted_at"`
	LastAttemptAt time.Time       `json:"last_attempt_at,omitzero"`
	AnsweredAt    time.Time       `json:"answered_at,omitzero"`
	// ExpiresAt is the earlier of the task's expires_at and deadline.
	ExpiresAt     time.Time `json:"expires_at,omitzero"`
	RiskLevel     string    `json:"risk_level,omitempty"`
	ReasonCode    string    `json:"reason_code,omitempty"`
	ReasonMessage string    `json:"reason_message,omitempty"`
	// Delivered is set once the answer was handed to the app (2xx).
	Delivered bool `json:"delivered,omitempty"`
	// Adopted: the task was submitted by an earlier pod of this caller
	// (whose state directory is gone) and learnt from its HCPSession. It has
	// no Envelope and is never republished.
	Adopted bool `json:"adopted,omitempty"`
	// Traceparent and Tracestate are the W3C trace context the task_submit
	// carries in its AMQP headers (every republish the same), kept with the
	// Envelope.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
}

// SessionRecord is the durable per-session state of the caller sidecar.
// LastSeq is L2's last_processed_sequence: the highest sequence the app
// acknowledged with a 2xx. It is the deduplication source after a restart.
type SessionRecord struct {
	SessionID     string `json:"session_id"`
	CalleeID      string `json:"callee_id"`
	TaskMessageID string `json:"task_message_id,omitempty"`
	Capability    string `json:"capability,omitempty"`
	// LastSeq is last_processed_sequence.
	LastSeq int64 `json:"last_seq"`
	// State is the L2 state as the event stream delivered to the app says.
	State          string    `json:"state,omitempty"`
	RiskLevel      string    `json:"risk_level,omitempty"`
	Token          string    `json:"token,omitempty"`
	TokenExpiresAt time.Time `json:"token_expires_at,omitzero"`
	// AcceptedDelivered: task_accepted was handed to the app.
	AcceptedDelivered bool `json:"accepted_delivered,omitempty"`
	// Terminal is task_completed or task_failed once delivered to the app.
	Terminal string `json:"terminal,omitempty"`
	// Closed: the session_closed event was delivered to the app.
	Closed bool `json:"closed,omitempty"`
	// Unverified: the session's callee was bound on first use (no task,
	// task_accepted or HCPSession named it).
	Unverified bool `json:"unverified,omitempty"`
	// OwnerEpoch is the highest owner epoch (envelope.HeaderOwnerEpoch)
	// seen on the session's messages, and EpochFrom the lowest sequence
	// seen from that epoch (or one above the highest sequence seen when it
	// was raised): messages of a lower epoch are refused, but for events
	// below EpochFrom (see stream.fence).
	OwnerEpoch int64 `json:"owner_epoch,omitempty"`
	EpochFrom  int64 `json:"epoch_from,omitempty"`
	// AbortRequestedAt is when the app last asked to abort the session.
	AbortRequestedAt time.Time `json:"abort_requested_at,omitzero"`
	UpdatedAt        time.Time `json:"updated_at"`
}

// finished reports whether the app has received the session's end.
func (r *SessionRecord) finished() bool { return r.Terminal != "" }

// over reports whether the session has ended: a terminal answer or result,
// or session_closed (an aborted session has no result).
func (r *SessionRecord) over() bool { return r.finished() || r.Closed }
