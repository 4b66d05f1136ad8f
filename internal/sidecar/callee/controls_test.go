package callee

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

func (b *bed) abort(sid, tok, reason string) {
	b.t.Helper()
	env, err := envelope.New(envelope.TypeAbort, sid, task.Abort{SessionToken: tok, Reason: reason})
	must(b.t, err)
	pub, err := envelope.EncodePublishing(env, b.callerU)
	must(b.t, err)
	b.publish(pub)
}

func TestAbort(t *testing.T) {
	b := newBed(t, bedOptions{sessions: v1alpha1.SessionsSpec{AbortTimeout: "PT2S"}})
	long := func(extra string) *task.TaskSubmit {
		return newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":100,"step_ms":100` + extra + `}`) })
	}

	t.Run("by the caller", func(t *testing.T) {
		_, sid, _ := b.submit(long(`,"abort_cleanup_ms":200`))
		acc := acceptedOf(t, b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))
		b.waitMessage(sid, 10*time.Second, "progress", isEvent(session.EventProgress))
		// A forged token and a token for another session are refused.
		_, other, _ := b.submit(long(""))
		otherAcc := acceptedOf(t, b.waitMessage(other, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))
		b.abort(sid, otherAcc.SessionToken, "wrong token")
		b.abort(sid, acc.SessionToken[:len(acc.SessionToken)-4]+"AAAA", "forged")
		time.Sleep(500 * time.Millisecond)
		if hs := b.hcpSession(sid); hs.Spec.AbortRequested || hs.Status.State != v1alpha1.SessionRunning {
			t.Fatalf("an invalid abort took effect: %+v", hs.Status)
		}
		b.abort(sid, acc.SessionToken, "changed my mind")
		closed := closedOf(t, b, sid)
		if closed.FinalState != session.StateAborted {
			t.Fatalf("session_closed = %+v", closed)
		}
		if got := b.stateChanges(sid); !slices.Equal(got, []string{"PENDING>RUNNING", "RUNNING>ABORTING", "ABORTING>ABORTED"}) {
			t.Fatalf("transitions %v", got)
		}
		hs := b.waitState(sid, v1alpha1.SessionAborted, 5*time.Second)
		if !hs.Spec.AbortRequested || hs.Status.Reason != "aborted" {
			t.Fatalf("HCPSession %+v / %+v", hs.Spec, hs.Status)
		}
		checkSequences(t, b.events(sid))
		if countType(b.messages(sid), envelope.TypeTaskCompleted)+countType(b.messages(sid), envelope.TypeTaskFailed) != 0 {
			t.Fatal("an aborted session sent a result")
		}
		// The other session goes on.
		if hs := b.hcpSession(other); hs.Status.State != v1alpha1.SessionRunning {
			t.Fatalf("the other session is %s", hs.Status.State)
		}
		b.abort(other, otherAcc.SessionToken, "")
		closedOf(t, b, other)
	})

	t.Run("with kubectl", func(t *testing.T) {
		_, sid, _ := b.submit(long(""))
		b.waitMessage(sid, 20*time.Second, "progress", isEvent(session.EventProgress))
		hs := b.hcpSession(sid)
		patch := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"abortRequested":true}}`))
		must(t, b.env.Client.Patch(t.Context(), hs, patch))
		if closed := closedOf(t, b, sid); closed.FinalState != session.StateAborted {
			t.Fatalf("session_closed = %+v", closed)
		}
	})

	t.Run("harness does not finish cleanup", func(t *testing.T) {
		_, sid, _ := b.submit(long(`,"ignore_abort":true`))
		acc := acceptedOf(t, b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))
		b.waitMessage(sid, 10*time.Second, "progress", isEvent(session.EventProgress))
		start := time.Now()
		b.abort(sid, acc.SessionToken, "stop")
		closed := closedOf(t, b, sid)
		if closed.FinalState != session.StateAborted || closed.Reason != reasonAbortTimeout {
			t.Fatalf("session_closed = %+v", closed)
		}
		if d := time.Since(start); d < 2*time.Second || d > 10*time.Second {
			t.Fatalf("aborted after %s; the abort timeout is 2s", d)
		}
		b.waitState(sid, v1alpha1.SessionAborted, 5*time.Second)
	})
}

func TestPauseResume(t *testing.T) {
	b := newBed(t, bedOptions{})
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) {
		ts.Inputs = json.RawMessage(`{"steps":4,"step_ms":50,"pause_at":2,"pause_ms":1500}`)
	}))
	b.waitState(sid, v1alpha1.SessionPaused, 20*time.Second)
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v", closed)
	}
	if got := b.stateChanges(sid); !slices.Equal(got, []string{"PENDING>RUNNING", "RUNNING>PAUSED", "PAUSED>RUNNING", "RUNNING>COMPLETED"}) {
		t.Fatalf("transitions %v", got)
	}
	checkSequences(t, b.events(sid))
	b.waitState(sid, v1alpha1.SessionCompleted, 5*time.Second)
}

func TestTimeout(t *testing.T) {
	b := newBed(t, bedOptions{})
	t.Run("running", func(t *testing.T) {
		_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) {
			ts.Inputs = json.RawMessage(`{"steps":100,"step_ms":100}`)
			ts.Constraints.MaxDuration = task.Duration(2 * time.Second)
		}))
		closed := closedOf(t, b, sid)
		if closed.FinalState != session.StateFailed || closed.Reason != "timeout" {
			t.Fatalf("session_closed = %+v", closed)
		}
		m := b.waitMessage(sid, time.Second, "task_failed", isType(envelope.TypeTaskFailed))
		var tf task.TaskFailed
		must(t, json.Unmarshal(m.env.Payload, &tf))
		if tf.Code != "timeout" {
			t.Fatalf("task_failed = %+v", tf)
		}
		hs := b.waitState(sid, v1alpha1.SessionFailed, 5*time.Second)
		if hs.Status.Error == nil || hs.Status.Error.Code != "timeout" {
			t.Fatalf("status = %+v", hs.Status)
		}
	})
	t.Run("paused", func(t *testing.T) {
		_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) {
			ts.Inputs = json.RawMessage(`{"steps":3,"step_ms":50,"pause_at":1,"pause_ms":30000}`)
			ts.Constraints.MaxDuration = task.Duration(2 * time.Second)
		}))
		closed := closedOf(t, b, sid)
		if closed.FinalState != session.StateFailed || closed.Reason != "timeout" {
			t.Fatalf("session_closed = %+v", closed)
		}
		// No PAUSED -> FAILED in L2: resumed first, then failed.
		if got := b.stateChanges(sid); !slices.Equal(got, []string{"PENDING>RUNNING", "RUNNING>PAUSED", "PAUSED>RUNNING", "RUNNING>FAILED"}) {
			t.Fatalf("transitions %v", got)
		}
		checkSequences(t, b.events(sid))
	})
}

func TestHarnessFailure(t *testing.T) {
	b := newBed(t, bedOptions{})
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":5,"step_ms":20,"fail_at":2}`) }))
	closed := closedOf(t, b, sid)
	if closed.FinalState != session.StateFailed || closed.Reason != "simulated_failure" {
		t.Fatalf("session_closed = %+v", closed)
	}
	hs := b.waitState(sid, v1alpha1.SessionFailed, 5*time.Second)
	if hs.Status.Error == nil || hs.Status.Error.Code != "simulated_failure" {
		t.Fatalf("status = %+v", hs.Status)
	}
}

