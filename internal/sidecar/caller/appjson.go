package caller

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// The bodies POSTed to the app, built by hand: encoding/json would
// compact (re-scan) every message's payload and data, which the envelope
// decoder has already checked to be valid JSON, on the hot path of every
// delivery. The result is what json.Marshal writes, field for field, except
// that payload and data are copied as the callee sent them (the same JSON
// values, whitespace and HTML characters as they were, where json.Marshal
// would compact them and escape <, > and &).

// AppendJSON appends m's JSON to b. Payload and Data must be valid JSON
// (as the envelope decoder leaves them).
func (m *AppMessage) AppendJSON(b []byte) []byte {
	b = append(b, `{"session_id":`...)
	b = appendString(b, m.SessionID)
	b = append(b, `,"message_id":`...)
	b = appendString(b, m.MessageID)
	b = append(b, `,"type":`...)
	b = appendString(b, m.Type)
	b = append(b, `,"timestamp":`...)
	b = appendString(b, m.Timestamp)
	b = append(b, `,"callee_id":`...)
	b = appendString(b, m.CalleeID)
	if m.TaskMessageID != "" {
		b = append(b, `,"task_message_id":`...)
		b = appendString(b, m.TaskMessageID)
	}
	if m.Sequence != 0 {
		b = append(b, `,"sequence":`...)
		b = strconv.AppendInt(b, m.Sequence, 10)
	}
	if m.EventType != "" {
		b = append(b, `,"event_type":`...)
		b = appendString(b, m.EventType)
	}
	if len(m.Data) > 0 {
		b = append(b, `,"data":`...)
		b = append(b, m.Data...)
	}
	b = append(b, `,"payload":`...)
	b = appendRaw(b, m.Payload)
	b = append(b, `,"redelivered":`...)
	b = strconv.AppendBool(b, m.Redelivered)
	if m.Lost != nil {
		b = append(b, `,"lost":{"from":`...)
		b = strconv.AppendInt(b, m.Lost.From, 10)
		b = append(b, `,"to":`...)
		b = strconv.AppendInt(b, m.Lost.To, 10)
		b = append(b, `,"reason":`...)
		b = appendString(b, m.Lost.Reason)
		b = append(b, '}')
	}
	if m.Traceparent != "" {
		b = append(b, `,"traceparent":`...)
		b = appendString(b, m.Traceparent)
	}
	if m.Tracestate != "" {
		b = append(b, `,"tracestate":`...)
		b = appendString(b, m.Tracestate)
	}
	return append(b, '}')
}

// AppendJSON appends the batch's JSON to b (see AppMessage.AppendJSON).
func (a *AppBatch) AppendJSON(b []byte) []byte {
	b = append(b, `{"session_id":`...)
	b = appendString(b, a.SessionID)
	b = append(b, `,"messages":`...)
	if a.Messages == nil {
		b = append(b, "null"...)
		return append(b, '}')
	}
	b = append(b, '[')
	for i := range a.Messages {
		if i > 0 {
			b = append(b, ',')
		}
		b = a.Messages[i].AppendJSON(b)
	}
	return append(b, "]}"...)
}

// appendDelivery appends the stream line of delivery n:
// {"delivery":n,"session_id":"…","messages":[…]} and a newline. A message's
// payload and data are copied as the callee sent them, and valid JSON has
// newlines (and carriage returns) only as whitespace between tokens: they
// become spaces, so that the line stays one line.
func appendDelivery(b []byte, n int64, sessionID string, ms []AppMessage) []byte {
	b = append(b, `{"delivery":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, `,"session_id":`...)
	b = appendString(b, sessionID)
	b = append(b, `,"messages":[`...)
	start := len(b)
	for i := range ms {
		if i > 0 {
			b = append(b, ',')
		}
		b = ms[i].AppendJSON(b)
	}
	for i := start; ; {
		j := bytes.IndexAny(b[i:], "\r\n")
		if j < 0 {
			break
		}
		b[i+j] = ' '
		i += j + 1
	}
	return append(b, "]}\n"...)
}

// appendRaw appends a raw JSON value, null when there is none (as
// json.Marshal writes a nil json.RawMessage).
func appendRaw(b []byte, raw json.RawMessage) []byte {
	if len(raw) == 0 {
		return append(b, "null"...)
	}
	return append(b, raw...)
}

// appendString appends s as a JSON string, as json.Marshal writes it: the
// common case (printable ASCII with nothing to escape: ids, types, times)
// is copied; anything else goes through encoding/json.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
