package caller

import (
	"bytes"
	"net/http/httptest"
	"testing"
)

// FuzzSubmitRequest feeds arbitrary bodies to POST /hcp/v1/tasks's decoder
// and validation: nothing panics, and a request that passes is a valid
// task_submit of this caller.
func FuzzSubmitRequest(f *testing.F) {
	for _, s := range []string{
		`{"callee_id":"lab","capability":"analyze","intent":"x","inputs":{"steps":3},"constraints":{"data_classification":"T1"}}`,
		`{"message_id":"550e8400-e29b-41d4-a716-446655440000","callee_id":"lab","capability":"a","intent":"","constraints":{"max_duration":"PT5M","deadline":"2030-01-01T00:00:00Z"},"metadata":{"risk_level":"R2"}}`,
		`{"callee_id":"Lab!","capability":"bad capability","constraints":{"data_classification":"T9"}}`,
		`{"callee_id":"lab","capabilty":"typo"}`, `{}`, `[]`, `{"inputs":1e999}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req SubmitRequest
		if decodeBody(httptest.NewRequest("POST", "/hcp/v1/tasks", bytes.NewReader(b)), &req, false) != nil {
			return
		}
		p, aerr := req.task("alpha")
		if aerr != nil {
			if aerr.status != 400 {
				t.Fatalf("refused with %d", aerr.status)
			}
			return
		}
		if err := p.Validate(); err != nil || p.CallerID != "alpha" {
			t.Fatalf("accepted an invalid task (caller %q): %v", p.CallerID, err)
		}
	})
}
