package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SessionState is an L2 session state.
// +kubebuilder:validation:Enum=PENDING;RUNNING;PAUSED;ABORTING;ABORTED;COMPLETED;FAILED;REJECTED
type SessionState string

// L2 session states.
const (
	SessionPending   SessionState = "PENDING"
	SessionRunning   SessionState = "RUNNING"
	SessionPaused    SessionState = "PAUSED"
	SessionAborting  SessionState = "ABORTING"
	SessionAborted   SessionState = "ABORTED"
	SessionCompleted SessionState = "COMPLETED"
	SessionFailed    SessionState = "FAILED"
	SessionRejected  SessionState = "REJECTED"
)

// IsTerminal reports whether the state is terminal (never left again).
func (s SessionState) IsTerminal() bool {
	switch s {
	case SessionAborted, SessionCompleted, SessionFailed, SessionRejected:
		return true
	}
	return false
}

// AnnotationAdmitted ("true") on an HCPSession says its creation was the
// L3 decision: the gate admitted the task and no concurrency limit applied,
// so nothing could overturn the verdict, and the session runs from then on.
// Its status.state is written afterwards, without holding up the reply to
// the caller; until then DecidedState reads RUNNING. Without it a created
// session is undecided (PENDING) until its status.state says otherwise.
const AnnotationAdmitted = "hcp.io/admitted"

// DecidedState is the session's state as far as it has been decided:
// status.state, except that a session admitted at its creation
// (AnnotationAdmitted) whose state is not written yet is RUNNING.
func (s *HCPSession) DecidedState() SessionState {
	st := s.Status.State
	if (st == "" || st == SessionPending) && s.Annotations[AnnotationAdmitted] == "true" {
		return SessionRunning
	}
	return st
}

