package checker

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The observers read messages with their own decoding, from the L1/L2 JSON
// as the spec writes it, not with the project's decoder: a decoder bug must
// not hide from the checker.

// wire is an L1 envelope with the L2 event fields the checker needs.
type wire struct {
	MessageID string          `json:"message_id"`
	SessionID *string         `json:"session_id"`
	Type      string          `json:"type"`
	Payload   json.RawMessage `json:"payload"`
}

type eventPayload struct {
	EventType string `json:"event_type"`
	Sequence  int64  `json:"sequence"`
	Data      struct {
		Reason     string `json:"reason"`
		FinalState string `json:"final_state"`
	} `json:"data"`
}

// finalOf is the terminal state a message of type t announces (L2).
var finalOf = map[string]string{"task_completed": "COMPLETED", "task_failed": "FAILED", "task_rejected": "REJECTED"}

// FromWire is one message as a tap queue received it: the AMQP body, its
// headers (for hcp-owner-epoch) and the broker-validated user-id.
func FromWire(body []byte, headers amqp.Table, userID string, at time.Time) (Message, error) {
	var w wire
	if err := json.Unmarshal(body, &w); err != nil {
		return Message{}, fmt.Errorf("tap: not an HCP envelope: %w", err)
	}
	if w.SessionID == nil || *w.SessionID == "" {
		return Message{}, fmt.Errorf("tap: %s message %s has no session_id", w.Type, w.MessageID)
	}
	m, err := build(*w.SessionID, w.MessageID, w.Type, w.Payload)
	if err != nil {
		return Message{}, err
	}
	m.Epoch = epochOf(headers)
	m.Publisher, m.At = userID, at
	return m, nil
}

// FromApp is one message as the caller's app received it: the fields the
// harness API gives the app (docs/harness-api.md).
func FromApp(sessionID, messageID, typ string, payload json.RawMessage, at time.Time) (Message, error) {
	m, err := build(sessionID, messageID, typ, payload)
	m.At = at
	return m, err
}

func build(sessionID, messageID, typ string, payload json.RawMessage) (Message, error) {
	digest, err := Digest(messageID, payload)
	if err != nil {
		return Message{}, fmt.Errorf("%s message %s of session %s: %w", typ, messageID, sessionID, err)
	}
	m := Message{Session: sessionID, Type: typ, Digest: digest, Final: finalOf[typ], Closes: typ == "task_rejected"}
	if typ == "event" {
		var p eventPayload
		if err := json.Unmarshal(payload, &p); err != nil {
			return Message{}, fmt.Errorf("event %s of session %s: payload: %w", messageID, sessionID, err)
		}
		if p.Sequence <= 0 {
			return Message{}, fmt.Errorf("event %s of session %s has no sequence", messageID, sessionID)
		}
		m.Seq, m.Type = p.Sequence, p.EventType
		if p.EventType == "state_changed" {
			m.Reason = p.Data.Reason
		}
		if p.EventType == "session_closed" {
			m.Final, m.Closes = p.Data.FinalState, true
		}
	}
	return m, nil
}

// Digest identifies a message's content: its message_id and its payload
// with insignificant whitespace and key order removed, so the same message
// relayed through the caller's sidecar (which re-encodes it for the app)
// has the digest it had on the wire.
func Digest(messageID string, payload json.RawMessage) (string, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return "", fmt.Errorf("payload is not JSON: %w", err)
	}
	canon, err := json.Marshal(v) // maps marshal with sorted keys
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(append([]byte(messageID+"\x00"), canon...))
	return hex.EncodeToString(sum[:8]), nil
}

// epochOf reads the hcp-owner-epoch header (0 when absent or malformed:
// a sender that does not fence).
func epochOf(h amqp.Table) int64 {
	switch v := h["hcp-owner-epoch"].(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	case int:
		return int64(v)
	}
	return 0
}
