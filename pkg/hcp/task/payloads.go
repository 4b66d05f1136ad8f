package task

import (
	"encoding/json"
	"mime"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// TaskSubmit is the payload of task_submit (caller → callee).
type TaskSubmit struct {
	// CallerID is the submitting caller. The gate checks it against the
	// identity the broker authenticated (AMQP user_id), never trusts it alone.
	CallerID string `json:"caller_id"`
	// CalleeID is the callee the task is for.
	CalleeID string `json:"callee_id"`
	// Capability names the callee capability to invoke.
	Capability string `json:"capability"`
	// Intent says in words what the caller wants done.
	Intent string `json:"intent"`
	// Inputs is a JSON object; binary data is referenced by URI.
	Inputs json.RawMessage `json:"inputs"`
	// Constraints bound the execution.
	Constraints Constraints `json:"constraints"`
	// OutputFormat optionally describes the expected result: a JSON string
	// (for example a media type) or a JSON object (for example a JSON Schema).
	OutputFormat json.RawMessage `json:"output_format,omitempty"`
	// ExpiresAt, when set, is the time after which the callee must not start
	// the task (checked before any side effect).
	ExpiresAt *Timestamp `json:"expires_at,omitempty"`
	// Metadata is an optional JSON object, carried through to the session.
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// Constraints are the caller's limits on a task.
type Constraints struct {
	// MaxDuration caps the session; zero means "callee default" (the policy
	// and the capability still apply).
	MaxDuration Duration `json:"max_duration,omitempty"`
	// MaxRiskLevel is the highest risk the caller accepts; empty means no
	// caller-side cap.
	MaxRiskLevel RiskLevel `json:"max_risk_level,omitempty"`
	// DataClassification is the sensitivity of the data involved. Optional
	// (as in the spec); a callee without one judges the task as the most
	// sensitive data the capability may handle.
	DataClassification DataClass `json:"data_classification,omitempty"`
	// Deadline, when set, is the time by which the task must have finished.
	Deadline *Timestamp `json:"deadline,omitempty"`
}

// MessageType returns "task_submit".
func (TaskSubmit) MessageType() envelope.MessageType { return envelope.TypeTaskSubmit }

// Validate checks the payload on its own; see the package documentation for
// the rules.
func (t *TaskSubmit) Validate() error {
	e := &ValidationError{Kind: string(envelope.TypeTaskSubmit)}
	e.id("caller_id", t.CallerID)
	e.id("callee_id", t.CalleeID)
	switch {
	case t.Capability == "":
		e.Add("capability", "required")
	case !ValidCapability(t.Capability):
		e.Add("capability", "%q is not a valid capability name (letters, digits, '.', '_', ':', '/' and '-', at most 253 characters)", truncate(t.Capability, 70))
	}
	e.text("intent", t.Intent)
	if e.jsonObject("inputs", t.Inputs) {
		e.noInlineBinary("inputs", t.Inputs)
	}
	t.Constraints.validate(e, "constraints")
	if !rawAbsent(t.OutputFormat) {
		if k := rawKind(t.OutputFormat); k != '"' && k != '{' {
			e.Add("output_format", "must be a JSON string or object")
		}
	}
	validOptionalTime(e, "expires_at", t.ExpiresAt)
	if !rawAbsent(t.Metadata) && rawKind(t.Metadata) != '{' {
		e.Add("metadata", "must be a JSON object")
	}
	return e.Err()
}

// Expired reports whether the task may no longer be started at now: its
// expires_at or its deadline is at or before now.
func (t *TaskSubmit) Expired(now time.Time) bool {
	if t.ExpiresAt != nil && !now.Before(t.ExpiresAt.Time) {
		return true
	}
	d := t.Constraints.Deadline
	return d != nil && !now.Before(d.Time)
}

func (c *Constraints) validate(e *ValidationError, prefix string) {
	if c.MaxDuration < 0 {
		e.Add(prefix+".max_duration", "must not be negative")
	}
	if c.MaxRiskLevel != "" && !c.MaxRiskLevel.Valid() {
		e.Add(prefix+".max_risk_level", "%q is not one of %s", truncate(string(c.MaxRiskLevel), 20), joinLevels(RiskLevels()))
	}
	if c.DataClassification != "" && !c.DataClassification.Valid() {
		e.Add(prefix+".data_classification", "%q is not one of %s", truncate(string(c.DataClassification), 20), joinLevels(DataClasses()))
	}
	validOptionalTime(e, prefix+".deadline", c.Deadline)
}

func validOptionalTime(e *ValidationError, field string, t *Timestamp) {
	if t != nil && t.IsZero() {
		e.Add(field, "must be a timestamp when present")
	}
}

// TaskAccepted is the payload of task_accepted (callee → caller).
type TaskAccepted struct {
	// TaskMessageID is the message_id of the accepted task_submit.
	TaskMessageID string `json:"task_message_id"`
	// SessionID is the new session's id (UUID v4).
	SessionID string `json:"session_id"`
	// SessionToken is the JWT authorising the session (package token).
	SessionToken string `json:"session_token"`
	// RiskLevel is the risk the callee assessed.
	RiskLevel RiskLevel `json:"risk_level"`
	// ExpiresAt is when the session token, and so the session, expires.
	ExpiresAt Timestamp `json:"expires_at"`
}

// MessageType returns "task_accepted".
func (TaskAccepted) MessageType() envelope.MessageType { return envelope.TypeTaskAccepted }

// Validate checks the payload on its own.
func (t *TaskAccepted) Validate() error {
	e := &ValidationError{Kind: string(envelope.TypeTaskAccepted)}
	e.uuid("task_message_id", t.TaskMessageID)
	e.uuid("session_id", t.SessionID)
	switch {
	case t.SessionToken == "":
		e.Add("session_token", "required")
	case !jwtRE.MatchString(t.SessionToken):
		e.Add("session_token", "not a compact JWS (three base64url segments)")
	}
	validRisk(e, "risk_level", t.RiskLevel)
	if t.ExpiresAt.IsZero() {
		e.Add("expires_at", "required")
	}
	return e.Err()
}

func validRisk(e *ValidationError, field string, r RiskLevel) {
	switch {
	case r == "":
		e.Add(field, "required (one of %s)", joinLevels(RiskLevels()))
	case !r.Valid():
		e.Add(field, "%q is not one of %s", truncate(string(r), 20), joinLevels(RiskLevels()))
	}
}

// TaskRejected is the payload of task_rejected (callee → caller).
type TaskRejected struct {
	// TaskMessageID is the message_id of the rejected task_submit.
	TaskMessageID string `json:"task_message_id"`
	// ReasonCode says why, machine-readably.
	ReasonCode ReasonCode `json:"reason_code"`
	// Message says why, for humans.
	Message string `json:"message"`
}

// MessageType returns "task_rejected".
func (TaskRejected) MessageType() envelope.MessageType { return envelope.TypeTaskRejected }

// Validate checks the payload on its own. task_message_id may be any
// non-empty string of at most 128 characters here rather than a UUID: a
// task_submit rejected as malformed may have carried a bad message_id, and
// the rejection must still be able to quote it.
func (t *TaskRejected) Validate() error {
	e := &ValidationError{Kind: string(envelope.TypeTaskRejected)}
	switch {
	case t.TaskMessageID == "":
		e.Add("task_message_id", "required")
	case len(t.TaskMessageID) > 128:
		e.Add("task_message_id", "longer than 128 characters")
	}
	switch {
	case t.ReasonCode == "":
		e.Add("reason_code", "required")
	case !t.ReasonCode.Valid():
		e.Add("reason_code", "%q is not a known reason code", truncate(string(t.ReasonCode), 40))
	}
	e.text("message", t.Message)
	return e.Err()
}

// TaskCompleted is the payload of task_completed (callee → caller).
type TaskCompleted struct {
	// Result is the task's result, any JSON value; optional (a task may
	// produce artifacts only).
	Result json.RawMessage `json:"result,omitempty"`
	// Artifacts are produced files, by reference.
	Artifacts []Artifact `json:"artifacts,omitempty"`
	// Summary describes the execution.
	Summary Summary `json:"summary"`
}

// Artifact references one produced file.
type Artifact struct {
	// URI is an absolute URI (never a data: URI).
	URI string `json:"uri"`
	// SHA256 is the lowercase hex SHA-256 of the content.
	SHA256 string `json:"sha256"`
	// MediaType is an optional RFC 6838 media type.
	MediaType string `json:"media_type,omitempty"`
	// Size is the content length in bytes.
	Size int64 `json:"size"`
}

// Summary describes a finished execution.
type Summary struct {
	// Duration is the session's wall-clock run time.
	Duration Duration `json:"duration"`
	// EventCount is the number of events the session emitted.
	EventCount int64 `json:"event_count"`
}

// MessageType returns "task_completed".
func (TaskCompleted) MessageType() envelope.MessageType { return envelope.TypeTaskCompleted }

// Validate checks the payload on its own.
func (t *TaskCompleted) Validate() error {
	e := &ValidationError{Kind: string(envelope.TypeTaskCompleted)}
	if !rawAbsent(t.Result) && rawKind(t.Result) == 0 {
		e.Add("result", "not valid JSON")
	}
	for i := range t.Artifacts {
		t.Artifacts[i].validate(e, "artifacts["+strconv.Itoa(i)+"]")
	}
	if t.Summary.Duration < 0 {
		e.Add("summary.duration", "must not be negative")
	}
	if t.Summary.EventCount < 0 {
		e.Add("summary.event_count", "must not be negative")
	}
	return e.Err()
}

func (a *Artifact) validate(e *ValidationError, prefix string) {
	if a.URI == "" {
		e.Add(prefix+".uri", "required")
	} else if u, err := url.Parse(a.URI); err != nil || !u.IsAbs() {
		e.Add(prefix+".uri", "%q is not an absolute URI", truncate(a.URI, 70))
	} else if strings.EqualFold(u.Scheme, "data") {
		e.Add(prefix+".uri", "data: URIs are not allowed; reference binary data by URI")
	}
	switch {
	case a.SHA256 == "":
		e.Add(prefix+".sha256", "required")
	case !sha256RE.MatchString(a.SHA256):
		e.Add(prefix+".sha256", "must be 64 lowercase hex digits")
	}
	if a.MediaType != "" {
		if _, _, err := mime.ParseMediaType(a.MediaType); err != nil {
			e.Add(prefix+".media_type", "%q is not a media type", truncate(a.MediaType, 70))
		}
	}
	if a.Size < 0 {
		e.Add(prefix+".size", "must not be negative")
	}
}

// TaskFailed is the payload of task_failed (callee → caller).
type TaskFailed struct {
	// Code is a machine-readable failure code, for example "timeout".
	Code string `json:"code"`
	// Message says what went wrong, for humans.
	Message string `json:"message"`
	// Recoverable says whether resubmitting the task may succeed.
	Recoverable bool `json:"recoverable"`
}

// MessageType returns "task_failed".
func (TaskFailed) MessageType() envelope.MessageType { return envelope.TypeTaskFailed }

// Validate checks the payload on its own.
func (t *TaskFailed) Validate() error {
	e := &ValidationError{Kind: string(envelope.TypeTaskFailed)}
	e.code("code", t.Code)
	e.text("message", t.Message)
	return e.Err()
}

// Abort is the payload of abort (caller → callee). The envelope's session_id
// names the session; the token must be that session's and the message must
// come from the session's caller.
type Abort struct {
	// SessionToken is the token from task_accepted.
	SessionToken string `json:"session_token"`
	// Reason is an optional human-readable reason.
	Reason string `json:"reason,omitempty"`
}

// MessageType returns "abort".
func (Abort) MessageType() envelope.MessageType { return envelope.TypeAbort }

// Validate checks the payload on its own (the token's signature and claims
// are checked with package token).
func (a *Abort) Validate() error {
	e := &ValidationError{Kind: string(envelope.TypeAbort)}
	switch {
	case a.SessionToken == "":
		e.Add("session_token", "required")
	case !jwtRE.MatchString(a.SessionToken):
		e.Add("session_token", "not a compact JWS (three base64url segments)")
	}
	return e.Err()
}
