package session

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

func ptr[T any](v T) *T { return &v }

var ckptTime = task.NewTimestamp(time.Date(2025, 1, 15, 10, 0, 0, 0, time.UTC))

func validData() map[EventType]EventData {
	return map[EventType]EventData{
		EventSessionCreated:     &SessionCreatedData{State: StateRunning, RiskLevel: task.R2, SessionToken: "a.b.c"},
		EventStateChanged:       &StateChangedData{FromState: StateRunning, ToState: StatePaused, Reason: "checkpoint"},
		EventProgress:           &ProgressData{Stage: "heating", Percent: ptr(42.5), Message: "ramping to 1000C"},
		EventIntermediateResult: &IntermediateResultData{ResultType: "spectrum", Data: json.RawMessage(`{"peaks":[1,2]}`), IsPartial: true},
		EventLog:                &LogData{Level: LogWarn, Message: "pressure high", Details: json.RawMessage(`{"kpa":120}`)},
		EventWarning:            &WarningData{Code: "pressure_high", Message: "pressure high", Details: json.RawMessage(`"x"`)},
		EventError:              &ErrorData{Code: "sensor_dropout", Message: "sensor 3 lost", Recoverable: true},
		EventCheckpointCreated:  &CheckpointCreatedData{CheckpointID: "ckpt-001", Description: "phase 1 done", Resumable: true, CreatedAt: ckptTime},
		EventSessionClosed:      &SessionClosedData{FinalState: StateAborted, Reason: "caller abort"},
	}
}

func checkFields(t *testing.T, err error, want ...string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("no error, want failures of %v", want)
	}
	if !errors.Is(err, task.ErrInvalid) {
		t.Errorf("%v does not match task.ErrInvalid", err)
	}
	var ve *task.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("%T is not a *task.ValidationError: %v", err, err)
	}
	var got []string
	for _, f := range ve.Fields {
		got = append(got, f.Field)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("failed fields %v, want %v (%v)", got, want, err)
	}
}

func TestEventTypes(t *testing.T) {
	want := []string{"session_created", "state_changed", "progress", "intermediate_result", "log",
		"warning", "error", "checkpoint_created", "session_closed"}
	got := EventTypes()
	if len(got) != len(want) {
		t.Fatalf("EventTypes() = %v", got)
	}
	harness := map[EventType]bool{EventProgress: true, EventIntermediateResult: true, EventLog: true, EventWarning: true, EventError: true}
	for i, et := range got {
		if string(et) != want[i] {
			t.Errorf("EventTypes()[%d] = %s", i, et)
		}
		if p, err := ParseEventType(want[i]); err != nil || p != et {
			t.Errorf("ParseEventType(%q) = %q, %v", want[i], p, err)
		}
		if et.HarnessEmittable() != harness[et] {
			t.Errorf("%s.HarnessEmittable() = %v", et, et.HarnessEmittable())
		}
		d := newData(et)
		if d == nil || d.EventType() != et {
			t.Errorf("newData(%s) = %T", et, d)
		}
	}
	for _, bad := range []string{"", "Progress", "custom", "heartbeat"} {
		if _, err := ParseEventType(bad); err == nil {
			t.Errorf("ParseEventType(%q) succeeded", bad)
		}
		if EventType(bad).HarnessEmittable() {
			t.Errorf("%q harness-emittable", bad)
		}
	}
}

