package envelope_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

const (
	msgID  = "550e8400-e29b-41d4-a716-446655440000"
	sessID = "7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e"
	ts     = "2025-01-15T08:30:00.000Z"
)

// kv is one top-level member of a test envelope, with its raw JSON value.
type kv struct{ k, v string }

func obj(kvs []kv) []byte {
	var b strings.Builder
	b.WriteByte('{')
	for i, m := range kvs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + m.k + `":` + m.v)
	}
	b.WriteByte('}')
	return []byte(b.String())
}

func fields(t envelope.MessageType) []kv {
	sid := `"` + sessID + `"`
	if t == envelope.TypeTaskSubmit {
		sid = "null"
	}
	return []kv{
		{"hcp_version", `"1.0"`},
		{"message_id", `"` + msgID + `"`},
		{"timestamp", `"` + ts + `"`},
		{"session_id", sid},
		{"type", `"` + string(t) + `"`},
		{"payload", `{}`},
	}
}

// with replaces k's value, or appends k.
func with(kvs []kv, k, v string) []kv {
	out := append([]kv(nil), kvs...)
	for i := range out {
		if out[i].k == k {
			out[i].v = v
			return out
		}
	}
	return append(out, kv{k, v})
}

func without(kvs []kv, k string) []kv {
	var out []kv
	for _, m := range kvs {
		if m.k != k {
			out = append(out, m)
		}
	}
	return out
}

func q(s string) string { return `"` + s + `"` }

var (
	submit = fields(envelope.TypeTaskSubmit)
	event  = fields(envelope.TypeEvent)
)