// HCPSessionSpec records what was asked. It is immutable after creation
// except abortRequested.
type HCPSessionSpec struct {
	// sessionID is the L2 session id (UUID v4), also the object's name.
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.sessionID is immutable"
	SessionID string `json:"sessionID"`

	// calleeID of the callee running the session.
	// +required
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.calleeID is immutable"
	CalleeID string `json:"calleeID"`

	// callerID of the caller that submitted the task (from the broker-validated
	// user_id, never from the payload alone).
	// +required
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.callerID is immutable"
	CallerID string `json:"callerID"`

	// capability requested.
	// +required
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.capability is immutable"
	Capability string `json:"capability"`

	// taskMessageID is the message_id of the task_submit (the dedup key).
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-4[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.taskMessageID is immutable"
	TaskMessageID string `json:"taskMessageID"`

	// riskLevel assessed by the L3 gate (empty when rejected before assessment).
	// +optional
	RiskLevel RiskLevel `json:"riskLevel,omitempty"`

	// dataClassification declared by the task.
	// +optional
	DataClassification DataClass `json:"dataClassification,omitempty"`

	// maxDuration the session may run (ISO 8601).
	// +optional
	MaxDuration ISO8601Duration `json:"maxDuration,omitempty"`

	// issuedAt is the session token's iat: the task_submit's envelope
	// timestamp, whole seconds, so that every replica answering a copy of
	// the submit issues the same token, also before this object exists.
	// Unset on sessions whose iat is their creationTimestamp (earlier
	// releases, and a submit stamped ahead of the callee's clock).
	// +optional
	IssuedAt *metav1.Time `json:"issuedAt,omitempty"`

	// intent of the task, for humans (truncated to 1024 characters).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Intent string `json:"intent,omitempty"`

	// abortRequested, once true, aborts the session (ABORTING, then ABORTED).
	// It is the one mutable field, and it cannot be set back to false.
	// +optional
	AbortRequested bool `json:"abortRequested,omitempty"`
}

// SessionProgress is the latest progress event.
type SessionProgress struct {
	// stage of execution.
	// +optional
	Stage string `json:"stage,omitempty"`
	// percent complete, 0–100.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Percent *int32 `json:"percent,omitempty"`
	// message from the harness.
	// +optional
	Message string `json:"message,omitempty"`
}

// SessionCheckpoint is the latest checkpoint_created event.
type SessionCheckpoint struct {
	// id of the checkpoint.
	// +required
	ID string `json:"id"`
	// description of the checkpoint.
	// +optional
	Description string `json:"description,omitempty"`
	// resumable is true when the session can resume from it.
	// +optional
	Resumable bool `json:"resumable,omitempty"`
	// createdAt is when the checkpoint was saved.
	// +optional
	CreatedAt *metav1.Time `json:"createdAt,omitempty"`
}

// SessionResult summarises task_completed.
type SessionResult struct {
	// summary of the result (truncated).
	// +optional
	Summary string `json:"summary,omitempty"`
	// artifacts produced, by URI.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Artifacts []Artifact `json:"artifacts,omitempty"`
}

// SessionError summarises task_failed or a rejection.
type SessionError struct {
	// code of the error or rejection reason.
	// +optional
	Code string `json:"code,omitempty"`
	// message for humans.
	// +optional
	Message string `json:"message,omitempty"`
	// recoverable is true when retrying may succeed.
	// +optional
	Recoverable bool `json:"recoverable,omitempty"`
}

// HCPSessionStatus is the read model of the session's event stream.
type HCPSessionStatus struct {
	// state is the L2 session state.
	// +optional
	State SessionState `json:"state,omitempty"`
	// reason of the last state change (for example timeout, rejected reason code).
	// +optional
	Reason string `json:"reason,omitempty"`
	// message for humans about the last state change.
	// +optional
	Message string `json:"message,omitempty"`
	// lastSequence is the sequence number of the last event published.
	// +optional
	LastSequence int64 `json:"lastSequence,omitempty"`
	// eventCount is the number of events published.
	// +optional
	EventCount int64 `json:"eventCount,omitempty"`
	// progress is the latest progress event.
	// +optional
	Progress *SessionProgress `json:"progress,omitempty"`
	// lastCheckpoint is the latest checkpoint.
	// +optional
	LastCheckpoint *SessionCheckpoint `json:"lastCheckpoint,omitempty"`
	// result of a completed session.
	// +optional
	Result *SessionResult `json:"result,omitempty"`
	// error of a failed or rejected session.
	// +optional
	Error *SessionError `json:"error,omitempty"`
	// startedAt is when the session started RUNNING: the session token's
	// iat, which is metadata.creationTimestamp. For display only; nothing
	// reads it back.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// completedAt is when the session reached a terminal state.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
	// lastEventAt is when the last event was published.
	// +optional
	LastEventAt *metav1.Time `json:"lastEventAt,omitempty"`
	// tokenExpiresAt is when the session token expires: its exp,
	// metadata.creationTimestamp plus spec.maxDuration. For display only:
	// tokens are (re-)issued from those immutable fields, so changing this
	// extends nothing.
	// +optional
	TokenExpiresAt *metav1.Time `json:"tokenExpiresAt,omitempty"`
	// podName is the callee pod running the session.
	// +optional
	PodName string `json:"podName,omitempty"`
	// ownerEpoch counts the claims of this session: 1 when a replica
	// decides it, incremented by every takeover and hand-over, always with
	// a resourceVersion precondition, so exactly one replica holds each
	// epoch. Every message the owner publishes carries it (AMQP header
	// hcp-owner-epoch), and every write the owner makes to shared state is
	// conditional on it: a replica that sees a higher epoch than its own
	// has lost the session and stops.
	// +optional
	OwnerEpoch int64 `json:"ownerEpoch,omitempty"`
	// callerAckedSequence is the last sequence the caller's sidecar has
	// delivered to its app and acknowledged.
	// +optional
	CallerAckedSequence int64 `json:"callerAckedSequence,omitempty"`
	// conditions of the session.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// HCPSession is one HCP task session: created by the callee sidecar when a
// task_submit arrives, updated from its event stream, deleted
// ttlAfterFinished after it ends.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=hcps,categories=hcp
// +kubebuilder:printcolumn:name="Caller",type=string,JSONPath=`.spec.callerID`
// +kubebuilder:printcolumn:name="Callee",type=string,JSONPath=`.spec.calleeID`
// +kubebuilder:printcolumn:name="Capability",type=string,JSONPath=`.spec.capability`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Risk",type=string,JSONPath=`.spec.riskLevel`
// +kubebuilder:printcolumn:name="Progress",type=integer,JSONPath=`.status.progress.percent`
// +kubebuilder:printcolumn:name="Seq",type=integer,JSONPath=`.status.lastSequence`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`,priority=1
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.status.podName`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.spec.abortRequested) || !oldSelf.spec.abortRequested || (has(self.spec.abortRequested) && self.spec.abortRequested)",message="spec.abortRequested cannot be unset once true",fieldPath=`.spec.abortRequested`
// +kubebuilder:validation:XValidation:rule="has(self.spec.riskLevel) == has(oldSelf.spec.riskLevel) && (!has(self.spec.riskLevel) || self.spec.riskLevel == oldSelf.spec.riskLevel)",message="spec.riskLevel is immutable",fieldPath=`.spec.riskLevel`
// +kubebuilder:validation:XValidation:rule="has(self.spec.dataClassification) == has(oldSelf.spec.dataClassification) && (!has(self.spec.dataClassification) || self.spec.dataClassification == oldSelf.spec.dataClassification)",message="spec.dataClassification is immutable",fieldPath=`.spec.dataClassification`
// +kubebuilder:validation:XValidation:rule="has(self.spec.maxDuration) == has(oldSelf.spec.maxDuration) && (!has(self.spec.maxDuration) || self.spec.maxDuration == oldSelf.spec.maxDuration)",message="spec.maxDuration is immutable",fieldPath=`.spec.maxDuration`
// +kubebuilder:validation:XValidation:rule="has(self.spec.issuedAt) == has(oldSelf.spec.issuedAt) && (!has(self.spec.issuedAt) || self.spec.issuedAt == oldSelf.spec.issuedAt)",message="spec.issuedAt is immutable",fieldPath=`.spec.issuedAt`
// +kubebuilder:validation:XValidation:rule="has(self.spec.intent) == has(oldSelf.spec.intent) && (!has(self.spec.intent) || self.spec.intent == oldSelf.spec.intent)",message="spec.intent is immutable",fieldPath=`.spec.intent`
type HCPSession struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   HCPSessionSpec   `json:"spec"`
	Status HCPSessionStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// HCPSessionList contains a list of HCPSession.
type HCPSessionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HCPSession `json:"items"`
}

func init() {
	SchemeBuilder.Register(&HCPSession{}, &HCPSessionList{})
}
