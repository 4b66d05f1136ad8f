package session

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

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
		b = append(b, jsonNull...)
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
		if string(value) == jsonNull {
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
// for example *ProgressData for a progress event. Data in the plain form
// is decoded without reflection (plaindata.go), with the same result.
func (p *EventPayload) Decode() (EventData, error) {
	if p.Sequence >= 1 {
		if d, ok := decodePlain(p.EventType, p.Data); ok && d.Validate() == nil {
			return d, nil
		}
	}
	return p.decode()
}

// decode is Decode by encoding/json, which also words every error.
func (p *EventPayload) decode() (EventData, error) {
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
