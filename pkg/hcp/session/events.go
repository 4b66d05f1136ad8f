package session

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// EventType is the event_type of an L2 event.
type EventType string

// The nine standard event types (L2 "Standard Event Types").
const (
	EventSessionCreated     EventType = "session_created"
	EventStateChanged       EventType = "state_changed"
	EventProgress           EventType = "progress"
	EventIntermediateResult EventType = "intermediate_result"
	EventLog                EventType = "log"
	EventWarning            EventType = "warning"
	EventError              EventType = "error"
	EventCheckpointCreated  EventType = "checkpoint_created"
	EventSessionClosed      EventType = "session_closed"
)

// EventTypes returns the nine standard types in the specification's order.
func EventTypes() []EventType {
	return []EventType{EventSessionCreated, EventStateChanged, EventProgress,
		EventIntermediateResult, EventLog, EventWarning, EventError,
		EventCheckpointCreated, EventSessionClosed}
}

// ParseEventType parses an event type name (exact).
func ParseEventType(s string) (EventType, error) {
	t := EventType(s)
	if !t.Valid() {
		return "", fmt.Errorf("unknown event type %q", s)
	}
	return t, nil
}

// Valid reports whether t is one of the nine standard types. The set is
// closed: unknown types are rejected rather than passed through.
func (t EventType) Valid() bool { return slices.Contains(EventTypes(), t) }

// HarnessEmittable reports whether a harness may post an event of type t
// through the local API. session_created, state_changed, checkpoint_created
// and session_closed record lifecycle facts the sidecar owns; the harness
// reaches them through the pause/resume/checkpoint/complete/fail/aborted
// endpoints instead.
func (t EventType) HarnessEmittable() bool {
	switch t {
	case EventProgress, EventIntermediateResult, EventLog, EventWarning, EventError:
		return true
	}
	return false
}

// EventData is the typed data of one event type.
type EventData interface {
	// EventType returns the type this data belongs to.
	EventType() EventType
	// Validate checks the data on its own, naming bad fields.
	Validate() error
}

// newData returns a pointer to the zero data struct for t, or nil.
func newData(t EventType) EventData {
	switch t {
	case EventSessionCreated:
		return &SessionCreatedData{}
	case EventStateChanged:
		return &StateChangedData{}
	case EventProgress:
		return &ProgressData{}
	case EventIntermediateResult:
		return &IntermediateResultData{}
	case EventLog:
		return &LogData{}
	case EventWarning:
		return &WarningData{}
	case EventError:
		return &ErrorData{}
	case EventCheckpointCreated:
		return &CheckpointCreatedData{}
	case EventSessionClosed:
		return &SessionClosedData{}
	}
	return nil
}

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
	return len(t) == 0 || string(t) == "null"
}

// EventPayload is the payload of an L1 message of type "event".
type EventPayload struct {
	EventType EventType `json:"event_type"`
	// Sequence numbers a session's events from 1, strictly increasing.
	Sequence int64 `json:"sequence"`
	// Data is the type-specific content, a JSON object.
	Data json.RawMessage `json:"data"`
}

// AppendJSON appends p's JSON to b without reflection and without scanning
// Data again: Data must be valid JSON (as Decode accepted it), and is
// copied as it is. For compact Data the result is byte for byte what the
// envelope's encoder (encoding/json without HTML escaping) writes. The
// publisher's hot path; an envelope built from it is validated as a whole
// anyway.
func (p EventPayload) AppendJSON(b []byte) []byte {
	b = append(b, `{"event_type":`...)
	if p.EventType.Valid() { // a plain word: nothing to escape
		b = append(b, '"')
		b = append(b, p.EventType...)
		b = append(b, '"')
	} else {
		q, _ := json.Marshal(string(p.EventType)) // a string always marshals
		b = append(b, q...)
	}
	b = append(b, `,"sequence":`...)
	b = strconv.AppendInt(b, p.Sequence, 10)
	b = append(b, `,"data":`...)
	if len(p.Data) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, p.Data...)
	}
	return append(b, '}')
}

