package callee

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

type apiAnswer struct {
	status int
	body   map[string]any
}

func (b *bed) call(method, path, contentType, body string, hdr ...string) apiAnswer {
	b.t.Helper()
	req, err := http.NewRequestWithContext(b.t.Context(), method, "http://"+b.sc.cfg.APIAddr+path, strings.NewReader(body))
	must(b.t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	must(b.t, err)
	defer func() { _ = resp.Body.Close() }()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return apiAnswer{resp.StatusCode, m}
}

func errCode(a apiAnswer) string {
	e, _ := a.body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func TestHarnessAPI(t *testing.T) {
	b := newBed(t, bedOptions{})
	// The sample harness sleeps through its one long step: the test drives
	// the session through the API itself.
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":1,"step_ms":600000}`) }))
	b.waitMessage(sid, 20*time.Second, "state_changed", isEvent(session.EventStateChanged))
	base := "/hcp/v1/sessions/" + sid
	const js = "application/json"

	for _, c := range []struct {
		name, method, path, ct, body string
		status                       int
		code                         string
	}{
		{"unknown session", "POST", "/hcp/v1/sessions/" + envelope.NewMessageID() + "/events", js, `{"event_type":"log","data":{"level":"info","message":"x"}}`, 404, "not_found"},
		{"unknown endpoint", "POST", base + "/explode", js, `{}`, 404, "not_found"},
		{"lifecycle event from the harness", "POST", base + "/events", js, `{"event_type":"session_created","data":{}}`, 400, "bad_request"},
		{"unknown event type", "POST", base + "/events", js, `{"event_type":"telemetry","data":{}}`, 400, "bad_request"},
		{"invalid data", "POST", base + "/events", js, `{"event_type":"progress","data":{"stage":"x","percent":200}}`, 400, "bad_request"},
		{"not JSON", "POST", base + "/events", js, `{"event_type":`, 400, "bad_request"},
		{"wrong content type", "POST", base + "/events", "text/plain", `{"event_type":"log","data":{"level":"info","message":"x"}}`, 415, "unsupported_media_type"},
		{"too large", "POST", base + "/events", js, `{"event_type":"log","data":{"level":"info","message":"` + strings.Repeat("x", 9<<20) + `"}}`, 413, "too_large"},
		{"resume while running", "POST", base + "/resume", js, ``, 409, "invalid_transition"},
		{"aborted while running", "POST", base + "/aborted", js, ``, 409, "invalid_transition"},
		{"invalid task_failed", "POST", base + "/fail", js, `{"code":"","message":""}`, 400, "bad_request"},
	} {
		a := b.call(c.method, c.path, c.ct, c.body)
		if a.status != c.status || errCode(a) != c.code {
			t.Fatalf("%s: %d %v, want %d %s", c.name, a.status, a.body, c.status, c.code)
		}
	}
	if a := b.call("POST", base+"/resume", js, ``); a.body["error"].(map[string]any)["state"] != "RUNNING" {
		t.Fatalf("409 without the current state: %v", a.body)
	}
	// A batch gets consecutive sequence numbers; session_created and
	// state_changed were 1 and 2.
	a := b.call("POST", base+"/events", js, `[{"event_type":"progress","data":{"stage":"a","percent":10}},{"event_type":"log","data":{"level":"warn","message":"m","details":{"k":1}}},{"event_type":"intermediate_result","data":{"result_type":"t","data":[1,2],"is_partial":true}}]`)
	if a.status != 200 || fmt.Sprint(a.body["sequences"]) != "[3 4 5]" {
		t.Fatalf("batch: %d %v", a.status, a.body)
	}
	a = b.call("POST", base+"/events", js, `{"event_type":"warning","data":{"code":"w1","message":"careful"}}`, "Prefer", "respond-async")
	if a.status != 202 || a.body["sequence"] != float64(6) {
		t.Fatalf("async: %d %v", a.status, a.body)
	}
	if a = b.call("POST", base+"/checkpoint", js, `{"checkpoint_id":"c1","description":"half way","resumable":true}`); a.status != 200 || a.body["sequence"] != float64(7) {
		t.Fatalf("checkpoint: %d %v", a.status, a.body)
	}
	if a = b.call("POST", base+"/pause", js, `{"reason":"waiting for the oven"}`); a.status != 200 || a.body["state"] != "PAUSED" {
		t.Fatalf("pause: %d %v", a.status, a.body)
	}
	if a = b.call("POST", base+"/complete", js, `{}`); a.status != 409 {
		t.Fatalf("complete while paused: %d %v", a.status, a.body)
	}
	if a = b.call("POST", base+"/resume", js, ``); a.status != 200 || a.body["state"] != "RUNNING" {
		t.Fatalf("resume: %d %v", a.status, a.body)
	}
	if a = b.call("GET", base, "", ""); a.status != 200 || a.body["state"] != "RUNNING" || a.body["last_sequence"] != float64(9) {
		t.Fatalf("get: %d %v", a.status, a.body)
	}

	// An event the broker cannot route (the caller's queue lost its
	// binding) is an error for the harness, not a silent success.
	admin, err := amqp.Dial(b.broker.AMQPURI(b.broker.Username, b.broker.Password, b.vhost))
	must(t, err)
	defer func() { _ = admin.Close() }()
	ach, err := admin.Channel()
	must(t, err)
	must(t, ach.QueueUnbind("hcp.evt."+callerID, callerID+".#", "hcp.events", nil))
	a = b.call("POST", base+"/events", js, `{"event_type":"log","data":{"level":"info","message":"lost"}}`)
	if a.status != 502 || errCode(a) != "unroutable" {
		t.Fatalf("unroutable: %d %v", a.status, a.body)
	}
	must(t, ach.QueueBind("hcp.evt."+callerID, callerID+".#", "hcp.events", false, nil))

	a = b.call("POST", base+"/complete", js, `{"result":"done","artifacts":[{"uri":"s3://bucket/out.csv","sha256":"`+strings.Repeat("ab", 32)+`","media_type":"text/csv","size":42}]}`)
	if a.status != 200 || a.body["state"] != "COMPLETED" {
		t.Fatalf("complete: %d %v", a.status, a.body)
	}
	if a = b.call("POST", base+"/events", js, `{"event_type":"log","data":{"level":"info","message":"late"}}`); a.status != 409 || errCode(a) != "invalid_transition" {
		t.Fatalf("event after the end: %d %v", a.status, a.body)
	}
	hs := b.waitState(sid, v1alpha1.SessionCompleted, 5*time.Second)
	if hs.Status.Result == nil || hs.Status.Result.Summary != "done" || len(hs.Status.Result.Artifacts) != 1 || hs.Status.LastCheckpoint == nil || hs.Status.LastCheckpoint.ID != "c1" {
		t.Fatalf("status = %+v", hs.Status)
	}
	// Sequence 10 was used by the unroutable event: the caller sees a gap,
	// which L2 anticipates, never a reused number. (The status may be
	// written before the last events reach the test's consumer.)
	b.waitMessage(sid, 10*time.Second, "session_closed", isEvent(session.EventSessionClosed))
	evs := b.events(sid)
	seqs := make([]int64, 0, len(evs))
	for _, e := range evs {
		seqs = append(seqs, e.Sequence)
	}
	if !slices.Equal(seqs, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12}) { // 11: RUNNING → COMPLETED, 12: session_closed
		t.Fatalf("sequences %v", seqs)
	}
}
