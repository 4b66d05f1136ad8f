package callee

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// FuzzHarnessRequests feeds arbitrary bodies to the decoders of the
// harness API (events, single and batched; pause/resume/aborted reasons;
// complete; fail): none panics, and every event accepted is one the
// sidecar can publish (its data decodes as its type's).
func FuzzHarnessRequests(f *testing.F) {
	for _, s := range []string{
		`{"event_type":"progress","data":{"stage":"s","percent":50,"message":"m"},"idempotency_key":"k1"}`,
		`[{"event_type":"log","data":{"level":"info","message":"m"}},{"event_type":"warning","data":{"code":"c","message":"m"}}]`,
		`{"event_type":"intermediate_result","data":{"result_type":"t","data":{"x":[1,2]},"is_partial":false}}`,
		`{"event_type":"session_closed","data":{"final_state":"COMPLETED"}}`,
		`{"event_type":"progress","data":{"percent":101}}`,
		`[]`, `[{}]`, `{"reason":"operator"}`, `{"result":{"ok":true},"summary":"s"}`,
		`{"code":"instrument_fault","message":"m","recoverable":false}`,
		`{"event_type":"progress","data":{},"extra":1}`, `  [ {"event_type":"error","data":{"code":"c","message":"m","recoverable":true}} ]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if evs, _, err := parseEvents(b); err == nil {
			if len(evs) == 0 || len(evs) > maxBatchSize {
				t.Fatalf("parseEvents accepted %d events", len(evs))
			}
			for _, ev := range evs {
				p := session.EventPayload{EventType: ev.EventType, Sequence: 1, Data: ev.Data}
				if _, err := p.Decode(); err != nil || !ev.EventType.HarnessEmittable() {
					t.Fatalf("accepted event %s does not decode: %v", ev.EventType, err)
				}
			}
		}
		decode := func(v any) {
			r := httptest.NewRequest("POST", "/", bytes.NewReader(b))
			r.Header.Set("Content-Type", "application/json")
			_ = server.DecodeJSON(r, 64<<10, true, v)
		}
		decode(&reasonBody{})
		var tc task.TaskCompleted
		decode(&tc)
		_ = tc.Validate()
		var tf task.TaskFailed
		decode(&tf)
		_ = tf.Validate()
	})
}