func TestEventDataValidate(t *testing.T) {
	cases := []struct {
		name   string
		d      EventData
		fields []string
	}{
		// session_created
		{"session_created ok pending", &SessionCreatedData{State: StatePending, RiskLevel: task.R1, SessionToken: "t"}, nil},
		{"session_created no state", &SessionCreatedData{RiskLevel: task.R1, SessionToken: "t"}, []string{"state"}},
		{"session_created bad state", &SessionCreatedData{State: "GO", RiskLevel: task.R1, SessionToken: "t"}, []string{"state"}},
		{"session_created terminal", &SessionCreatedData{State: StateCompleted, RiskLevel: task.R1, SessionToken: "t"}, []string{"state"}},
		{"session_created no risk", &SessionCreatedData{State: StateRunning, SessionToken: "t"}, []string{"risk_level"}},
		{"session_created bad risk", &SessionCreatedData{State: StateRunning, RiskLevel: "R7", SessionToken: "t"}, []string{"risk_level"}},
		{"session_created no token", &SessionCreatedData{State: StateRunning, RiskLevel: task.R1}, []string{"session_token"}},
		// state_changed
		{"state_changed every edge", nil, nil},
		{"state_changed no reason ok", &StateChangedData{FromState: StatePending, ToState: StateRunning}, nil},
		{"state_changed recovery", &StateChangedData{FromState: StateRunning, ToState: StateRunning, Reason: ReasonRecoveredFromCheckpoint}, nil},
		{"state_changed same no reason", &StateChangedData{FromState: StateRunning, ToState: StateRunning}, []string{"reason"}},
		{"state_changed same terminal", &StateChangedData{FromState: StateFailed, ToState: StateFailed, Reason: "x"}, []string{"to_state"}},
		{"state_changed reopen", &StateChangedData{FromState: StateCompleted, ToState: StateRunning}, []string{"to_state"}},
		{"state_changed paused failed", &StateChangedData{FromState: StatePaused, ToState: StateFailed, Reason: ReasonTimeout}, []string{"to_state"}},
		{"state_changed missing both", &StateChangedData{}, []string{"from_state", "to_state"}},
		{"state_changed unknown", &StateChangedData{FromState: "X", ToState: StateRunning}, []string{"from_state"}},
		// progress
		{"progress minimal", &ProgressData{Stage: "s"}, nil},
		{"progress 0 and 100", &ProgressData{Stage: "s", Percent: ptr(100.0)}, nil},
		{"progress zero", &ProgressData{Stage: "s", Percent: ptr(0.0)}, nil},
		{"progress no stage", &ProgressData{Message: "m"}, []string{"stage"}},
		{"progress negative", &ProgressData{Stage: "s", Percent: ptr(-0.1)}, []string{"percent"}},
		{"progress over 100", &ProgressData{Stage: "s", Percent: ptr(100.5)}, []string{"percent"}},
		// intermediate_result
		{"intermediate scalar", &IntermediateResultData{ResultType: "count", Data: json.RawMessage(`3`)}, nil},
		{"intermediate no type", &IntermediateResultData{Data: json.RawMessage(`3`)}, []string{"result_type"}},
		{"intermediate no data", &IntermediateResultData{ResultType: "x"}, []string{"data"}},
		{"intermediate null data", &IntermediateResultData{ResultType: "x", Data: json.RawMessage(`null`)}, []string{"data"}},
		{"intermediate bad data", &IntermediateResultData{ResultType: "x", Data: json.RawMessage(`{`)}, []string{"data"}},
		// log
		{"log info", &LogData{Level: LogInfo, Message: "m"}, nil},
		{"log error", &LogData{Level: LogError, Message: "m"}, nil},
		{"log no level", &LogData{Message: "m"}, []string{"level"}},
		{"log debug", &LogData{Level: "debug", Message: "m"}, []string{"level"}},
		{"log warning spelled out", &LogData{Level: "warning", Message: "m"}, []string{"level"}},
		{"log no message", &LogData{Level: LogInfo}, []string{"message"}},
		{"log bad details", &LogData{Level: LogInfo, Message: "m", Details: json.RawMessage(`{x`)}, []string{"details"}},
		// warning
		{"warning no details", &WarningData{Code: "c", Message: "m"}, nil},
		{"warning no code", &WarningData{Message: "m"}, []string{"code"}},
		{"warning bad code", &WarningData{Code: "has space", Message: "m"}, []string{"code"}},
		{"warning no message", &WarningData{Code: "c"}, []string{"message"}},
		{"warning bad details", &WarningData{Code: "c", Message: "m", Details: json.RawMessage(`[`)}, []string{"details"}},
		// error
		{"error no code", &ErrorData{Message: "m"}, []string{"code"}},
		{"error bad code", &ErrorData{Code: strings.Repeat("x", 129), Message: "m"}, []string{"code"}},
		{"error no message", &ErrorData{Code: "c"}, []string{"message"}},
		// checkpoint_created
		{"checkpoint no description", &CheckpointCreatedData{CheckpointID: "c", CreatedAt: ckptTime}, nil},
		{"checkpoint no id", &CheckpointCreatedData{CreatedAt: ckptTime}, []string{"checkpoint_id"}},
		{"checkpoint long id", &CheckpointCreatedData{CheckpointID: strings.Repeat("c", 254), CreatedAt: ckptTime}, []string{"checkpoint_id"}},
		{"checkpoint no time", &CheckpointCreatedData{CheckpointID: "c"}, []string{"created_at"}},
		// session_closed
		{"closed every terminal", nil, nil},
		{"closed no state", &SessionClosedData{}, []string{"final_state"}},
		{"closed non-terminal", &SessionClosedData{FinalState: StateAborting}, []string{"final_state"}},
		{"closed unknown", &SessionClosedData{FinalState: "DONE"}, []string{"final_state"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.d == nil {
				return // covered below
			}
			checkFields(t, tc.d.Validate(), tc.fields...)
		})
	}
	for _, e := range Transitions() {
		checkFields(t, (&StateChangedData{FromState: e.From, ToState: e.To}).Validate())
	}
	for _, s := range States() {
		err := (&SessionClosedData{FinalState: s}).Validate()
		if s.IsTerminal() {
			checkFields(t, err)
		} else {
			checkFields(t, err, "final_state")
		}
	}
	for typ, d := range validData() {
		if err := d.Validate(); err != nil {
			t.Errorf("valid %s data: %v", typ, err)
		}
	}
}

