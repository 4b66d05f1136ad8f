package caller

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestRejectedAndAbort: a rejection reaches the app and the task view; an
// abort carries the session token to the session's callee.
func TestRejectedAndAbort(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	c := b.callee("lab")

	rej := r.submit(t, taskReq("lab"))
	sid := topology.SessionID("lab", "alpha", rej.MessageID)
	env, err := envelope.New(envelope.TypeTaskRejected, sid, task.TaskRejected{TaskMessageID: rej.MessageID, ReasonCode: task.ReasonNotAuthorized, Message: "no rule admits it"})
	if err != nil {
		t.Fatal(err)
	}
	c.publish(env)
	c.publish(env) // the callee answers a duplicate submit again
	eventually(t, 10*time.Second, "the rejection", func() error {
		var tv TaskView
		r.call(t, http.MethodGet, "/hcp/v1/tasks/"+rej.MessageID, nil, &tv)
		if tv.Status != TaskRejected || tv.ReasonCode != string(task.ReasonNotAuthorized) || !tv.DeliveredToApp {
			return fmt.Errorf("%+v", tv)
		}
		return nil
	})
	if l, _ := b.app.Session(sid); l.Answer != "task_rejected" || l.Duplicates != 0 {
		t.Errorf("app: %+v", l)
	}

	v := r.submit(t, taskReq("lab"))
	s := newScript(t, "lab", v.MessageID, 5)
	var e ErrorResponse
	if st := r.call(t, http.MethodPost, "/hcp/v1/sessions/"+s.sessionID+"/abort", nil, &e); st != 404 {
		t.Errorf("abort before anything is known: HTTP %d %+v", st, e)
	}
	for _, m := range s.msgs[:3] {
		c.publish(m)
	}
	eventually(t, 10*time.Second, "the session start", func() error {
		if l, _ := b.app.Session(s.sessionID); l.LastSequence != 2 {
			return fmt.Errorf("%+v", l)
		}
		return nil
	})
	var ar AbortResponse
	if st := r.call(t, http.MethodPost, "/hcp/v1/sessions/"+s.sessionID+"/abort", AbortRequest{Reason: "changed my mind"}, &ar); st != 202 {
		t.Fatalf("abort: HTTP %d", st)
	}
	ch, err := b.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	found := false
	eventually(t, 10*time.Second, "the abort in the command queue", func() error {
		for {
			d, ok, err := ch.Get(topology.CommandQueue("lab"), true)
			if err != nil || !ok {
				return fmt.Errorf("not found (%v)", err)
			}
			if d.Type != string(envelope.TypeAbort) {
				continue
			}
			env, err := envelope.FromDelivery(d, 0)
			if err != nil {
				return err
			}
			var a task.Abort
			_ = json.Unmarshal(env.Payload, &a)
			if env.MessageID != ar.MessageID || env.Session() != s.sessionID || a.SessionToken != testToken || a.Reason != "changed my mind" || d.UserId != b.caller.name {
				return fmt.Errorf("abort %+v payload %+v user %s", env, a, d.UserId)
			}
			found = true
			return nil
		}
	})
	if !found {
		t.Fatal("no abort")
	}
	for _, m := range s.msgs[3:] {
		c.publish(m)
	}
	eventually(t, 10*time.Second, "the end", func() error { return b.complete(s.sessionID, 5) })
	if st := r.call(t, http.MethodPost, "/hcp/v1/sessions/"+s.sessionID+"/abort", nil, &e); st != 409 || e.Error.Code != "session_finished" {
		t.Errorf("abort after the end: HTTP %d %+v", st, e)
	}
}

// TestSubmitRepublishedUntilAnswered: without an answer the task_submit is
// republished with the same message_id and body, across a restart, until
// the answer arrives.
func TestSubmitRepublishedUntilAnswered(t *testing.T) {
	b := newBed(t, "lab")
	retry := func(o *Options) {
		o.SubmitRetry = RetryPolicy{Timeout: 300 * time.Millisecond, MaxTimeout: 300 * time.Millisecond, MaxAttempts: 20}
	}
	r := b.start(retry)
	v := r.submit(t, taskReq("lab"))
	ch, err := b.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var bodies []string
	collect := func(want int) {
		eventually(t, 15*time.Second, fmt.Sprintf("%d copies of the task_submit", want), func() error {
			for {
				d, ok, err := ch.Get(topology.CommandQueue("lab"), true)
				if err != nil {
					return err
				}
				if !ok {
					break
				}
				if d.MessageId != v.MessageID {
					return fmt.Errorf("unexpected message %s", d.MessageId)
				}
				bodies = append(bodies, string(d.Body))
			}
			if len(bodies) < want {
				return fmt.Errorf("%d copies", len(bodies))
			}
			return nil
		})
	}
	collect(3)
	r.stop(t)
	r2 := b.start(retry)
	collect(len(bodies) + 2)
	for _, body := range bodies[1:] {
		if body != bodies[0] {
			t.Fatalf("republished body differs:\n%s\n%s", bodies[0], body)
		}
	}
	var tv TaskView
	r2.call(t, http.MethodGet, "/hcp/v1/tasks/"+v.MessageID, nil, &tv)
	if tv.Attempts < len(bodies) {
		t.Errorf("attempts %d, copies %d", tv.Attempts, len(bodies))
	}
	// The answer stops the republishing.
	s := newScript(t, "lab", v.MessageID, 3)
	b.callee("lab").publish(s.msgs[0])
	eventually(t, 10*time.Second, "accepted", func() error {
		r2.call(t, http.MethodGet, "/hcp/v1/tasks/"+v.MessageID, nil, &tv)
		if tv.Status != TaskAccepted {
			return fmt.Errorf("%+v", tv)
		}
		return nil
	})
	time.Sleep(time.Second)
	_, _ = ch.QueuePurge(topology.CommandQueue("lab"), false)
	time.Sleep(time.Second)
	if d, ok, _ := ch.Get(topology.CommandQueue("lab"), true); ok {
		t.Errorf("still republished after the answer: %s", d.MessageId)
	}
	t.Logf("task_submit published %d times with message_id %s, identical bodies, across one restart", len(bodies), v.MessageID)
}

