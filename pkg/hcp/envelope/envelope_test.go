package envelope_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

func ptr(s string) *string { return &s }

func validEnvelope(t envelope.MessageType) *envelope.Envelope {
	e := &envelope.Envelope{
		HCPVersion: "1.0",
		MessageID:  msgID,
		Timestamp:  time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC),
		Type:       t,
		Payload:    json.RawMessage(`{}`),
	}
	if t.RequiresSession() {
		e.SessionID = ptr(sessID)
	}
	return e
}

func TestMessageTypes(t *testing.T) {
	commands := map[envelope.MessageType]bool{envelope.TypeTaskSubmit: true, envelope.TypeAbort: true}
	if got := len(envelope.Types()); got != 7 {
		t.Fatalf("Types() has %d entries, want 7", got)
	}
	for _, mt := range envelope.Types() {
		if !mt.Known() {
			t.Errorf("%s not Known", mt)
		}
		if mt.IsCommand() != commands[mt] || mt.IsEvent() == commands[mt] {
			t.Errorf("%s: IsCommand=%v IsEvent=%v", mt, mt.IsCommand(), mt.IsEvent())
		}
		if mt.RequiresSession() != (mt != envelope.TypeTaskSubmit) {
			t.Errorf("%s: RequiresSession=%v", mt, mt.RequiresSession())
		}
	}
	for _, mt := range []envelope.MessageType{"", "progress", "TASK_SUBMIT", "task_submit "} {
		if mt.Known() || mt.IsCommand() || mt.IsEvent() || mt.RequiresSession() {
			t.Errorf("%q is treated as known", mt)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(e *envelope.Envelope)
		typ    envelope.MessageType
		field  string // "" = valid
	}{
		{"valid task_submit", func(*envelope.Envelope) {}, envelope.TypeTaskSubmit, ""},
		{"valid event", func(*envelope.Envelope) {}, envelope.TypeEvent, ""},
		{"non-UTC location is fine", func(e *envelope.Envelope) { e.Timestamp = e.Timestamp.In(time.FixedZone("X", 3600)) }, envelope.TypeEvent, ""},
		{"payload with surrounding whitespace", func(e *envelope.Envelope) { e.Payload = json.RawMessage(" {\"a\": 1}\n") }, envelope.TypeEvent, ""},
		{"version empty", func(e *envelope.Envelope) { e.HCPVersion = "" }, envelope.TypeEvent, "hcp_version"},
		{"version malformed", func(e *envelope.Envelope) { e.HCPVersion = "1" }, envelope.TypeEvent, "hcp_version"},
		{"version unsupported", func(e *envelope.Envelope) { e.HCPVersion = "2.0" }, envelope.TypeEvent, "hcp_version"},
		{"message_id empty", func(e *envelope.Envelope) { e.MessageID = "" }, envelope.TypeEvent, "message_id"},
		{"message_id v1", func(e *envelope.Envelope) { e.MessageID = "550e8400-e29b-11d4-a716-446655440000" }, envelope.TypeEvent, "message_id"},
		{"timestamp zero", func(e *envelope.Envelope) { e.Timestamp = time.Time{} }, envelope.TypeEvent, "timestamp"},
		{"timestamp sub-millisecond (Encode truncates)", func(e *envelope.Envelope) { e.Timestamp = e.Timestamp.Add(time.Microsecond) }, envelope.TypeEvent, ""},
		{"timestamp before epoch", func(e *envelope.Envelope) { e.Timestamp = time.Unix(-1, 0) }, envelope.TypeEvent, "timestamp"},
		{"timestamp year 10000", func(e *envelope.Envelope) { e.Timestamp = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, envelope.TypeEvent, "timestamp"},
		{"type empty", func(e *envelope.Envelope) { e.Type = "" }, envelope.TypeEvent, "type"},
		{"type unknown", func(e *envelope.Envelope) { e.Type = "progress" }, envelope.TypeEvent, "type"},
		{"type with quote", func(e *envelope.Envelope) { e.Type = `event"` }, envelope.TypeEvent, "type"},
		{"session on task_submit", func(e *envelope.Envelope) { e.SessionID = ptr(sessID) }, envelope.TypeTaskSubmit, "session_id"},
		{"empty session pointer on task_submit", func(e *envelope.Envelope) { e.SessionID = ptr("") }, envelope.TypeTaskSubmit, "session_id"},
		{"no session on event", func(e *envelope.Envelope) { e.SessionID = nil }, envelope.TypeEvent, "session_id"},
		{"no session on abort", func(e *envelope.Envelope) { e.SessionID = nil }, envelope.TypeAbort, "session_id"},
		{"bad session", func(e *envelope.Envelope) { e.SessionID = ptr("x") }, envelope.TypeEvent, "session_id"},
		{"payload nil", func(e *envelope.Envelope) { e.Payload = nil }, envelope.TypeEvent, "payload"},
		{"payload null", func(e *envelope.Envelope) { e.Payload = json.RawMessage("null") }, envelope.TypeEvent, "payload"},
		{"payload array", func(e *envelope.Envelope) { e.Payload = json.RawMessage("[]") }, envelope.TypeEvent, "payload"},
		{"payload invalid JSON", func(e *envelope.Envelope) { e.Payload = json.RawMessage(`{"a":}`) }, envelope.TypeEvent, "payload"},
		{"payload two objects", func(e *envelope.Envelope) { e.Payload = json.RawMessage(`{}{}`) }, envelope.TypeEvent, "payload"},
		{"payload invalid UTF-8", func(e *envelope.Envelope) { e.Payload = json.RawMessage("{\"a\":\"\xff\"}") }, envelope.TypeEvent, "payload"},
		{"payload duplicate key", func(e *envelope.Envelope) { e.Payload = json.RawMessage(`{"a":1,"a":1}`) }, envelope.TypeEvent, "payload"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := validEnvelope(tt.typ)
			tt.mutate(e)
			err := e.Validate()
			_, encErr := envelope.Encode(e)
			if tt.field == "" {
				if err != nil || encErr != nil {
					t.Fatalf("Validate: %v, Encode: %v", err, encErr)
				}
				return
			}
			var fe *envelope.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Validate error %v (%T) is not a *FieldError", err, err)
			}
			if fe.Field != tt.field {
				t.Errorf("Field = %q, want %q (%v)", fe.Field, tt.field, err)
			}
			if !errors.As(encErr, &fe) || fe.Field != tt.field {
				t.Errorf("Encode error %v, want a FieldError for %s", encErr, tt.field)
			}
		})
	}
	var nilEnv *envelope.Envelope
	if nilEnv.Validate() == nil {
		t.Error("nil envelope validates")
	}
	if _, err := envelope.Encode(nil); err == nil {
		t.Error("Encode(nil) succeeded")
	}
}