func TestEventPayloadValidate(t *testing.T) {
	cases := []struct {
		name   string
		p      EventPayload
		fields []string
	}{
		{"ok", EventPayload{EventProgress, 1, json.RawMessage(`{"stage":"s"}`)}, nil},
		{"unknown fields ignored", EventPayload{EventProgress, 7, json.RawMessage(`{"stage":"s","eta":"PT1M"}`)}, nil},
		{"spec checkpoint example", EventPayload{EventCheckpointCreated, 100, json.RawMessage(`{
			"checkpoint_id": "ckpt-001",
			"description": "Completed phase 1: material preparation",
			"resumable": true,
			"created_at": "2025-01-15T10:00:00.000Z"}`)}, nil},
		{"no type", EventPayload{"", 1, json.RawMessage(`{}`)}, []string{"event_type"}},
		{"custom type", EventPayload{"heartbeat", 1, json.RawMessage(`{}`)}, []string{"event_type"}},
		{"sequence zero", EventPayload{EventProgress, 0, json.RawMessage(`{"stage":"s"}`)}, []string{"sequence"}},
		{"sequence negative", EventPayload{EventProgress, -3, json.RawMessage(`{"stage":"s"}`)}, []string{"sequence"}},
		{"no data", EventPayload{EventProgress, 1, nil}, []string{"data"}},
		{"null data", EventPayload{EventProgress, 1, json.RawMessage(`null`)}, []string{"data"}},
		{"array data", EventPayload{EventProgress, 1, json.RawMessage(`[]`)}, []string{"data"}},
		{"invalid data", EventPayload{EventProgress, 1, json.RawMessage(`{"stage":`)}, []string{"data"}},
		{"data fails validation", EventPayload{EventProgress, 1, json.RawMessage(`{"percent":120}`)}, []string{"data.stage", "data.percent"}},
		{"data wrong type", EventPayload{EventProgress, 1, json.RawMessage(`{"stage":"s","percent":"half"}`)}, []string{"data.percent"}},
		{"data wrong bool", EventPayload{EventError, 1, json.RawMessage(`{"code":"c","message":"m","recoverable":"yes"}`)}, []string{"data.recoverable"}},
		{"bad created_at", EventPayload{EventCheckpointCreated, 1, json.RawMessage(`{"checkpoint_id":"c","created_at":"yesterday"}`)}, []string{"data.created_at"}},
		{"non-UTC created_at", EventPayload{EventCheckpointCreated, 1, json.RawMessage(`{"checkpoint_id":"c","created_at":"2025-01-15T10:00:00+01:00"}`)}, []string{"data.created_at"}},
		{"everything wrong", EventPayload{}, []string{"sequence", "event_type", "data"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkFields(t, tc.p.Validate(), tc.fields...)
		})
	}
}