func TestMalformedCommands(t *testing.T) {
	b := newBed(t, bedOptions{})
	invalidEnv, _ := envelope.New(envelope.TypeTaskSubmit, "", map[string]any{"caller_id": callerID, "callee_id": calleeID})
	invalidPayload, _ := envelope.Encode(invalidEnv)
	invalidPayloadID := invalidEnv.MessageID
	props := func(body []byte, mut func(*amqp.Publishing)) (amqp.Publishing, string) {
		id := envelope.NewMessageID()
		p := amqp.Publishing{ContentType: "application/json", ContentEncoding: "utf-8", DeliveryMode: 2, MessageId: id,
			Type: "task_submit", UserId: b.callerU, Body: body}
		if mut != nil {
			mut(&p)
		}
		return p, deriveSID(id)
	}
	valid := func() []byte {
		env, _ := envelope.New(envelope.TypeTaskSubmit, "", newSubmit(nil))
		body, _ := envelope.Encode(env)
		return body
	}
	answered := []struct {
		name string
		body []byte
		mut  func(*amqp.Publishing)
	}{
		{"bad JSON", []byte(`{"hcp_version":"1.0",`), nil},
		{"not an object", []byte(`[1,2,3]`), nil},
		{"wrong content type", valid(), func(p *amqp.Publishing) { p.ContentType = "text/plain" }},
		{"no content type", valid(), func(p *amqp.Publishing) { p.ContentType = "" }},
		{"huge body", append([]byte(`{"x":"`), append(make([]byte, 2<<20), '"', '}')...), nil},
		{"unknown envelope field", []byte(`{"hcp_version":"1.0","message_id":"` + envelope.NewMessageID() + `","timestamp":"2025-01-15T08:30:00.000Z","session_id":null,"type":"task_submit","payload":{},"extra":1}`), nil},
		{"invalid payload", invalidPayload, func(p *amqp.Publishing) { p.MessageId = invalidPayloadID }},
		{"invalid UTF-8", []byte("{\"a\":\"\xff\"}"), nil},
	}
	for i := range answered {
		if answered[i].name == "huge body" {
			for j := 6; j < len(answered[i].body)-2; j++ {
				answered[i].body[j] = 'a'
			}
		}
	}
	sids := make([]string, 0, len(answered))
	for _, c := range answered {
		p, _ := props(c.body, c.mut)
		b.publish(p)
		sids = append(sids, deriveSID(p.MessageId))
	}
	// Unanswerable or not a task: discarded without a reply.
	noUser, _ := props(valid(), func(p *amqp.Publishing) { p.UserId = "" })
	b.publish(noUser)
	eventEnv, _ := envelope.New(envelope.TypeEvent, envelope.NewMessageID(), map[string]any{"event_type": "progress"})
	eventPub, _ := envelope.EncodePublishing(eventEnv, b.callerU)
	b.publish(eventPub)
	abortBad, _ := props([]byte(`not json`), func(p *amqp.Publishing) { p.Type = "abort" })
	b.publish(abortBad)

	for i, c := range answered {
		m := b.waitMessage(sids[i], 20*time.Second, "task_rejected for "+c.name, isType(envelope.TypeTaskRejected))
		rj := rejectedOf(t, m)
		if rj.ReasonCode != task.ReasonMalformed {
			t.Fatalf("%s: task_rejected = %+v", c.name, rj)
		}
		t.Logf("%s: %s", c.name, rj.Message)
	}
	// The queue is not blocked: a valid task still runs.
	_, sid, _ := b.submit(newSubmit(nil))
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v", closed)
	}
	testEventually(t, 10*time.Second, func() error {
		if n := b.queueDepth("hcp.cmd." + calleeID); n != 0 {
			return fmt.Errorf("command queue holds %d messages", n)
		}
		return nil
	})
	if n := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues("malformed")); n < float64(len(answered)) {
		t.Fatalf("rejects{malformed} = %v, want >= %d", n, len(answered))
	}
	for _, label := range []string{rejectUnanswerable, rejectUnexpectedType} {
		if n := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(label)); n != 1 {
			t.Fatalf("rejects{%s} = %v, want 1", label, n)
		}
	}
	if b.sc.Ready() != nil {
		t.Fatalf("the sidecar is not ready after malformed input: %v", b.sc.Ready())
	}
}
