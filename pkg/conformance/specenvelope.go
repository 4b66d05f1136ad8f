package conformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// fieldSessionID is the envelope's session_id key.
const fieldSessionID = "session_id"

// SpecError is an envelope that breaks a rule of L1, naming the field
// and the spec line.
type SpecError struct {
	// Field is the envelope key ("" for the body as a whole).
	Field string
	// Ref is the spec line the rule comes from.
	Ref    string
	Reason string
}

func (e *SpecError) Error() string {
	if e.Field == "" {
		return e.Reason + " (" + e.Ref + ")"
	}
	return e.Field + ": " + e.Reason + " (" + e.Ref + ")"
}

var (
	versionRE = regexp.MustCompile(`^(\d+)\.(\d+)$`)
	// isoUTC is an ISO 8601 date and time in UTC, extended or basic
	// format, seconds optional (reduced precision), any decimal fraction
	// with '.' or ',', and the zone Z or a zero offset (+00, +0000,
	// +00:00): what "ISO 8601 format in UTC" (L1:359) admits.
	isoUTC = regexp.MustCompile(`^(\d{4})-?(\d{2})-?(\d{2})T(\d{2}):?(\d{2})(?::?(\d{2})(?:[.,](\d+))?)?(Z|\+00(?::?00)?)$`)
)

// SpecDecode decodes an envelope by the letter of L1 alone (L1:19–40,
// L1:355, L1:359): a UTF-8 JSON object whose hcp_version is MAJOR.MINOR
// with major 1, message_id a UUID v4, timestamp ISO 8601 in UTC, session_id
// null (or absent) only on task_submit and a UUID v4 on every other type,
// type one of the seven message types and payload an object. Unlike
// envelope.Decode it takes what the spec leaves open: unknown keys, a key
// given twice (the last wins, as in most JSON parsers), and every ISO 8601
// form of a UTC time. It never panics.
func SpecDecode(body []byte) (*envelope.Envelope, error) {
	if !utf8.Valid(body) {
		return nil, &SpecError{Ref: "L1:355", Reason: "the body is not UTF-8"}
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		return nil, &SpecError{Ref: "L1:21", Reason: "the body is not a JSON object"}
	}
	str := func(key, ref string) (string, error) {
		v, ok := raw[key]
		if !ok {
			return "", &SpecError{Field: key, Ref: ref, Reason: "missing"}
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return "", &SpecError{Field: key, Ref: ref, Reason: "not a string"}
		}
		return s, nil
	}
	env := &envelope.Envelope{}
	var err error
	if env.HCPVersion, err = str("hcp_version", "L1:35"); err != nil {
		return nil, err
	}
	if m := versionRE.FindStringSubmatch(env.HCPVersion); m == nil || strings.TrimLeft(m[1], "0") != envelope.SupportedMajor {
		return nil, &SpecError{Field: "hcp_version", Ref: "L1:35", Reason: fmt.Sprintf("%q is not MAJOR.MINOR of major version %s", short(env.HCPVersion), envelope.SupportedMajor)}
	}
	if env.MessageID, err = str("message_id", "L1:36"); err != nil {
		return nil, err
	}
	if !envelope.IsUUIDv4(env.MessageID) {
		return nil, &SpecError{Field: "message_id", Ref: "L1:36", Reason: fmt.Sprintf("%q is not a UUID v4", short(env.MessageID))}
	}
	ts, err := str("timestamp", "L1:37")
	if err != nil {
		return nil, err
	}
	if env.Timestamp, err = ParseISO8601UTC(ts); err != nil {
		return nil, &SpecError{Field: "timestamp", Ref: "L1:359", Reason: err.Error()}
	}
	typ, err := str("type", "L1:39")
	if err != nil {
		return nil, err
	}
	env.Type = envelope.MessageType(typ)
	if !env.Type.Known() {
		return nil, &SpecError{Field: "type", Ref: "L1:39", Reason: fmt.Sprintf("%q is not a message type (L1:55–72)", short(typ))}
	}
	sid, present := raw[fieldSessionID]
	switch {
	case !present || bytes.Equal(bytes.TrimSpace(sid), []byte("null")):
		if env.Type != envelope.TypeTaskSubmit {
			return nil, &SpecError{Field: fieldSessionID, Ref: "L1:38", Reason: "null or missing on " + typ + ": all messages after the initial task_submit MUST include a valid session ID"}
		}
	default:
		var s string
		if json.Unmarshal(sid, &s) != nil || !envelope.IsUUIDv4(s) {
			return nil, &SpecError{Field: fieldSessionID, Ref: "L1:38", Reason: "not null and not a UUID v4 string"}
		}
		if env.Type == envelope.TypeTaskSubmit {
			return nil, &SpecError{Field: fieldSessionID, Ref: "L1:38", Reason: "set on task_submit, where it is null (the callee creates the session, L1:62)"}
		}
		env.SessionID = &s
	}
	p, ok := raw["payload"]
	var obj map[string]json.RawMessage
	if !ok || json.Unmarshal(p, &obj) != nil || obj == nil {
		return nil, &SpecError{Field: "payload", Ref: "L1:40", Reason: "missing or not a JSON object"}
	}
	env.Payload = p
	return env, nil
}

// ParseISO8601UTC parses a date and time in ISO 8601 format in UTC
// (L1:359): extended (2025-01-15T08:30:00.000Z) or basic
// (20250115T083000Z) format, seconds optional, any number of fraction
// digits after '.' or ',', the zone Z or a zero offset.
func ParseISO8601UTC(s string) (time.Time, error) {
	m := isoUTC.FindStringSubmatch(s)
	if m == nil {
		return time.Time{}, fmt.Errorf("%q is not an ISO 8601 date and time in UTC", short(s))
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	year, month, day, hour, minute := n(1), n(2), n(3), n(4), n(5)
	sec := 0
	if m[6] != "" {
		sec = n(6)
	}
	var nsec int
	if f := m[7]; f != "" {
		f = (f + "000000000")[:9]
		nsec, _ = strconv.Atoi(f)
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if month < 1 || month > 12 || t.Day() != day || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, fmt.Errorf("%q is not a valid date and time", short(s))
	}
	return t, nil
}

// specEventPayload checks an event's payload by L2 alone (L2:78–108): a
// known event_type, an integer sequence, an object data.
func specEventPayload(p json.RawMessage) error {
	var ev struct {
		EventType *string         `json:"event_type"`
		Sequence  json.RawMessage `json:"sequence"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(p, &ev); err != nil {
		return fmt.Errorf("event payload: %v", err)
	}
	if ev.EventType == nil || !knownEventType(*ev.EventType) {
		return fmt.Errorf("event_type %s is not one of the nine standard event types (L2:97–108)", quoteOrMissing(ev.EventType))
	}
	if _, err := strconv.ParseInt(strings.TrimSpace(string(ev.Sequence)), 10, 64); err != nil {
		return fmt.Errorf("sequence %s is not an integer (L2:94)", short(string(ev.Sequence)))
	}
	var data map[string]json.RawMessage
	if json.Unmarshal(ev.Data, &data) != nil || data == nil {
		return fmt.Errorf("data is not an object (L2:95)")
	}
	return nil
}

func knownEventType(t string) bool {
	for _, k := range session.EventTypes() {
		if string(k) == t {
			return true
		}
	}
	return false
}

func quoteOrMissing(s *string) string {
	if s == nil {
		return "missing"
	}
	return strconv.Quote(short(*s))
}

// short truncates a quoted value for messages.
func short(s string) string {
	const n = 60
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