// UnmarshalEventPayload decodes an event payload in one pass (envelope.Members):
// the receiver's hot path, where json.Unmarshal would scan the payload
// twice. Keys match exactly (as the envelope's own do; encoding/json would
// also take "Event_Type"), unknown keys are ignored, a null leaves its
// field zero, and Data is a slice of raw. It checks the form of the three
// fields, not their values: see Decode.
func UnmarshalEventPayload(raw []byte) (EventPayload, error) {
	var p EventPayload
	err := envelope.Members(raw, func(key, value []byte) error {
		if string(value) == "null" {
			return nil
		}
		switch string(key) {
		case "event_type":
			s, ok := envelope.String(value)
			if !ok {
				return errors.New("event payload: event_type must be a string")
			}
			p.EventType = EventType(s)
		case "sequence":
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil {
				return fmt.Errorf("event payload: sequence must be a whole number, got %.32s", value)
			}
			p.Sequence = n
		case "data":
			p.Data = value
		}
		return nil
	})
	if err != nil {
		return EventPayload{}, err
	}
	return p, nil
}

// MessageType returns "event", the L1 type of messages carrying an
// EventPayload.
func (EventPayload) MessageType() envelope.MessageType { return envelope.TypeEvent }

// NewEvent validates d and returns the payload carrying it as event number
// seq.
func NewEvent(seq int64, d EventData) (EventPayload, error) {
	if d == nil {
		return EventPayload{}, errors.New("new event: nil data")
	}
	p := EventPayload{EventType: d.EventType(), Sequence: seq}
	e := &task.ValidationError{Kind: "event"}
	if seq < 1 {
		e.Add("sequence", "must be at least 1, got %d", seq)
	}
	e.Merge("data", d.Validate())
	if err := e.Err(); err != nil {
		return EventPayload{}, err
	}
	b, err := json.Marshal(d)
	if err != nil {
		return EventPayload{}, fmt.Errorf("new event: encode %s data: %w", p.EventType, err)
	}
	p.Data = b
	return p, nil
}

// Validate checks the payload: event_type known, sequence >= 1, and data a
// JSON object that decodes into, and validates as, the type's data.
func (p *EventPayload) Validate() error {
	_, err := p.Decode()
	return err
}

// Decode validates the payload (as Validate) and returns its typed data,
// for example *ProgressData for a progress event.
func (p *EventPayload) Decode() (EventData, error) {
	e := &task.ValidationError{Kind: "event"}
	if p.Sequence < 1 {
		e.Add("sequence", "must be at least 1, got %d", p.Sequence)
	}
	d := newData(p.EventType)
	switch {
	case p.EventType == "":
		e.Add("event_type", "required")
	case d == nil:
		e.Add("event_type", "unknown event type %q (the nine standard types only)", p.EventType)
	}
	// The data is scanned once on the way in (json.Unmarshal checks its
	// syntax itself); json.Valid runs only to word an error.
	switch {
	case rawAbsent(p.Data):
		e.Add("data", "required (a JSON object)")
	case bytes.TrimSpace(p.Data)[0] != '{':
		if json.Valid(p.Data) {
			e.Add("data", "must be a JSON object")
		} else {
			e.Add("data", "not valid JSON")
		}
	case d == nil:
		if !json.Valid(p.Data) {
			e.Add("data", "not valid JSON")
		}
	default:
		var se *json.SyntaxError
		if err := json.Unmarshal(p.Data, d); errors.As(err, &se) {
			e.Add("data", "not valid JSON")
		} else if err != nil {
			e.Merge("data", decodeFieldError(err))
		} else {
			e.Merge("data", d.Validate())
		}
	}
	if err := e.Err(); err != nil {
		return nil, err
	}
	return d, nil
}

// decodeFieldError turns a json decoding error into a FieldError naming the
// field where possible.
func decodeFieldError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return &task.ValidationError{Fields: []*task.FieldError{{
			Field: te.Field, Message: fmt.Sprintf("must be a JSON %s, got %s", jsonKind(te.Type.Kind().String()), te.Value),
		}}}
	}
	var fe *task.FieldError
	if errors.As(err, &fe) {
		return &task.ValidationError{Fields: []*task.FieldError{fe}}
	}
	return err
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "float64", "float32", "int", "int64", "ptr":
		return "number"
	case "slice":
		return "array"
	case "struct", "map":
		return "object"
	}
	return "value of another type"
}
