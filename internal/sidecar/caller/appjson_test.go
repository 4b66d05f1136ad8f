package caller

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestAppJSON: the hand-built bodies are what json.Marshal writes, byte for
// byte when payload and data are compact and free of HTML characters, and
// the same JSON values when they are not (the callee's whitespace and
// characters kept).
func TestAppJSON(t *testing.T) {
	full := AppMessage{
		SessionID: "5f0c5a3e-2b7e-4c1a-9d3e-6f1a2b3c4d5e", MessageID: "0b7a6c1d-8e9f-4a2b-b3c4-d5e6f7a8b9c0",
		Type: "event", Timestamp: "2026-11-27T01:02:03.456Z", CalleeID: "lab-cvd", TaskMessageID: "7c6b5a4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d",
		Sequence: 42, EventType: "progress", Data: json.RawMessage(`{"stage":"s","percent":50}`),
		Payload:     json.RawMessage(`{"event_type":"progress","sequence":42,"data":{"stage":"s","percent":50}}`),
		Redelivered: true, Lost: &Lost{From: 3, To: 9, Reason: LostGapTimeout},
		Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "vendor=x",
	}
	bare := AppMessage{SessionID: "s", MessageID: "m", Type: "task_accepted", Payload: json.RawMessage(`{}`)}
	odd := AppMessage{SessionID: "s", MessageID: "m\"\\\u00e9\x01<&>", Type: "event", CalleeID: "\xff",
		Data: json.RawMessage(`{ "message": "a <b> & c" }`), Payload: json.RawMessage(`{"data": { "message": "a <b> & c" }}`)}

	for name, m := range map[string]AppMessage{"full": full, "bare": bare, "no payload": {SessionID: "s"}} {
		want, _ := json.Marshal(m)
		if got := m.AppendJSON(nil); string(got) != string(want) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
		batch := AppBatch{SessionID: m.SessionID, Messages: []AppMessage{m, bare}}
		want, _ = json.Marshal(batch)
		if got := batch.AppendJSON(nil); string(got) != string(want) {
			t.Errorf("%s batch:\n got %s\nwant %s", name, got, want)
		}
	}
	for name, v := range map[string]any{"odd": &odd, "odd batch": &AppBatch{SessionID: "s", Messages: []AppMessage{odd, full}}, "nil batch": &AppBatch{}} {
		var got []byte
		switch v := v.(type) {
		case *AppMessage:
			got = v.AppendJSON(nil)
		case *AppBatch:
			got = v.AppendJSON(nil)
		}
		want, _ := json.Marshal(v)
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%s: %s is not JSON: %v", name, got, err)
		}
		_ = json.Unmarshal(want, &w)
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
}