func TestDecodeValid(t *testing.T) {
	tests := []struct {
		name string
		body []byte
		// checks on the result beyond "no error"
		check func(t *testing.T, e *envelope.Envelope)
	}{
		{"spec example", []byte(`{
  "hcp_version": "1.0",
  "message_id": "550e8400-e29b-41d4-a716-446655440000",
  "timestamp": "2025-01-15T08:30:00.000Z",
  "session_id": null,
  "type": "task_submit",
  "payload": { }
}`), func(t *testing.T, e *envelope.Envelope) {
			if e.SessionID != nil || e.Type != envelope.TypeTaskSubmit || string(e.Payload) != "{ }" {
				t.Errorf("got %+v", e)
			}
			want := time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)
			if !e.Timestamp.Equal(want) || e.Timestamp.Location() != time.UTC {
				t.Errorf("timestamp %v, want %v in UTC", e.Timestamp, want)
			}
		}},
		{"task_submit", obj(submit), nil},
		{"abort", obj(fields(envelope.TypeAbort)), nil},
		{"task_accepted", obj(fields(envelope.TypeTaskAccepted)), nil},
		{"task_rejected", obj(fields(envelope.TypeTaskRejected)), nil},
		{"event", obj(event), func(t *testing.T, e *envelope.Envelope) {
			if e.Session() != sessID {
				t.Errorf("session %q", e.Session())
			}
		}},
		{"task_completed", obj(fields(envelope.TypeTaskCompleted)), nil},
		{"task_failed", obj(fields(envelope.TypeTaskFailed)), nil},
		{"uppercase message_id", obj(with(submit, "message_id", q(strings.ToUpper(msgID)))), nil},
		{"mixed case session_id", obj(with(event, "session_id", q("7D444840-9dc0-41F1-A9d8-bd0e1b9a2c5e"))), nil},
		{"variant nibble 8", obj(with(submit, "message_id", q("550e8400-e29b-41d4-8716-446655440000"))), nil},
		{"variant nibble b", obj(with(submit, "message_id", q("550e8400-e29b-41d4-b716-446655440000"))), nil},
		{"minor version 1.1", obj(with(submit, "hcp_version", q("1.1"))), nil},
		{"minor version 1.10", obj(with(submit, "hcp_version", q("1.10"))), nil},
		{"escaped version string", obj(with(submit, "hcp_version", `"\u0031.0"`)), func(t *testing.T, e *envelope.Envelope) {
			if e.HCPVersion != "1.0" {
				t.Errorf("version %q", e.HCPVersion)
			}
		}},
		{"escaped key", []byte(strings.Replace(string(obj(submit)), `"type"`, `"\u0074ype"`, 1)), nil},
		{"members in another order", obj([]kv{submit[5], submit[4], submit[3], submit[2], submit[1], submit[0]}), nil},
		{"leap day", obj(with(submit, "timestamp", q("2024-02-29T23:59:59.999Z"))), nil},
		{"epoch", obj(with(submit, "timestamp", q("1970-01-01T00:00:00.000Z"))), nil},
		{"year 9999", obj(with(submit, "timestamp", q("9999-12-31T23:59:59.999Z"))), nil},
		{"year 9999 last nanosecond", obj(with(submit, "timestamp", q("9999-12-31T23:59:59.999999999Z"))), nil},
		// L1 asks for "ISO 8601 format in UTC"; the .000 of its example is
		// an example, not a rule: any fractional precision is ISO 8601.
		{"task_submit timestamp without fraction", obj(with(submit, "timestamp", q("2025-01-15T08:30:00Z"))), wantTime(time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC))},
		{"task_submit timestamp with microseconds", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.123456Z"))), wantTime(time.Date(2025, 1, 15, 8, 30, 0, 123456000, time.UTC))},
		{"timestamp with nanoseconds", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.123456789Z"))), wantTime(time.Date(2025, 1, 15, 8, 30, 0, 123456789, time.UTC))},
		{"timestamp with one fraction digit", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.5Z"))), wantTime(time.Date(2025, 1, 15, 8, 30, 0, 500_000_000, time.UTC))},
		{"timestamp with centiseconds", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.12Z"))), wantTime(time.Date(2025, 1, 15, 8, 30, 0, 120_000_000, time.UTC))},
		{"timestamp beyond nanoseconds truncated", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.1234567899Z"))), wantTime(time.Date(2025, 1, 15, 8, 30, 0, 123456789, time.UTC))},
		{"timestamp zero offset +00:00", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.000+00:00"))), wantTime(time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC))},
		{"event timestamp without fraction", obj(with(event, "timestamp", q("2025-01-15T08:30:00Z"))), nil},
		{"rich payload kept verbatim", obj(with(submit, "payload", `{"a": [1, -2.5e+10, 1e999, 123456789012345678901234567890], "b": {"c": null, "d": true}, "e": "\u00e9\ud83d\ude00 <&>", "f": "日本"}`)),
			func(t *testing.T, e *envelope.Envelope) {
				want := `{"a": [1, -2.5e+10, 1e999, 123456789012345678901234567890], "b": {"c": null, "d": true}, "e": "\u00e9\ud83d\ude00 <&>", "f": "日本"}`
				if string(e.Payload) != want {
					t.Errorf("payload %s", e.Payload)
				}
			}},
		{"same key in sibling objects", obj(with(submit, "payload", `{"a":{"x":1},"b":{"x":2},"c":[{"x":1},{"x":1}]}`)), nil},
		{"same key at different depths", obj(with(submit, "payload", `{"x":{"x":{"x":1}}}`)), nil},
		{"payload with 100 distinct keys", obj(with(submit, "payload", manyKeys(100, false))), nil},
		{"surrounding whitespace", []byte(" \t\r\n" + string(obj(submit)) + "\n "), nil},
		{"payload nested to the limit", obj(with(submit, "payload", nested(envelope.DefaultMaxDepth-1))), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := envelope.Decode(tt.body)
			if err != nil {
				t.Fatalf("Decode: %v\nbody: %s", err, tt.body)
			}
			if tt.check != nil {
				tt.check(t, e)
			}
			if err := e.Validate(); err != nil {
				t.Errorf("decoded envelope fails Validate: %v", err)
			}
		})
	}
}

// nested returns a payload object nested depth levels deep ({} is 1).
func nested(depth int) string {
	return strings.Repeat(`{"a":`, depth-1) + "{}" + strings.Repeat("}", depth-1)
}

func manyKeys(n int, dupLast bool) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		k := i
		if dupLast && i == n-1 {
			k = 3
		}
		b.WriteString(`"k` + itoa(k) + `":1`)
	}
	b.WriteByte('}')
	return b.String()
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var d []byte
	for ; i > 0; i /= 10 {
		d = append([]byte{byte('0' + i%10)}, d...)
	}
	return string(d)
}

func TestDecodeFieldErrors(t *testing.T) {
	tests := []struct {
		name  string
		body  []byte
		field string
		// unsupported marks errors that must match ErrUnsupportedVersion.
		unsupported bool
	}{
		// hcp_version
		{"version missing", obj(without(submit, "hcp_version")), "hcp_version", false},
		{"version null", obj(with(submit, "hcp_version", "null")), "hcp_version", false},
		{"version number", obj(with(submit, "hcp_version", "1.0")), "hcp_version", false},
		{"version empty", obj(with(submit, "hcp_version", q(""))), "hcp_version", false},
		{"version major only", obj(with(submit, "hcp_version", q("1"))), "hcp_version", false},
		{"version trailing dot", obj(with(submit, "hcp_version", q("1."))), "hcp_version", false},
		{"version leading dot", obj(with(submit, "hcp_version", q(".0"))), "hcp_version", false},
		{"version three parts", obj(with(submit, "hcp_version", q("1.0.0"))), "hcp_version", false},
		{"version prefixed v", obj(with(submit, "hcp_version", q("v1.0"))), "hcp_version", false},
		{"version leading zero major", obj(with(submit, "hcp_version", q("01.0"))), "hcp_version", false},
		{"version leading zero minor", obj(with(submit, "hcp_version", q("1.01"))), "hcp_version", false},
		{"version spaces", obj(with(submit, "hcp_version", q(" 1.0"))), "hcp_version", false},
		{"version negative", obj(with(submit, "hcp_version", q("-1.0"))), "hcp_version", false},
		{"version fullwidth digit", obj(with(submit, "hcp_version", q("１.0"))), "hcp_version", false},
		{"version major 2", obj(with(submit, "hcp_version", q("2.0"))), "hcp_version", true},
		{"version major 0", obj(with(submit, "hcp_version", q("0.9"))), "hcp_version", true},
		{"version major 10", obj(with(submit, "hcp_version", q("10.0"))), "hcp_version", true},
		{"version huge major", obj(with(submit, "hcp_version", q("99999999999999999999999.0"))), "hcp_version", true},

		// message_id
		{"message_id missing", obj(without(submit, "message_id")), "message_id", false},
		{"message_id null", obj(with(submit, "message_id", "null")), "message_id", false},
		{"message_id number", obj(with(submit, "message_id", "42")), "message_id", false},
		{"message_id empty", obj(with(submit, "message_id", q(""))), "message_id", false},
		{"message_id not a uuid", obj(with(submit, "message_id", q("hello"))), "message_id", false},
		{"message_id v1", obj(with(submit, "message_id", q("550e8400-e29b-11d4-a716-446655440000"))), "message_id", false},
		{"message_id v5", obj(with(submit, "message_id", q("550e8400-e29b-51d4-a716-446655440000"))), "message_id", false},
		{"message_id variant c (Microsoft)", obj(with(submit, "message_id", q("550e8400-e29b-41d4-c716-446655440000"))), "message_id", false},
		{"message_id variant 7 (NCS)", obj(with(submit, "message_id", q("550e8400-e29b-41d4-7716-446655440000"))), "message_id", false},
		{"message_id nil uuid", obj(with(submit, "message_id", q("00000000-0000-0000-0000-000000000000"))), "message_id", false},
		{"message_id braces", obj(with(submit, "message_id", q("{"+msgID+"}"))), "message_id", false},
		{"message_id urn", obj(with(submit, "message_id", q("urn:uuid:"+msgID))), "message_id", false},
		{"message_id no dashes", obj(with(submit, "message_id", q(strings.ReplaceAll(msgID, "-", "")))), "message_id", false},
		{"message_id non-hex", obj(with(submit, "message_id", q("g50e8400-e29b-41d4-a716-446655440000"))), "message_id", false},
		{"message_id short", obj(with(submit, "message_id", q(msgID[:35]))), "message_id", false},
		{"message_id long", obj(with(submit, "message_id", q(msgID+"0"))), "message_id", false},
		{"message_id dash misplaced", obj(with(submit, "message_id", q("550e840-0e29b-41d4-a716-446655440000"))), "message_id", false},

		// timestamp
		{"timestamp missing", obj(without(submit, "timestamp")), "timestamp", false},
		{"timestamp null", obj(with(submit, "timestamp", "null")), "timestamp", false},
		{"timestamp number", obj(with(submit, "timestamp", "1736929800000")), "timestamp", false},
		{"timestamp empty fraction", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.Z"))), "timestamp", false},
		{"timestamp offset -00:00", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.000-00:00"))), "timestamp", false},
		{"timestamp offset basic format", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.000+0000"))), "timestamp", false},
		{"timestamp offset hours only", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.000+00"))), "timestamp", false},
		{"timestamp one-digit hour", obj(with(submit, "timestamp", q("2025-01-15T8:30:00Z"))), "timestamp", false},
		{"timestamp no seconds", obj(with(submit, "timestamp", q("2025-01-15T08:30Z"))), "timestamp", false},
		{"timestamp expanded year", obj(with(submit, "timestamp", q("+02025-01-15T08:30:00Z"))), "timestamp", false},
		{"timestamp non-UTC offset", obj(with(submit, "timestamp", q("2025-01-15T09:30:00.000+01:00"))), "timestamp", false},
		{"timestamp no zone", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.000"))), "timestamp", false},
		{"timestamp lowercase z", obj(with(submit, "timestamp", q("2025-01-15T08:30:00.000z"))), "timestamp", false},
		{"timestamp lowercase t", obj(with(submit, "timestamp", q("2025-01-15t08:30:00.000Z"))), "timestamp", false},
		{"timestamp space separator", obj(with(submit, "timestamp", q("2025-01-15 08:30:00.000Z"))), "timestamp", false},
		{"timestamp comma fraction", obj(with(submit, "timestamp", q("2025-01-15T08:30:00,000Z"))), "timestamp", false},
		{"timestamp basic format", obj(with(submit, "timestamp", q("20250115T083000.000Z"))), "timestamp", false},
		{"timestamp month 13", obj(with(submit, "timestamp", q("2025-13-15T08:30:00.000Z"))), "timestamp", false},
		{"timestamp Feb 30", obj(with(submit, "timestamp", q("2025-02-30T08:30:00.000Z"))), "timestamp", false},
		{"timestamp Feb 29 non-leap", obj(with(submit, "timestamp", q("2023-02-29T08:30:00.000Z"))), "timestamp", false},
		{"timestamp hour 24", obj(with(submit, "timestamp", q("2025-01-15T24:00:00.000Z"))), "timestamp", false},
		{"timestamp leap second", obj(with(submit, "timestamp", q("2016-12-31T23:59:60.000Z"))), "timestamp", false},
		{"timestamp before epoch", obj(with(submit, "timestamp", q("1969-12-31T23:59:59.999Z"))), "timestamp", false},
		{"timestamp year zero", obj(with(submit, "timestamp", q("0000-01-01T00:00:00.000Z"))), "timestamp", false},
		{"timestamp go zero time", obj(with(submit, "timestamp", q("0001-01-01T00:00:00.000Z"))), "timestamp", false},
		{"timestamp trailing space", obj(with(submit, "timestamp", q(ts+" "))), "timestamp", false},
		{"timestamp fullwidth digit", obj(with(submit, "timestamp", q("２025-01-15T08:30:00.000Z"))), "timestamp", false},

		// type
		{"type missing", obj(without(submit, "type")), "type", false},
		{"type null", obj(with(submit, "type", "null")), "type", false},
		{"type number", obj(with(submit, "type", "1")), "type", false},
		{"type empty", obj(with(submit, "type", q(""))), "type", false},
		{"type unknown", obj(with(submit, "type", q("task_submitted"))), "type", false},
		{"type upper case", obj(with(submit, "type", q("TASK_SUBMIT"))), "type", false},
		{"type L2 event name", obj(with(event, "type", q("progress"))), "type", false},

		// session_id
		{"session_id missing on task_submit", obj(without(submit, "session_id")), "session_id", false},
		{"session_id missing on event", obj(without(event, "session_id")), "session_id", false},
		{"session_id set on task_submit", obj(with(submit, "session_id", q(sessID))), "session_id", false},
		{"session_id empty string on task_submit", obj(with(submit, "session_id", q(""))), "session_id", false},
		{"session_id null on abort", obj(with(fields(envelope.TypeAbort), "session_id", "null")), "session_id", false},
		{"session_id null on task_accepted", obj(with(fields(envelope.TypeTaskAccepted), "session_id", "null")), "session_id", false},
		{"session_id null on task_rejected", obj(with(fields(envelope.TypeTaskRejected), "session_id", "null")), "session_id", false},
		{"session_id null on event", obj(with(event, "session_id", "null")), "session_id", false},
		{"session_id null on task_completed", obj(with(fields(envelope.TypeTaskCompleted), "session_id", "null")), "session_id", false},
		{"session_id null on task_failed", obj(with(fields(envelope.TypeTaskFailed), "session_id", "null")), "session_id", false},
		{"session_id empty string", obj(with(event, "session_id", q(""))), "session_id", false},
		{"session_id not a uuid", obj(with(event, "session_id", q("session-xyz"))), "session_id", false},
		{"session_id v1", obj(with(event, "session_id", q("7d444840-9dc0-11f1-a9d8-bd0e1b9a2c5e"))), "session_id", false},
		{"session_id number", obj(with(event, "session_id", "7")), "session_id", false},
		{"session_id object", obj(with(event, "session_id", `{}`)), "session_id", false},
		{"session_id false", obj(with(submit, "session_id", "false")), "session_id", false},

		// payload
		{"payload missing", obj(without(submit, "payload")), "payload", false},
		{"payload null", obj(with(submit, "payload", "null")), "payload", false},
		{"payload array", obj(with(submit, "payload", "[]")), "payload", false},
		{"payload string", obj(with(submit, "payload", q("{}"))), "payload", false},
		{"payload number", obj(with(submit, "payload", "0")), "payload", false},
		{"payload bool", obj(with(submit, "payload", "true")), "payload", false},
		{"payload duplicate key", obj(with(submit, "payload", `{"caller_id":"a","caller_id":"b"}`)), "payload", false},
		{"payload duplicate key via escape", obj(with(submit, "payload", `{"caller_id":"a","caller\u005fid":"b"}`)), "payload", false},
		{"payload nested duplicate key", obj(with(submit, "payload", `{"inputs":{"x":{"y":1,"y":2}}}`)), "payload", false},
		{"payload duplicate key in array element", obj(with(submit, "payload", `{"a":[1,{"k":1,"k":1}]}`)), "payload", false},
		{"payload duplicate key in large object", obj(with(submit, "payload", manyKeys(100, true))), "payload", false},

		// top level keys
		{"unknown field", obj(with(submit, "caller_id", q("alpha"))), "caller_id", false},
		{"unknown field null", obj(with(submit, "extra", "null")), "extra", false},
		{"key differs in case", obj(append(without(submit, "message_id"), kv{"Message_ID", q(msgID)})), "Message_ID", false},
		{"duplicate message_id", obj(append(submit, kv{"message_id", q("6ba7b810-9dad-41d1-80b4-00c04fd430c8")})), "message_id", false},
		{"duplicate type", obj(append(event, kv{"type", q("task_completed")})), "type", false},
		{"duplicate session_id null", obj(append(submit, kv{"session_id", "null"})), "session_id", false},
		{"duplicate via escaped key", obj(append(submit, kv{`\u0074ype`, q("abort")})), "type", false},
		{"duplicate key inside a non-payload field", obj(with(submit, "type", `{"a":1,"a":2}`)), "type", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := envelope.Decode(tt.body)
			if err == nil {
				t.Fatalf("Decode succeeded: %+v\nbody: %s", e, tt.body)
			}
			var fe *envelope.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v (%T) is not a *FieldError", err, err)
			}
			if fe.Field != tt.field {
				t.Errorf("Field = %q, want %q (error: %v)", fe.Field, tt.field, err)
			}
			if got := errors.Is(err, envelope.ErrUnsupportedVersion); got != tt.unsupported {
				t.Errorf("errors.Is(ErrUnsupportedVersion) = %v, want %v (error: %v)", got, tt.unsupported, err)
			}
			if errors.Is(err, envelope.ErrMalformed) || errors.Is(err, envelope.ErrTooLarge) {
				t.Errorf("field error %v also matches a body-level error", err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("message %q does not name the field", err)
			}
		})
	}
}
