package envelope

import (
	"errors"
)

// Encode validates e and returns its wire form: compact JSON with the six
// fields in spec order, session_id written as null when absent, the payload
// copied verbatim (surrounding whitespace trimmed), the timestamp in
// TimestampLayout (truncated to the millisecond). Decode(Encode(e)) equals
// e when e.Timestamp is a whole number of milliseconds in UTC, as NewAt
// makes it. Encode applies no size or depth limit; a receiver applies its own (see
// Decoder), so a publisher that wants to fail early compares the length with
// the peer's limit, MaxEnvelopeBytes by default.
func Encode(e *Envelope) ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return appendValid(e), nil
}

// envelopeOverhead is the length of an encoded envelope but for its type
// and payload, with a session id and version 1.0: appendValid's buffer
// then needs no second allocation.
const envelopeOverhead = len(`{"hcp_version":"1.0","message_id":"","timestamp":"","session_id":"","type":"","payload":}`) +
	36 + len(TimestampLayout) + 36

// appendValid is Encode of an envelope already validated.
func appendValid(e *Envelope) []byte {
	payload := trimJSONSpace(e.Payload)
	// Every value but the payload was validated to be plain ASCII without
	// quotes or backslashes, so it needs no escaping.
	buf := make([]byte, 0, envelopeOverhead+len(e.Type)+len(payload))
	buf = append(buf, `{"hcp_version":"`...)
	buf = append(buf, e.HCPVersion...)
	buf = append(buf, `","message_id":"`...)
	buf = append(buf, e.MessageID...)
	buf = append(buf, `","timestamp":"`...)
	buf = appendTimestamp(buf, e.Timestamp)
	buf = append(buf, `","session_id":`...)
	if e.SessionID == nil {
		buf = append(buf, "null"...)
	} else {
		buf = append(buf, '"')
		buf = append(buf, *e.SessionID...)
		buf = append(buf, '"')
	}
	buf = append(buf, `,"type":"`...)
	buf = append(buf, e.Type...)
	buf = append(buf, `","payload":`...)
	buf = append(buf, payload...)
	buf = append(buf, '}')
	return buf
}

// MarshalJSON implements json.Marshaler with Encode. It has a value
// receiver so that marshalling an Envelope value, not only a pointer, yields
// the wire form rather than Go field names.
func (e Envelope) MarshalJSON() ([]byte, error) { return Encode(&e) }

// UnmarshalJSON implements json.Unmarshaler with Decode and the default
// limits.
func (e *Envelope) UnmarshalJSON(b []byte) error {
	if e == nil {
		return errors.New("hcp envelope: UnmarshalJSON on nil pointer")
	}
	d, err := Decode(b)
	if err != nil {
		return err
	}
	*e = *d
	return nil
}

func trimJSONSpace(b []byte) []byte {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}
