package envelope

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Version is the protocol version this package writes.
const Version = "1.0"

// SupportedMajor is the only major protocol version this package accepts.
// Any minor version of it is accepted: minor versions are compatible by the
// MAJOR.MINOR contract.
const SupportedMajor = "1"

// TimestampLayout is the form every timestamp is written in: ISO 8601, UTC
// ("Z"), millisecond precision, as in L1's example. It is not the only form
// read: ParseTimestamp accepts any fractional precision.
const TimestampLayout = "2006-01-02T15:04:05.000Z"

// MessageType is the envelope's type field.
type MessageType string

// The seven L1 message types.
const (
	// Commands: caller → callee, on hcp.commands.
	TypeTaskSubmit MessageType = "task_submit"
	TypeAbort      MessageType = "abort"

	// Events: callee → caller, on hcp.events.
	TypeTaskAccepted  MessageType = "task_accepted"
	TypeTaskRejected  MessageType = "task_rejected"
	TypeEvent         MessageType = "event"
	TypeTaskCompleted MessageType = "task_completed"
	TypeTaskFailed    MessageType = "task_failed"
)

// Types returns every known message type, commands first.
func Types() []MessageType {
	return []MessageType{
		TypeTaskSubmit, TypeAbort,
		TypeTaskAccepted, TypeTaskRejected, TypeEvent, TypeTaskCompleted, TypeTaskFailed,
	}
}

// Known reports whether t is one of the seven L1 message types.
func (t MessageType) Known() bool { return t.IsCommand() || t.IsEvent() }

// IsCommand reports whether t travels caller → callee (command channel).
func (t MessageType) IsCommand() bool {
	return t == TypeTaskSubmit || t == TypeAbort
}

// IsEvent reports whether t travels callee → caller (event channel).
func (t MessageType) IsEvent() bool {
	switch t {
	case TypeTaskAccepted, TypeTaskRejected, TypeEvent, TypeTaskCompleted, TypeTaskFailed:
		return true
	}
	return false
}

// RequiresSession reports whether an envelope of type t must carry a
// session_id. Only task_submit goes without one (and must go without one):
// the callee creates the session in response to it.
func (t MessageType) RequiresSession() bool { return t.Known() && t != TypeTaskSubmit }

// Envelope is the L1 message wrapper carried as the AMQP body.
//
// The zero value is not valid; build one with New or NewAt, or fill every
// field and call Validate.
type Envelope struct {
	// HCPVersion is "MAJOR.MINOR"; the major must be SupportedMajor.
	HCPVersion string
	// MessageID is a UUID v4 (either letter case).
	MessageID string
	// Timestamp is when the message was created, within
	// 1970-01-01T00:00:00Z..9999-12-31T23:59:59.999999999Z (the AMQP
	// timestamp property it maps to is unsigned POSIX time). Decode returns
	// it in UTC with the precision it was written with; Encode writes it in
	// UTC truncated to the millisecond.
	Timestamp time.Time
	// SessionID is nil (JSON null) exactly when Type is task_submit, and a
	// UUID v4 otherwise. The JSON key itself is always present.
	SessionID *string
	// Type is one of the seven message types.
	Type MessageType
	// Payload is a JSON object, kept as the exact bytes received.
	Payload json.RawMessage
}

// Session returns the session id, or "" when it is null.
func (e *Envelope) Session() string {
	if e.SessionID == nil {
		return ""
	}
	return *e.SessionID
}

// Equal reports whether e and o carry the same envelope: timestamps are
// compared as instants, the payload byte for byte.
func (e *Envelope) Equal(o *Envelope) bool {
	if e == nil || o == nil {
		return e == o
	}
	if (e.SessionID == nil) != (o.SessionID == nil) {
		return false
	}
	if e.SessionID != nil && *e.SessionID != *o.SessionID {
		return false
	}
	return e.HCPVersion == o.HCPVersion &&
		e.MessageID == o.MessageID &&
		e.Timestamp.Equal(o.Timestamp) &&
		e.Type == o.Type &&
		bytes.Equal(e.Payload, o.Payload)
}

// NewMessageID returns a fresh random UUID v4 in canonical lowercase form.
func NewMessageID() string {
	idRand.Lock()
	id, err := uuid.NewRandomFromReader(idRand.r)
	idRand.Unlock()
	if err != nil { // crypto/rand does not fail; uuid.New panics if it does
		return uuid.NewString()
	}
	return id.String()
}

// idRand is crypto/rand read ahead for message ids: one read of the
// system's generator per 256 ids instead of one per id (a system call, a
// microsecond of a publisher's CPU per message). The bytes are as random;
// they wait in memory until used, which matters not for ids that travel
// in clear (uuid.EnableRandPool would do the same for every user of the
// uuid package in the process).
var idRand = struct {
	sync.Mutex
	r *bufio.Reader
}{r: bufio.NewReaderSize(rand.Reader, 16*256)}

// New builds a valid envelope of type t stamped with the current time and a
// fresh message id. sessionID "" means null (task_submit); payload is
// marshalled to JSON (nil becomes {}; a json.RawMessage is used as is) and
// must yield a JSON object.
func New(t MessageType, sessionID string, payload any) (*Envelope, error) {
	return NewAt(time.Now(), t, sessionID, payload)
}

// NewAt is New with an explicit creation time (an injected clock). now is
// converted to UTC and truncated to the millisecond.
func NewAt(now time.Time, t MessageType, sessionID string, payload any) (*Envelope, error) {
	raw, err := marshalPayload(payload)
	if err != nil {
		return nil, err
	}
	e := assemble(now, t, sessionID, raw)
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return e, nil
}

// assemble is an envelope of type t with a fresh message id, not validated.
func assemble(now time.Time, t MessageType, sessionID string, payload json.RawMessage) *Envelope {
	e := &Envelope{
		HCPVersion: Version,
		MessageID:  NewMessageID(),
		// Truncate also drops the monotonic reading, so the value
		// compares equal to its decoded self.
		Timestamp: now.UTC().Truncate(time.Millisecond),
		Type:      t,
		Payload:   payload,
	}
	if sessionID != "" {
		e.SessionID = &sessionID
	}
	return e
}

func marshalPayload(payload any) (json.RawMessage, error) {
	switch p := payload.(type) {
	case nil:
		return json.RawMessage("{}"), nil
	case json.RawMessage:
		return bytes.Clone(p), nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// The payload is never embedded in HTML; keep "<", ">" and "&" readable.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(payload); err != nil {
		return nil, &FieldError{Field: FieldPayload, Reason: "cannot be marshalled to JSON", Err: err}
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Validate checks every L1 rule on a struct built in Go and returns the
// first violation as a *FieldError, in field order. It does not apply the
// receiver's size and depth limits (see Decoder).
func (e *Envelope) Validate() error {
	if e == nil {
		return &FieldError{Reason: "envelope is nil"}
	}
	if fe := checkVersion(e.HCPVersion); fe != nil {
		return fe
	}
	if fe := checkMessageID(e.MessageID); fe != nil {
		return fe
	}
	if fe := checkTime(e.Timestamp); fe != nil {
		return fe
	}
	if fe := checkType(e.Type); fe != nil {
		return fe
	}
	if fe := checkSession(e.Type, e.SessionID); fe != nil {
		return fe
	}
	return checkPayload(e.Payload)
}