// TestSubmitValidation: bad requests are refused with field details, an
// unknown callee is 404, a repeated message_id is idempotent.
func TestSubmitValidation(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	var e ErrorResponse
	bad := taskReq("lab")
	bad.Constraints.DataClassification = "T9"
	bad.Capability = "bad capability"
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", bad, &e); st != 400 || len(e.Error.Fields) != 2 {
		t.Errorf("invalid task: HTTP %d %+v", st, e)
	}
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", map[string]any{"callee_id": "lab", "capabilty": "typo"}, &e); st != 400 {
		t.Errorf("unknown field: HTTP %d %+v", st, e)
	}
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", taskReq("nobody"), &e); st != 404 || e.Error.Code != "unknown_callee" {
		t.Errorf("unknown callee: HTTP %d %+v", st, e)
	}
	req := taskReq("lab")
	req.MessageID = envelope.NewMessageID()
	var v1, v2 TaskView
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", req, &v1); st != 202 || v1.MessageID != req.MessageID {
		t.Errorf("first submit: HTTP %d %+v", st, v1)
	}
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", req, &v2); st != 200 || v2.MessageID != req.MessageID || v2.Attempts != 1 {
		t.Errorf("repeated submit: HTTP %d %+v", st, v2)
	}
	req.Capability = "other"
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", req, &e); st != 409 {
		t.Errorf("reused message_id: HTTP %d %+v", st, e)
	}
	if st := r.call(t, http.MethodGet, "/hcp/v1/tasks/"+envelope.NewMessageID(), nil, &e); st != 404 {
		t.Errorf("unknown task: HTTP %d", st)
	}
	if st := r.call(t, http.MethodGet, "/hcp/v1/sessions/"+envelope.NewMessageID(), nil, &e); st != 404 {
		t.Errorf("unknown session: HTTP %d", st)
	}
}

// TestSampleCallerClient: the sample caller's submit-and-watch path, which
// uses nothing but the local HTTP API, follows a task to its end.
func TestSampleCallerClient(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	c := samplecaller.NewClient(r.api.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	task, err := c.Submit(ctx, samplecaller.SubmitRequest{CalleeID: "lab", Capability: "analyze", Intent: "demo",
		Inputs: json.RawMessage(`{"steps":2}`), Constraints: samplecaller.Constraints{DataClassification: "T1"}})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		s := newScript(t, "lab", task.MessageID, 6)
		callee := b.callee("lab")
		for _, m := range s.msgs {
			callee.publish(m)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	var out strings.Builder
	final, sess, err := c.Watch(ctx, task.MessageID, 20*time.Millisecond, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sample-caller submit output:\n%s", out.String())
	if final.Status != "accepted" || !sess.Finished || sess.State != "COMPLETED" || sess.LastSequence != 6 {
		t.Errorf("task %+v session %+v", final, sess)
	}
	if _, err := c.Submit(ctx, samplecaller.SubmitRequest{CalleeID: "lab"}); err == nil || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("invalid submit: %v", err)
	}
}

// TestAcceptedArrivingAfterEvents: a task_accepted republished behind the
// session's first events (a lost confirm on the callee side) is still
// delivered first.
func TestAcceptedArrivingAfterEvents(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	v := r.submit(t, taskReq("lab"))
	const n = 6
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	for _, m := range s.msgs[1:4] {
		c.publish(m)
	}
	time.Sleep(200 * time.Millisecond)
	c.publish(s.msgs[0])
	for _, m := range s.msgs[4:] {
		c.publish(m)
	}
	eventually(t, 20*time.Second, "the stream, answer first", func() error { return b.complete(s.sessionID, n) })
	if l, _ := b.app.Session(s.sessionID); l.Messages[0].Type != "task_accepted" {
		t.Errorf("first message %+v", l.Messages[0])
	}
}

// TestAbortedSessionsArePruned: an aborted session ends with session_closed
// and no task_completed or task_failed; past the retention it is forgotten
// like any other finished session, not kept for ever.
func TestAbortedSessionsArePruned(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.Retention = time.Millisecond })
	v := r.submit(t, taskReq("lab"))
	s := newScript(t, "lab", v.MessageID, 3)
	c := b.callee("lab")
	c.publish(s.msgs[0]) // task_accepted
	c.publish(s.msgs[1]) // session_created
	closed, err := envelope.New(envelope.TypeEvent, s.sessionID, mustEvent(t, 2, &session.SessionClosedData{FinalState: session.StateAborted, Reason: "aborted"}))
	if err != nil {
		t.Fatal(err)
	}
	c.publish(closed)
	eventually(t, 10*time.Second, "the aborted session closed", func() error {
		if rec, ok := r.sc.store.Session(s.sessionID); !ok || !rec.Closed || rec.State != string(session.StateAborted) {
			return fmt.Errorf("record %+v (%v)", rec, ok)
		}
		return nil
	})
	eventually(t, 10*time.Second, "the aborted session forgotten", func() error {
		r.sc.prune()
		if rec, ok := r.sc.store.Session(s.sessionID); ok {
			return fmt.Errorf("still kept: %+v", rec)
		}
		return nil
	})
}