func TestEncodeCanonical(t *testing.T) {
	e := validEnvelope(envelope.TypeTaskSubmit)
	e.Payload = json.RawMessage("\n {\"intent\": \"a<b & c>d\"} \t")
	got, err := envelope.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"hcp_version":"1.0","message_id":"550e8400-e29b-41d4-a716-446655440000","timestamp":"2025-01-15T08:30:00.000Z","session_id":null,"type":"task_submit","payload":{"intent": "a<b & c>d"}}`
	if string(got) != want {
		t.Errorf("Encode =\n%s\nwant\n%s", got, want)
	}

	e = validEnvelope(envelope.TypeEvent)
	e.Timestamp = time.Date(2025, 1, 15, 9, 30, 0, 123_000_000, time.FixedZone("CET", 3600))
	got, err = envelope.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	want = `{"hcp_version":"1.0","message_id":"550e8400-e29b-41d4-a716-446655440000","timestamp":"2025-01-15T08:30:00.123Z","session_id":"7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e","type":"event","payload":{}}`
	if string(got) != want {
		t.Errorf("Encode =\n%s\nwant\n%s", got, want)
	}
}

func TestJSONMarshalers(t *testing.T) {
	e := validEnvelope(envelope.TypeEvent)
	type wrapper struct {
		Env *envelope.Envelope `json:"env"`
	}
	b, err := json.Marshal(wrapper{e})
	if err != nil {
		t.Fatal(err)
	}
	var w wrapper
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	if !w.Env.Equal(e) {
		t.Errorf("round trip through encoding/json: %+v != %+v", w.Env, e)
	}
	bad := []byte(`{"env":` + string(obj(with(event, "extra", "1"))) + `}`)
	if err := json.Unmarshal(bad, &w); err == nil {
		t.Error("UnmarshalJSON accepted an unknown field")
	}
	if b, err := json.Marshal(*e); err != nil || !strings.HasPrefix(string(b), `{"hcp_version":"1.0",`) {
		t.Errorf("marshalling a value: %s, %v", b, err)
	}
	e.Type = "bogus"
	if _, err := json.Marshal(e); err == nil {
		t.Error("MarshalJSON accepted an invalid envelope")
	}
}

func TestNewAt(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 123_456_789, time.FixedZone("X", -7200))
	type payload struct {
		Intent string `json:"intent"`
		N      int    `json:"n"`
	}
	e, err := envelope.NewAt(now, envelope.TypeTaskSubmit, "", payload{"x<y>&z", 3})
	if err != nil {
		t.Fatal(err)
	}
	if e.HCPVersion != envelope.Version || !envelope.IsUUIDv4(e.MessageID) || e.SessionID != nil {
		t.Errorf("unexpected envelope %+v", e)
	}
	wantTS := time.Date(2025, 6, 1, 14, 0, 0, 123_000_000, time.UTC)
	if !reflect.DeepEqual(e.Timestamp, wantTS) {
		t.Errorf("Timestamp = %#v, want %#v (UTC, truncated, no monotonic reading)", e.Timestamp, wantTS)
	}
	if string(e.Payload) != `{"intent":"x<y>&z","n":3}` {
		t.Errorf("Payload = %s", e.Payload)
	}
	b, err := envelope.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	d, err := envelope.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d, e) {
		t.Errorf("Decode(Encode(NewAt(...))) = %#v, want %#v", d, e)
	}

	e2, err := envelope.NewAt(now, envelope.TypeTaskSubmit, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if e2.MessageID == e.MessageID {
		t.Error("two envelopes share a message id")
	}
	if string(e2.Payload) != "{}" {
		t.Errorf("nil payload = %s, want {}", e2.Payload)
	}

	raw := json.RawMessage(`{"a": 1}`)
	e3, err := envelope.NewAt(now, envelope.TypeEvent, sessID, raw)
	if err != nil {
		t.Fatal(err)
	}
	raw[2] = 'X'
	if e3.Session() != sessID || string(e3.Payload) != `{"a": 1}` {
		t.Errorf("got %+v (payload %s)", e3, e3.Payload)
	}
	m, err := envelope.NewAt(now, envelope.TypeEvent, sessID, map[string]any{"b": 1, "a": []int{1}})
	if err != nil || string(m.Payload) != `{"a":[1],"b":1}` {
		t.Errorf("map payload: %v %s", err, m.Payload)
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name    string
		typ     envelope.MessageType
		session string
		payload any
		field   string
	}{
		{"unknown type", "progress", sessID, nil, "type"},
		{"task_submit with session", envelope.TypeTaskSubmit, sessID, nil, "session_id"},
		{"abort without session", envelope.TypeAbort, "", nil, "session_id"},
		{"bad session", envelope.TypeEvent, "abc", nil, "session_id"},
		{"array payload", envelope.TypeEvent, sessID, []int{1}, "payload"},
		{"string payload", envelope.TypeEvent, sessID, "x", "payload"},
		{"bytes payload", envelope.TypeEvent, sessID, []byte("{}"), "payload"},
		{"unmarshalable payload", envelope.TypeEvent, sessID, map[string]any{"c": make(chan int)}, "payload"},
		{"invalid raw payload", envelope.TypeEvent, sessID, json.RawMessage(`{`), "payload"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := envelope.New(tt.typ, tt.session, tt.payload)
			var fe *envelope.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field {
				t.Fatalf("got %v, want a FieldError for %s", err, tt.field)
			}
		})
	}
}

func TestNewUsesCurrentTime(t *testing.T) {
	before := time.Now().Truncate(time.Millisecond)
	e, err := envelope.New(envelope.TypeTaskSubmit, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if e.Timestamp.Before(before) || e.Timestamp.After(time.Now()) {
		t.Errorf("timestamp %v not within the call", e.Timestamp)
	}
}

func TestIsUUIDv4(t *testing.T) {
	for _, s := range []string{msgID, sessID, strings.ToUpper(msgID), envelope.NewMessageID()} {
		if !envelope.IsUUIDv4(s) {
			t.Errorf("IsUUIDv4(%q) = false", s)
		}
	}
	for _, s := range []string{"", "550e8400-e29b-31d4-a716-446655440000", "550e8400-e29b-41d4-0716-446655440000", "550e8400_e29b-41d4-a716-446655440000", " 550e8400-e29b-41d4-a716-44665544000"} {
		if envelope.IsUUIDv4(s) {
			t.Errorf("IsUUIDv4(%q) = true", s)
		}
	}
}

func TestEqual(t *testing.T) {
	a, b := validEnvelope(envelope.TypeEvent), validEnvelope(envelope.TypeEvent)
	b.Timestamp = b.Timestamp.In(time.FixedZone("X", 60))
	if !a.Equal(b) {
		t.Error("same instant in another zone is not Equal")
	}
	b.SessionID = ptr(msgID)
	if a.Equal(b) {
		t.Error("different sessions are Equal")
	}
	b.SessionID = nil
	if a.Equal(b) || b.Equal(a) {
		t.Error("nil and non-nil session are Equal")
	}
	var n *envelope.Envelope
	if n.Equal(a) || !n.Equal(nil) {
		t.Error("nil handling")
	}
}
