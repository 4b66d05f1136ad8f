package session

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"

	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// SessionCreatedData is the data of session_created.
type SessionCreatedData struct {
	// State is the session's state; never terminal.
	State State `json:"state"`
	// RiskLevel is the L3-assessed risk.
	RiskLevel task.RiskLevel `json:"risk_level"`
	// SessionToken is the session's token.
	SessionToken string `json:"session_token"`
}

// EventType returns session_created.
func (*SessionCreatedData) EventType() EventType { return EventSessionCreated }

// Validate checks the data.
func (d *SessionCreatedData) Validate() error {
	e := &task.ValidationError{Kind: string(EventSessionCreated) + " data"}
	switch {
	case d.State == "":
		e.Add("state", "required")
	case !d.State.Valid():
		e.Add("state", "unknown state %q", d.State)
	case d.State.IsTerminal():
		e.Add("state", "%s is terminal; a session is created in a non-terminal state", d.State)
	}
	switch {
	case d.RiskLevel == "":
		e.Add("risk_level", "required")
	case !d.RiskLevel.Valid():
		e.Add("risk_level", "%q is not one of R1..R5", d.RiskLevel)
	}
	if d.SessionToken == "" {
		e.Add("session_token", "required")
	}
	return e.Err()
}

// StateChangedData is the data of state_changed.
type StateChangedData struct {
	FromState State  `json:"from_state"`
	ToState   State  `json:"to_state"`
	Reason    string `json:"reason"`
}

// EventType returns state_changed.
func (*StateChangedData) EventType() EventType { return EventStateChanged }

// Validate checks the data: both states known and from→to in the
// transition table. One exception: from_state equal to to_state (a
// non-terminal state) is allowed with a non-empty reason, which is how the
// callee reports recovery in place (reason "recovered_from_checkpoint"),
// since L2 asks for a state_changed event on recovery but recovery need not
// change the state.
func (d *StateChangedData) Validate() error {
	e := &task.ValidationError{Kind: string(EventStateChanged) + " data"}
	okFrom, okTo := validState(e, "from_state", d.FromState), validState(e, "to_state", d.ToState)
	if okFrom && okTo {
		switch {
		case d.FromState == d.ToState && !d.FromState.IsTerminal():
			if strings.TrimSpace(d.Reason) == "" {
				e.Add("reason", "required when from_state equals to_state (for example %q)", ReasonRecoveredFromCheckpoint)
			}
		default:
			if err := Transition(d.FromState, d.ToState); err != nil {
				e.Add("to_state", "%s", err.Error())
			}
		}
	}
	return e.Err()
}

func validState(e *task.ValidationError, field string, s State) bool {
	switch {
	case s == "":
		e.Add(field, "required")
	case !s.Valid():
		e.Add(field, "unknown state %q", s)
	default:
		return true
	}
	return false
}

// ProgressData is the data of progress.
type ProgressData struct {
	// Stage names the current stage. Required.
	Stage string `json:"stage"`
	// Percent is an optional completion estimate in [0, 100].
	Percent *float64 `json:"percent,omitempty"`
	// Message is an optional human-readable note.
	Message string `json:"message"`
}

// EventType returns progress.
func (*ProgressData) EventType() EventType { return EventProgress }

// Validate checks the data.
func (d *ProgressData) Validate() error {
	e := &task.ValidationError{Kind: string(EventProgress) + " data"}
	if strings.TrimSpace(d.Stage) == "" {
		e.Add("stage", "required")
	}
	if p := d.Percent; p != nil && (math.IsNaN(*p) || *p < 0 || *p > 100) {
		e.Add("percent", "%v is outside [0, 100]", *p)
	}
	return e.Err()
}

// IntermediateResultData is the data of intermediate_result.
type IntermediateResultData struct {
	// ResultType names the kind of result. Required.
	ResultType string `json:"result_type"`
	// Data is the result, any JSON value except null. Binary data by URI.
	Data json.RawMessage `json:"data"`
	// IsPartial says whether more of this result will follow.
	IsPartial bool `json:"is_partial"`
}

// EventType returns intermediate_result.
func (*IntermediateResultData) EventType() EventType { return EventIntermediateResult }

// Validate checks the data.
func (d *IntermediateResultData) Validate() error {
	e := &task.ValidationError{Kind: string(EventIntermediateResult) + " data"}
	if strings.TrimSpace(d.ResultType) == "" {
		e.Add("result_type", "required")
	}
	switch {
	case rawAbsent(d.Data):
		e.Add("data", "required")
	case !json.Valid(d.Data):
		e.Add("data", "not valid JSON")
	}
	return e.Err()
}

// LogLevel is the level of a log event.
type LogLevel string

// Log levels.
const (
	LogInfo  LogLevel = "info"
	LogWarn  LogLevel = "warn"
	LogError LogLevel = "error"
)