// TestEventPayloadDataErrors: the data is scanned once (by the decode), and
// the error still says what is wrong with it.
func TestEventPayloadDataErrors(t *testing.T) {
	for raw, want := range map[string]string{
		`{"stage":`:   "not valid JSON",
		`[1,`:         "not valid JSON",
		`[1]`:         "must be a JSON object",
		`"progress"`:  "must be a JSON object",
		`{"stage":1}`: "must be a JSON string",
	} {
		for _, et := range []EventType{EventProgress, "heartbeat"} {
			err := (&EventPayload{EventType: et, Sequence: 1, Data: json.RawMessage(raw)}).Validate()
			if et == "heartbeat" && want == "must be a JSON string" {
				want = "" // an unknown type's data is only checked as JSON
			}
			if err == nil || (want != "" && !strings.Contains(err.Error(), want)) || (want == "" && strings.Contains(err.Error(), "data")) {
				t.Errorf("%s data %s: %v, want %q", et, raw, err, want)
			}
		}
	}
}

func TestEventRoundTrip(t *testing.T) {
	for typ, d := range validData() {
		t.Run(string(typ), func(t *testing.T) {
			p, err := NewEvent(42, d)
			if err != nil {
				t.Fatal(err)
			}
			b, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			var back EventPayload
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if back.EventType != typ || back.Sequence != 42 {
				t.Fatalf("decoded %+v", back)
			}
			got, err := back.Decode()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, d) {
				t.Fatalf("round trip:\n got %#v\nwant %#v\njson %s", got, d, b)
			}
		})
	}
}

func TestEventWireNames(t *testing.T) {
	want := map[EventType][]string{
		EventSessionCreated:     {"risk_level", "session_token", "state"},
		EventStateChanged:       {"from_state", "reason", "to_state"},
		EventProgress:           {"message", "percent", "stage"},
		EventIntermediateResult: {"data", "is_partial", "result_type"},
		EventLog:                {"details", "level", "message"},
		EventWarning:            {"code", "details", "message"},
		EventError:              {"code", "message", "recoverable"},
		EventCheckpointCreated:  {"checkpoint_id", "created_at", "description", "resumable"},
		EventSessionClosed:      {"final_state", "reason"},
	}
	for typ, d := range validData() {
		b, _ := json.Marshal(d)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, want[typ]) {
			t.Errorf("%s keys %v, want %v", typ, keys, want[typ])
		}
	}
	p, _ := NewEvent(1, &ProgressData{Stage: "s"})
	if b, _ := json.Marshal(p); string(b) != `{"event_type":"progress","sequence":1,"data":{"stage":"s","message":""}}` {
		t.Errorf("payload = %s", b)
	}
}

func TestNewEventRejects(t *testing.T) {
	if _, err := NewEvent(0, &ProgressData{Stage: "s"}); err == nil {
		t.Error("sequence 0 accepted")
	}
	_, err := NewEvent(1, &ProgressData{})
	checkFields(t, err, "data.stage")
	if _, err := NewEvent(1, nil); err == nil {
		t.Error("nil data accepted")
	}
}

// TestEventPayloadAppendJSON: the hand-built payload is byte for byte what
// the envelope's encoder (encoding/json without HTML escaping) writes, for
// compact data as the publisher has it.
func TestEventPayloadAppendJSON(t *testing.T) {
	for _, p := range []EventPayload{
		{EventProgress, 1, json.RawMessage(`{"stage":"s","percent":50,"message":"<a & b>"}`)},
		{EventLog, 1 << 62, json.RawMessage(`{"level":"info","message":"é\u2028"}`)},
		{"not \"a\" type", 7, json.RawMessage(`{}`)},
		{EventError, 3, nil},
	} {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(p); err != nil {
			t.Fatal(err)
		}
		want := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		if got := p.AppendJSON([]byte("x")); string(got) != "x"+string(want) {
			t.Errorf("AppendJSON %s, json.Marshal %s", got[1:], want)
		}
	}
}
