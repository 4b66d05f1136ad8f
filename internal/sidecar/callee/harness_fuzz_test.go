package callee

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/clock"
)

// cannedHarness answers every request with one status and body, in
// process: the decoders see exactly the bytes the fuzzer chose.
type cannedHarness struct {
	status int
	body   []byte
}

func (h cannedHarness) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: h.status, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(h.body)),
		ContentLength: int64(len(h.body)), Request: req}, nil
}

// harnessSidecar is a sidecar that talks only to a harness answering
// status and body.
func harnessSidecar(status int, body []byte) *Sidecar {
	u, _ := url.Parse("http://127.0.0.1:8080")
	return &Sidecar{harness: u, http: &http.Client{Transport: cannedHarness{status, body}},
		t: Timeouts{HarnessTimeout: 5 * time.Second}, clk: clock.RealClock{}}
}

// httpStatus maps a fuzz integer to a status a harness could answer.
func httpStatus(n int) int {
	if n < 0 {
		n = -(n + 1)
	}
	return 200 + n%400
}

// FuzzHarnessResponses: the harness's answers to the task listing
// (GET /hcp/v1/tasks, read by the watchdog) and to a task or abort POST.
// Nothing panics; the listing is trusted only from a 200 whose body is an
// object with a tasks array, and then names exactly the session ids in it
// (checked against encoding/json on the whole body); the message kept of
// any answer is one bounded line.
func FuzzHarnessResponses(f *testing.F) {
	f.Add(200, []byte(`{"tasks":[{"session_id":"7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e","capability":"cvd.run-synthesis","state":"running"}]}`))
	f.Add(200, []byte(`{"tasks":[]}`))
	f.Add(200, []byte(`{"tasks":null}`))
	f.Add(404, []byte("404 page not found\n"))
	f.Add(202, []byte(`{"status":"accepted"}`))
	f.Add(409, []byte(`{"error":"session exists"}`))
	f.Add(503, []byte("upstream\tconnect\r\nerror "+strings.Repeat("x", 5000)))
	f.Add(200, []byte(`{"tasks":[{"session_id":1},{"session_id":"a"}]} trailing`))
	f.Fuzz(func(t *testing.T, code int, body []byte) {
		status := httpStatus(code)
		s := harnessSidecar(status, body)
		ctx := context.Background()

		known, listed, err := s.harnessSessions(ctx)
		if err != nil {
			t.Fatalf("harnessSessions: %v", err) // the harness answered: never "down"
		}
		if !listed && known != nil || listed && status != http.StatusOK {
			t.Fatalf("listed=%v known=%v from HTTP %d", listed, known, status)
		}
		var ref struct {
			Tasks []struct {
				SessionID string `json:"session_id"`
			} `json:"tasks"`
		}
		if status == http.StatusOK && json.Unmarshal(body, &ref) == nil {
			if listed != (ref.Tasks != nil) {
				t.Fatalf("listed=%v for %q", listed, body)
			}
			want := map[string]bool{}
			for _, x := range ref.Tasks {
				want[x.SessionID] = true
			}
			if listed && !reflect.DeepEqual(known, want) {
				t.Fatalf("known %v, want %v", known, want)
			}
		}

		got, msg, err := s.callHarness(ctx, "/hcp/v1/tasks", []byte(`{}`))
		if err != nil || got != status {
			t.Fatalf("callHarness: %d, %v", got, err)
		}
		if strings.ContainsAny(msg, "\n\r\t") || strings.TrimSpace(msg) != msg || len(msg) > 500+len("…") {
			t.Fatalf("message is not one bounded line: %q", msg)
		}
	})
}

// FuzzDrainAnswer: the harness's answer to a drain request (its
// checkpoint for the hand-over). askDrain never panics, takes an answer
// exactly when it is a 2xx whose body encoding/json decodes, and what it
// takes survives a round trip through JSON (the state as base64).
func FuzzDrainAnswer(f *testing.F) {
	f.Add(200, []byte(`{"checkpoint_id":"ckpt-8","description":"after step 8","state":"eyJzdGVwIjo4fQ=="}`))
	f.Add(200, []byte(`{"checkpoint_id":"","state":null}`))
	f.Add(204, []byte(``))
	f.Add(404, []byte(`{"error":"no drain endpoint"}`))
	f.Add(200, []byte(`{"checkpoint_id":"c","state":"not base64!"}`))
	f.Add(200, []byte(`{"checkpoint_id":7}`))
	f.Fuzz(func(t *testing.T, code int, body []byte) {
		status := httpStatus(code)
		a, ok := harnessSidecar(status, body).askDrain(context.Background(), "7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e")
		var ref drainAnswer
		want := status/100 == 2 && json.Unmarshal(body, &ref) == nil
		if ok != want {
			t.Fatalf("askDrain ok=%v for HTTP %d %q", ok, status, body)
		}
		if !ok {
			if !reflect.DeepEqual(a, drainAnswer{}) {
				t.Fatalf("a refused answer returned %+v", a)
			}
			return
		}
		if !reflect.DeepEqual(a, ref) {
			t.Fatalf("answer %+v, encoding/json says %+v", a, ref)
		}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		var back drainAnswer
		if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(a, back) {
			t.Fatalf("round trip %+v -> %s -> %+v (%v)", a, b, back, err)
		}
	})
}