// Valid reports whether l is info, warn or error.
func (l LogLevel) Valid() bool { return l == LogInfo || l == LogWarn || l == LogError }

// LogData is the data of log.
type LogData struct {
	Level   LogLevel `json:"level"`
	Message string   `json:"message"`
	// Details is optional structured context, any JSON value.
	Details json.RawMessage `json:"details,omitempty"`
}

// EventType returns log.
func (*LogData) EventType() EventType { return EventLog }

// Validate checks the data.
func (d *LogData) Validate() error {
	e := &task.ValidationError{Kind: string(EventLog) + " data"}
	switch {
	case d.Level == "":
		e.Add("level", "required (info, warn or error)")
	case !d.Level.Valid():
		e.Add("level", "%q is not info, warn or error", d.Level)
	}
	requiredText(e, "message", d.Message)
	optionalJSON(e, "details", d.Details)
	return e.Err()
}

// WarningData is the data of warning.
type WarningData struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Details json.RawMessage `json:"details,omitempty"`
}

// EventType returns warning.
func (*WarningData) EventType() EventType { return EventWarning }

// Validate checks the data.
func (d *WarningData) Validate() error {
	e := &task.ValidationError{Kind: string(EventWarning) + " data"}
	validCode(e, "code", d.Code)
	requiredText(e, "message", d.Message)
	optionalJSON(e, "details", d.Details)
	return e.Err()
}

// ErrorData is the data of error (an error after which execution
// continues; a fatal one ends the session with task_failed).
type ErrorData struct {
	Code        string `json:"code"`
	Message     string `json:"message"`
	Recoverable bool   `json:"recoverable"`
}

// EventType returns error.
func (*ErrorData) EventType() EventType { return EventError }

// Validate checks the data.
func (d *ErrorData) Validate() error {
	e := &task.ValidationError{Kind: string(EventError) + " data"}
	validCode(e, "code", d.Code)
	requiredText(e, "message", d.Message)
	return e.Err()
}

// CheckpointCreatedData is the data of checkpoint_created.
type CheckpointCreatedData struct {
	CheckpointID string         `json:"checkpoint_id"`
	Description  string         `json:"description"`
	Resumable    bool           `json:"resumable"`
	CreatedAt    task.Timestamp `json:"created_at"`
}

// EventType returns checkpoint_created.
func (*CheckpointCreatedData) EventType() EventType { return EventCheckpointCreated }

// Validate checks the data.
func (d *CheckpointCreatedData) Validate() error {
	e := &task.ValidationError{Kind: string(EventCheckpointCreated) + " data"}
	switch {
	case strings.TrimSpace(d.CheckpointID) == "":
		e.Add("checkpoint_id", "required")
	case len(d.CheckpointID) > 253:
		e.Add("checkpoint_id", "longer than 253 characters")
	}
	if d.CreatedAt.IsZero() {
		e.Add("created_at", "required")
	}
	return e.Err()
}

// UnmarshalJSON decodes the data, naming created_at when it is not a valid
// timestamp.
func (d *CheckpointCreatedData) UnmarshalJSON(b []byte) error {
	type plain CheckpointCreatedData
	var aux struct {
		plain
		CreatedAt json.RawMessage `json:"created_at"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*d = CheckpointCreatedData(aux.plain)
	if len(aux.CreatedAt) > 0 {
		if err := d.CreatedAt.UnmarshalJSON(aux.CreatedAt); err != nil {
			return &task.FieldError{Field: "created_at", Message: err.Error()}
		}
	}
	return nil
}

// SessionClosedData is the data of session_closed.
type SessionClosedData struct {
	// FinalState is the terminal state reached.
	FinalState State  `json:"final_state"`
	Reason     string `json:"reason"`
}

// EventType returns session_closed.
func (*SessionClosedData) EventType() EventType { return EventSessionClosed }

// Validate checks the data.
func (d *SessionClosedData) Validate() error {
	e := &task.ValidationError{Kind: string(EventSessionClosed) + " data"}
	if validState(e, "final_state", d.FinalState) && !d.FinalState.IsTerminal() {
		e.Add("final_state", "%s is not a terminal state", d.FinalState)
	}
	return e.Err()
}

func requiredText(e *task.ValidationError, field, v string) {
	if strings.TrimSpace(v) == "" {
		e.Add(field, "required")
	}
}

func validCode(e *task.ValidationError, field, v string) {
	switch {
	case v == "":
		e.Add(field, "required")
	case !task.ValidCode(v):
		e.Add(field, "%q is not a valid code (letters, digits, '_', '.', ':' and '-', at most 128 characters)", v)
	}
}

func optionalJSON(e *task.ValidationError, field string, r json.RawMessage) {
	if !rawAbsent(r) && !json.Valid(r) {
		e.Add(field, "not valid JSON")
	}
}

func rawAbsent(r json.RawMessage) bool {
	t := bytes.TrimSpace(r)
	return len(t) == 0 || string(t) == jsonNull
}
