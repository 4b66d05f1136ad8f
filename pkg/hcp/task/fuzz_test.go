package task

import (
	"encoding/json"
	"testing"
)

// FuzzPayloads decodes arbitrary bytes as each L3/L4 payload type: decoding
// and validation never panic, and every payload that validates survives a
// round trip (marshal, unmarshal) still valid.
func FuzzPayloads(f *testing.F) {
	for _, s := range []string{
		`{"caller_id":"alpha","callee_id":"lab","capability":"analyze","intent":"x","inputs":{},"constraints":{"data_classification":"T1","max_risk_level":"R2","max_duration":"PT1H","deadline":"2030-01-01T00:00:00.000Z"},"expires_at":"2030-01-01T00:00:00Z","metadata":{"risk_level":"R3"}}`,
		`{"caller_id":"alpha","callee_id":"lab","capability":"a.b","intent":"","inputs":[1,2],"constraints":{}}`,
		`{"task_message_id":"550e8400-e29b-41d4-a716-446655440000","session_id":"9edda22a-ab3f-4e16-abb0-f7dc8c5bd281","session_token":"a.b.c","risk_level":"R1","expires_at":"2030-01-01T00:00:00.000Z"}`,
		`{"task_message_id":"550e8400-e29b-41d4-a716-446655440000","reason_code":"not_authorized","message":"no"}`,
		`{"result":{"k":[1,2,3]},"artifacts":[{"uri":"s3://b/k","media_type":"text/csv"}],"summary":"done"}`,
		`{"code":"instrument_fault","message":"m","recoverable":true}`,
		`{"session_token":"a.b.c","reason":"stop"}`,
		`{"constraints":{"max_duration":"P1Y2M"}}`,
		`{"constraints":{"deadline":"2030-02-30T25:00:00Z"}}`,
		`null`, `[]`, `{"inputs":"\u0000"}`,
	} {
		f.Add([]byte(s))
	}
	type payload interface{ Validate() error }
	kinds := []func() payload{
		func() payload { return &TaskSubmit{} },
		func() payload { return &TaskAccepted{} },
		func() payload { return &TaskRejected{} },
		func() payload { return &TaskCompleted{} },
		func() payload { return &TaskFailed{} },
		func() payload { return &Abort{} },
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, k := range kinds {
			p := k()
			if json.Unmarshal(b, p) != nil || p.Validate() != nil {
				continue
			}
			out, err := json.Marshal(p)
			if err != nil {
				t.Fatalf("%T validated but does not marshal: %v", p, err)
			}
			again := k()
			if err := json.Unmarshal(out, again); err != nil {
				t.Fatalf("%T: its own encoding does not decode: %v\n%s", p, err, out)
			}
			if err := again.Validate(); err != nil {
				t.Fatalf("%T: valid, but not after a round trip: %v\n%s", p, err, out)
			}
		}
	})
}
