package samplecallee

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
)

// fakeSidecar answers the harness's calls: 409 to the refused one
// ("action", or "events:<event_type>"), 503 to the first checkpoint when
// flaky, 200 to the rest; it notes the calls it got.
type fakeSidecar struct {
	refuse string
	flaky  bool

	mu    sync.Mutex
	calls []string
}

func (f *fakeSidecar) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	action := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	body, _ := io.ReadAll(r.Body)
	if action == "events" {
		var ev struct {
			EventType string `json:"event_type"`
		}
		_ = json.Unmarshal(body, &ev)
		action += ":" + ev.EventType
	}
	f.mu.Lock()
	f.calls = append(f.calls, action)
	n := 0
	for _, c := range f.calls {
		if c == action {
			n++
		}
	}
	f.mu.Unlock()
	switch {
	case action == f.refuse:
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"error":{"code":"invalid_transition","message":"refused by the test"}}`)
	case f.flaky && action == "checkpoint" && n == 1:
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"code":"fenced","message":"not now"}}`)
	default:
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{}`)
	}
}

func (f *fakeSidecar) saw(action string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.calls {
		if c == action {
			return true
		}
	}
	return false
}

// syncBuffer is a log sink the task goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) line(prefix, args string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.WriteString(prefix + " " + args + "\n")
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Every way a run ends is in the harness's log, with the sidecar's answer
// when the sidecar refused a call: a user reading the log sees why a task
// stopped.
func TestEveryEndOfARunIsLogged(t *testing.T) {
	const long = `{"steps":1000,"step_ms":5}`
	for _, c := range []struct {
		name, inputs, refuse, stop string
		flaky                      bool
		want                       []string
	}{
		{name: "progress refused", inputs: `{"steps":3,"step_ms":1}`, refuse: "events:progress", want: []string{"Stopped: the sidecar refused an event", "HTTP 409"}},
		{name: "log refused", inputs: `{"steps":3,"step_ms":1,"log_every":1}`, refuse: "events:log", want: []string{"Stopped: the sidecar refused a log event", "HTTP 409"}},
		{name: "checkpoint refused", inputs: `{"steps":3,"step_ms":1,"checkpoint_every":1}`, refuse: "checkpoint", want: []string{"Stopped: the sidecar refused a checkpoint", "HTTP 409"}},
		{name: "pause refused", inputs: `{"steps":3,"step_ms":1,"pause_at":1}`, refuse: "pause", want: []string{"Stopped: the sidecar refused the pause", "HTTP 409"}},
		{name: "resume refused", inputs: `{"steps":3,"step_ms":1,"pause_at":1,"pause_ms":1}`, refuse: "resume", want: []string{"Stopped: the sidecar refused the resume", "HTTP 409"}},
		{name: "failed", inputs: `{"steps":3,"step_ms":1,"fail_at":2}`, want: []string{"Stopped: failed as asked (fail_at)", `"step"=2`}},
		{name: "failure refused", inputs: `{"steps":3,"step_ms":1,"fail_at":2}`, refuse: "fail", want: []string{"Stopped: failed as asked (fail_at); the sidecar refused the failure", "HTTP 409"}},
		{name: "completion refused", inputs: `{"steps":2,"step_ms":1}`, refuse: "complete", want: []string{"Stopped: the sidecar refused the completion", "HTTP 409"}},
		{name: "completed", inputs: `{"steps":2,"step_ms":1,"checkpoint_every":1}`, flaky: true,
			want: []string{"Completed task", `"Retrying a call to the sidecar" "session"="s1" "action"="checkpoint" "attempt"=1 "error"="HTTP 503`}},
		{name: "moved away", inputs: long, stop: OwnershipLost, want: []string{"Stopped: the session moved to another replica (ownership_lost)"}},
		{name: "aborted", inputs: long, stop: "user_abort", want: []string{`"Aborting task"`, `"reason"="user_abort"`, "Stopped: aborted; cleanup finished and reported"}},
		{name: "abort end refused", inputs: long, stop: "user_abort", refuse: "aborted", want: []string{"Stopped: aborted; the sidecar refused the end of the cleanup", "HTTP 409"}},
		{name: "drained", inputs: long, stop: "drain", want: []string{"Stopped: handed over at a drain"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fake := &fakeSidecar{refuse: c.refuse, flaky: c.flaky}
			sc := httptest.NewServer(fake)
			defer sc.Close()
			var logs syncBuffer
			h := New(sc.URL, funcr.New(logs.line, funcr.Options{}))
			hs := httptest.NewServer(h.Handler())
			defer hs.Close()
			post := func(path, body string) {
				t.Helper()
				resp, err := http.Post(hs.URL+path, "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				if resp.StatusCode/100 != 2 {
					t.Fatalf("POST %s: %d", path, resp.StatusCode)
				}
			}
			post("/hcp/v1/tasks", `{"session_id":"s1","capability":"analyze","inputs":`+c.inputs+`}`)
			if c.stop != "" {
				waitFor(t, func() bool { return fake.saw("events:progress") })
				if c.stop == "drain" {
					post("/hcp/v1/sessions/s1/drain", `{}`)
				} else {
					post("/hcp/v1/sessions/s1/abort", `{"reason":"`+c.stop+`"}`)
				}
			}
			waitFor(t, func() bool { _, running := h.Starts("s1"); return !running })
			got := logs.String()
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Fatalf("the log has no %q:\n%s", w, got)
				}
			}
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}
