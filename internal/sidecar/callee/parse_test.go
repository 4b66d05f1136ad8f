package callee

import (
	"strings"
	"testing"

	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// TestParseEvents: a body is decoded in one pass, and what is wrong with a
// bad one is still named: the event at fault in a batch, unknown fields,
// trailing data. An accepted event carries its decoded data (the status's
// progress) and its data as sent (the envelope's).
func TestParseEvents(t *testing.T) {
	evs, batch, err := parseEvents([]byte(` [ {"event_type":"progress","data":{ "stage" : "a", "percent": 10 }},
		{"event_type":"log","data":{"level":"info","message":"m"},"idempotency_key":"k"} ] `))
	if err != nil || !batch || len(evs) != 2 {
		t.Fatalf("batch: %v %v %d", err, batch, len(evs))
	}
	if p, ok := evs[0].decoded.(*session.ProgressData); !ok || p.Stage != "a" || *p.Percent != 10 {
		t.Errorf("progress decoded as %#v", evs[0].decoded)
	}
	if string(evs[0].Data) != `{ "stage" : "a", "percent": 10 }` || evs[1].IdempotencyKey != "k" {
		t.Errorf("data %s, key %q", evs[0].Data, evs[1].IdempotencyKey)
	}
	if evs, batch, err := parseEvents([]byte(`{"event_type":"warning","data":{"code":"c","message":"m"}}`)); err != nil || batch || len(evs) != 1 || evs[0].EventType != session.EventWarning {
		t.Errorf("single: %v %v %v", evs, batch, err)
	}
	for body, want := range map[string]string{
		`[{"event_type":"log","data":{"level":"info","message":"m"}},{"event_type":"log","data":{},"extra":1}]`:       `event [1]: want {"event_type": ..., "data": {...}}: json: unknown field "extra"`,
		`[{"event_type":"log","data":{"level":"info","message":"m"}},{"event_type":"progress","data":{"percent":7}}]`: "event [1]: ",
		`[{"event_type":"log","data":{"level":"info","message":"m"}},{"event_type":"session_closed","data":{}}]`:      "event [1]: event_type session_closed is the sidecar's",
		`[{"event_type":"log","data":{"level":"info","message":"m"}}`:                                                 "invalid batch: ",
		`[]`: "a batch holds 1 to 1000 events, got 0",
		`[` + strings.Repeat(`{"event_type":"log","data":{"level":"info","message":"m"}},`, 1000) + `{"event_type":"log","data":{"level":"info","message":"m"}}]`: "a batch holds 1 to 1000 events, got 1001",
		`{"event_type":"log","data":{"level":"info","message":"m"}} {}`:                                                                                           "trailing data after the JSON value",
		`[{"event_type":"log","data":{"level":"info","message":"m"}}] ]`:                                                                                          "trailing data after the JSON value",
		`{"event_type":"log","data":{"level":"info","message":"m"},"x":1}`:                                                                                        `json: unknown field "x"`,
		`{"event_type":"telemetry","data":{}}`:                                                                                                                    `unknown event_type "telemetry"`,
		`{"event_type":"progress","data":{"stage":"s","percent":"x"}}`:                                                                                            "data.percent",
	} {
		_, _, err := parseEvents([]byte(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.80s: %v, want %q", body, err, want)
		}
	}
}

// TestParseEventRefusesDataTheEnvelopeRefuses: data with a duplicate key
// (at any depth) or invalid UTF-8 is the harness's 400, named, at parse
// time: it used to pass the parse and fail at the envelope's validation,
// after the event had taken a sequence (a 503 and a hole in the
// session's sequence).
func TestParseEventRefusesDataTheEnvelopeRefuses(t *testing.T) {
	for line, want := range map[string]string{
		`{"event_type":"progress","data":{"stage":"a","stage":"b"}}`:                         `invalid event: data: duplicate key "stage"`,
		`{"event_type":"log","data":{"level":"info","message":"m","details":{"x":1,"x":2}}}`: `invalid event: data: duplicate key "x"`,
		"{\"event_type\":\"log\",\"data\":{\"level\":\"info\",\"message\":\"\xff\"}}":        "invalid event: data: not valid UTF-8",
	} {
		if _, err := parseEvent([]byte(line)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", line, err, want)
		}
		body := "[" + line + "]"
		if _, _, err := parseEvents([]byte(body)); err == nil || !strings.Contains(err.Error(), "event [0]: "+want) {
			t.Errorf("batch %s: %v, want %q", body, err, want)
		}
	}
}
