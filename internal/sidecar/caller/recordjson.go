package caller

import (
	"strconv"
	"time"
)

// The journal line of a session record, built by hand: every group
// commit encodes the records it covers, and encoding/json's reflection
// over SessionRecord's seventeen fields was about a twentieth of the
// caller sidecar's CPU at a steady 1,000 events/s. The result is what
// json.Marshal writes, byte for byte (TestSessionLineJSON), so the
// journal's format and checksums are unchanged.

// appendSessionLine appends l's JSON, {"session":{…}}, to b when l is a
// session record alone (the hot path) and reports whether it did; any
// other line, or a time json.Marshal would refuse, is left to
// encoding/json.
func appendSessionLine(b []byte, l journalLine) ([]byte, bool) {
	r := l.Session
	if r == nil || l.Task != nil || l.DeleteTask != "" || l.DeleteSession != "" {
		return b, false
	}
	start := len(b)
	b = append(b, `{"session":{"session_id":`...)
	b = appendString(b, r.SessionID)
	b = append(b, `,"callee_id":`...)
	b = appendString(b, r.CalleeID)
	b = appendOptString(b, `,"task_message_id":`, r.TaskMessageID)
	b = appendOptString(b, `,"capability":`, r.Capability)
	b = append(b, `,"last_seq":`...)
	b = strconv.AppendInt(b, r.LastSeq, 10)
	b = appendOptString(b, `,"state":`, r.State)
	b = appendOptString(b, `,"risk_level":`, r.RiskLevel)
	b = appendOptString(b, `,"token":`, r.Token)
	var ok bool
	if b, ok = appendOptTime(b, `,"token_expires_at":`, r.TokenExpiresAt); !ok {
		return b[:start], false
	}
	if r.AcceptedDelivered {
		b = append(b, `,"accepted_delivered":true`...)
	}
	b = appendOptString(b, `,"terminal":`, r.Terminal)
	if r.Closed {
		b = append(b, `,"closed":true`...)
	}
	if r.Unverified {
		b = append(b, `,"unverified":true`...)
	}
	b = appendOptInt(b, `,"owner_epoch":`, r.OwnerEpoch)
	b = appendOptInt(b, `,"epoch_from":`, r.EpochFrom)
	if b, ok = appendOptTime(b, `,"abort_requested_at":`, r.AbortRequestedAt); !ok {
		return b[:start], false
	}
	b = append(b, `,"updated_at":`...)
	if b, ok = appendTime(b, r.UpdatedAt); !ok {
		return b[:start], false
	}
	return append(b, "}}"...), true
}

// appendOptString appends key and s unless s is empty (omitempty).
func appendOptString(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendString(append(b, key...), s)
}

// appendOptInt appends key and n unless n is 0 (omitempty).
func appendOptInt(b []byte, key string, n int64) []byte {
	if n == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), n, 10)
}

// appendOptTime appends key and t unless t is zero (omitzero).
func appendOptTime(b []byte, key string, t time.Time) ([]byte, bool) {
	if t.IsZero() {
		return b, true
	}
	return appendTime(append(b, key...), t)
}

// appendTime appends t as time.Time.MarshalJSON writes it (RFC 3339 with
// sub-second precision, quoted); false where MarshalJSON fails (a year
// outside 0–9999).
func appendTime(b []byte, t time.Time) ([]byte, bool) {
	out, err := t.AppendText(append(b, '"'))
	if err != nil {
		return b, false // AppendText returns nothing then
	}
	return append(out, '"'), true
}
