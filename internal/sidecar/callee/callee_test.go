package callee

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// watchStates records the states an HCPSession goes through, as a user
// with `kubectl get hcpsessions --watch` would see them.
func (b *bed) watchStates(sid string) func() []string {
	wc, err := client.NewWithWatch(b.env.Config, client.Options{Scheme: b.env.Scheme})
	must(b.t, err)
	w, err := wc.Watch(b.t.Context(), &v1alpha1.HCPSessionList{}, client.InNamespace(b.ns))
	must(b.t, err)
	var mu sync.Mutex
	var seen []string
	go func() {
		for ev := range w.ResultChan() {
			hs, ok := ev.Object.(*v1alpha1.HCPSession)
			if !ok || hs.Name != sid || ev.Type == watch.Deleted {
				continue
			}
			st := string(hs.Status.State)
			if st == "" {
				st = "-"
			}
			pct := "-"
			if p := hs.Status.Progress; p != nil && p.Percent != nil {
				pct = fmt.Sprint(*p.Percent)
			}
			b.t.Logf("kubectl get hcps: %-36s %-6s %-4s %-10s %-10s %-4s %-4s %-3d", hs.Name, hs.Spec.CallerID, hs.Spec.CalleeID, hs.Spec.Capability, st, hs.Spec.RiskLevel, pct, hs.Status.LastSequence)
			mu.Lock()
			if len(seen) == 0 || seen[len(seen)-1] != st {
				seen = append(seen, st)
			}
			mu.Unlock()
		}
	}()
	b.t.Cleanup(w.Stop)
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

func TestAcceptedEventsCompleted(t *testing.T) {
	b := newBed(t, bedOptions{})
	ts := newSubmit(func(ts *task.TaskSubmit) {
		ts.Inputs = json.RawMessage(`{"steps":6,"step_ms":250,"checkpoint_every":3,"log_every":2}`)
		ts.Constraints.MaxDuration = task.Duration(10 * time.Minute)
	})
	// The session id is known before submitting: watch from the start.
	env, _ := envelope.New(envelope.TypeTaskSubmit, "", ts)
	pub, _ := envelope.EncodePublishing(env, b.callerU)
	msgID := env.MessageID
	sid := deriveSID(msgID)
	states := b.watchStates(sid)
	b.publish(pub)

	acc := acceptedOf(t, b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))
	if acc.TaskMessageID != msgID || acc.SessionID != sid || acc.RiskLevel != task.R1 {
		t.Fatalf("task_accepted = %+v", acc)
	}
	claims, err := token.Verify(b.key.Public().(ed25519PublicKey), acc.SessionToken, token.Expectations{Issuer: calleeID, Audience: callerID, Subject: sid}, time.Now())
	if err != nil {
		t.Fatalf("session token: %v", err)
	}
	if claims.Capability != "analyze" || claims.Risk != task.R1 || claims.ExpiresAt.Sub(claims.IssuedAt) != 10*time.Minute {
		t.Fatalf("claims = %+v", claims)
	}

	b.waitMessage(sid, 30*time.Second, "session_closed", isEvent(session.EventSessionClosed))
	b.waitEvent(EventSessionCompleted, "Session "+sid+" of caller "+callerID+` (capability "analyze") completed`)
	msgs := b.messages(sid)
	kinds := make([]envelope.MessageType, 0, len(msgs))
	for _, m := range msgs {
		kinds = append(kinds, m.env.Type)
	}
	if msgs[0].env.Type != envelope.TypeTaskAccepted {
		t.Fatalf("first message %s, want task_accepted; all: %s", msgs[0].env.Type, summary(msgs))
	}
	evs := b.events(sid)
	checkSequences(t, evs)
	types := make([]session.EventType, 0, len(evs))
	for _, e := range evs {
		types = append(types, e.EventType)
	}
	want := []session.EventType{
		session.EventSessionCreated, session.EventStateChanged,
		session.EventProgress, session.EventProgress, session.EventLog, session.EventProgress, session.EventCheckpointCreated,
		session.EventProgress, session.EventLog, session.EventProgress, session.EventProgress, session.EventLog, session.EventCheckpointCreated,
		session.EventStateChanged, session.EventSessionClosed,
	}
	if !slices.Equal(types, want) {
		t.Fatalf("event types\n got %v\nwant %v", types, want)
	}
	// task_completed comes after the last harness event, before session_closed.
	if i := slices.Index(kinds, envelope.TypeTaskCompleted); i != len(kinds)-2 {
		t.Fatalf("task_completed at %d of %v", i, kinds)
	}
	var tc task.TaskCompleted
	must(t, json.Unmarshal(msgs[len(msgs)-2].env.Payload, &tc))
	if tc.Summary.EventCount == 0 || len(tc.Result) == 0 {
		t.Fatalf("task_completed = %s", msgs[len(msgs)-2].env.Payload)
	}
	var closed session.SessionClosedData
	must(t, json.Unmarshal(evs[len(evs)-1].Data, &closed))
	if closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v", closed)
	}
	// session_created's state is where the first state_changed starts, and
	// the last state_changed ends where session_closed says.
	var created session.SessionCreatedData
	var first, final session.StateChangedData
	must(t, json.Unmarshal(evs[0].Data, &created))
	must(t, json.Unmarshal(evs[1].Data, &first))
	must(t, json.Unmarshal(evs[len(evs)-2].Data, &final))
	if created.State != first.FromState || first.ToState != session.StateRunning {
		t.Fatalf("session_created says %s, then state_changed %s → %s", created.State, first.FromState, first.ToState)
	}
	if final.FromState != session.StateRunning || final.ToState != closed.FinalState || final.Reason != closed.Reason {
		t.Fatalf("last state_changed %+v, session_closed %+v", final, closed)
	}
	// Every message carries the L1 properties.
	for _, m := range msgs {
		d := m.d
		if d.DeliveryMode != 2 || d.ContentType != "application/json" || d.ContentEncoding != "utf-8" || d.MessageId != m.env.MessageID ||
			d.CorrelationId != sid || d.Type != string(m.env.Type) || d.UserId != b.calleeU || d.Timestamp.IsZero() {
			t.Fatalf("message %s lacks L1 properties: %+v", m.env.Type, d)
		}
		if want := callerID + "." + sid + "." + string(m.env.Type); d.RoutingKey != want {
			t.Fatalf("routing key %q, want %q", d.RoutingKey, want)
		}
	}

	hs := b.waitState(sid, v1alpha1.SessionCompleted, 10*time.Second)
	if hs.Status.LastSequence != int64(len(evs)) || hs.Status.EventCount != int64(len(evs)) || hs.Status.PodName != b.pod ||
		hs.Status.StartedAt == nil || hs.Status.CompletedAt == nil || hs.Status.Result == nil || hs.Status.LastCheckpoint == nil ||
		hs.Status.Progress == nil || *hs.Status.Progress.Percent != 100 {
		t.Fatalf("status = %+v", hs.Status)
	}
	if hs.Spec.RiskLevel != v1alpha1.RiskR1 || hs.Spec.MaxDuration != "PT10M" || hs.Spec.CallerID != callerID || hs.Spec.TaskMessageID != msgID {
		t.Fatalf("spec = %+v", hs.Spec)
	}
	testEventually(t, 5*time.Second, func() error {
		got := states()
		// Created as an undecided claim (no status; label hcp.io/state
		// PENDING), then the decision is the next write.
		if !slices.Equal(got, []string{"-", "RUNNING", "COMPLETED"}) {
			return fmt.Errorf("states seen %v, want - RUNNING COMPLETED", got)
		}
		return nil
	})
	if b.harness.Started() != 1 {
		t.Fatalf("harness started %d tasks", b.harness.Started())
	}
	if n := b.queueDepth("hcp.cmd." + calleeID); n != 0 {
		t.Fatalf("command queue holds %d messages", n)
	}
}

func testEventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNoDataClassification: a spec-only caller leaves
// constraints.data_classification out; the task is judged as the
// capability's class (analyze: T2), which the test policy admits, and the
// session and the harness's task carry that class.
func TestNoDataClassification(t *testing.T) {
	b := newBed(t, bedOptions{})
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Constraints.DataClassification = "" }))
	b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted))
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v", closed)
	}
	if hs := b.hcpSession(sid); hs.Spec.DataClassification != v1alpha1.DataT2 {
		t.Fatalf("HCPSession dataClassification %q, want T2 (the capability's)", hs.Spec.DataClassification)
	}
}

func TestRejections(t *testing.T) {
	b := newBed(t, bedOptions{})
	for _, tc := range []struct {
		name string
		mut  func(*task.TaskSubmit)
		want task.ReasonCode
	}{
		{"unknown capability", func(ts *task.TaskSubmit) { ts.Capability = "teleport" }, task.ReasonUnknownCapability},
		{"policy deny", func(ts *task.TaskSubmit) { ts.Capability = "restricted" }, task.ReasonNotAuthorized},
		{"risk above the task's ceiling", func(ts *task.TaskSubmit) {
			ts.Capability = "synthesize"
			ts.Constraints.MaxRiskLevel = task.R2
		}, task.ReasonRiskExceedsPolicy},
		{"declared risk above the policy", func(ts *task.TaskSubmit) { ts.Metadata = json.RawMessage(`{"risk_level":"R5"}`) }, task.ReasonRiskExceedsPolicy},
		{"data class above the capability", func(ts *task.TaskSubmit) { ts.Constraints.DataClassification = task.T4 }, task.ReasonDataClassExceedsPolicy},
		{"duration above the capability", func(ts *task.TaskSubmit) { ts.Constraints.MaxDuration = task.Duration(2 * time.Hour) }, task.ReasonDurationExceedsPolicy},
		{"expired", func(ts *task.TaskSubmit) { ts.ExpiresAt = task.TimestampPtr(time.Now().Add(-time.Minute)) }, task.ReasonExpired},
		{"spoofed caller_id", func(ts *task.TaskSubmit) { ts.CallerID = "beta" }, task.ReasonNotAuthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgID, sid, _ := b.submit(newSubmit(tc.mut))
			// The reply reaches the authenticated caller (alpha), even when
			// the payload claims another one.
			m := b.waitMessage(sid, 20*time.Second, "task_rejected", isType(envelope.TypeTaskRejected))
			rj := rejectedOf(t, m)
			if rj.ReasonCode != tc.want || rj.TaskMessageID != msgID || rj.Message == "" {
				t.Fatalf("task_rejected = %+v, want reason %s", rj, tc.want)
			}
			t.Logf("%s: %s", rj.ReasonCode, rj.Message)
			// Nothing is written for it: no HCPSession; an Event on the
			// Callee says why.
			var hs v1alpha1.HCPSession
			if err := b.env.Client.Get(t.Context(), client.ObjectKey{Namespace: b.ns, Name: sid}, &hs); !apierrors.IsNotFound(err) {
				t.Fatalf("a rejected task left an HCPSession (%v): %+v", err, hs.Status)
			}
			b.waitEvent(EventTaskRejected, msgID+" of caller "+callerID, string(tc.want))
			if n := len(b.events(sid)); n != 0 {
				t.Fatalf("a rejected task produced %d events", n)
			}
		})
	}
	if b.harness.Started() != 0 {
		t.Fatalf("the harness started %d rejected tasks", b.harness.Started())
	}
}

func TestDuplicateSubmitAnsweredWithOriginalReply(t *testing.T) {
	b := newBed(t, bedOptions{})
	ts := newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":4,"step_ms":200}`) })
	_, sid, pub := b.submit(ts)
	b.publish(pub) // the caller republishes at once (same message_id)
	b.waitMessage(sid, 30*time.Second, "session_closed", isEvent(session.EventSessionClosed))
	b.publish(pub) // and again after the session ended
	testEventually(t, 20*time.Second, func() error {
		if n := countType(b.messages(sid), envelope.TypeTaskAccepted); n != 3 {
			return fmt.Errorf("%d task_accepted, want 3", n)
		}
		return nil
	})
	var bodies []string
	for _, m := range b.messages(sid) {
		if m.env.Type == envelope.TypeTaskAccepted {
			bodies = append(bodies, string(m.d.Body))
		}
	}
	if bodies[0] != bodies[1] || bodies[0] != bodies[2] {
		t.Fatalf("the replies differ:\n%s\n%s\n%s", bodies[0], bodies[1], bodies[2])
	}
	if n := countEvent(b.events(sid), session.EventSessionCreated); n != 1 {
		t.Fatalf("%d session_created events", n)
	}
	checkSequences(t, b.events(sid))
	var list v1alpha1.HCPSessionList
	must(t, b.env.Client.List(t.Context(), &list, client.InNamespace(b.ns)))
	if len(list.Items) != 1 {
		t.Fatalf("%d HCPSessions, want 1", len(list.Items))
	}
	if b.harness.Started() != 1 {
		t.Fatalf("the harness started the task %d times", b.harness.Started())
	}

	// A rejected task's duplicate gets the same rejection.
	_, rsid, rpub := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Capability = "teleport" }))
	b.waitMessage(rsid, 20*time.Second, "task_rejected", isType(envelope.TypeTaskRejected))
	b.publish(rpub)
	testEventually(t, 20*time.Second, func() error {
		if n := countType(b.messages(rsid), envelope.TypeTaskRejected); n != 2 {
			return fmt.Errorf("%d task_rejected, want 2", n)
		}
		return nil
	})
	rs := b.messages(rsid)
	if string(rs[0].d.Body) != string(rs[1].d.Body) {
		t.Fatalf("rejections differ:\n%s\n%s", rs[0].d.Body, rs[1].d.Body)
	}
}

func countType(ms []received, t envelope.MessageType) int {
	n := 0
	for _, m := range ms {
		if m.env.Type == t {
			n++
		}
	}
	return n
}

func countEvent(evs []session.EventPayload, et session.EventType) int {
	n := 0
	for _, e := range evs {
		if e.EventType == et {
			n++
		}
	}
	return n
}

// stateChanges lists the state_changed transitions of a session.
func (b *bed) stateChanges(sid string) []string {
	var out []string
	for _, e := range b.events(sid) {
		if e.EventType == session.EventStateChanged {
			var d session.StateChangedData
			_ = json.Unmarshal(e.Data, &d)
			out = append(out, string(d.FromState)+">"+string(d.ToState))
		}
	}
	return out
}

func closedOf(t *testing.T, b *bed, sid string) session.SessionClosedData {
	t.Helper()
	m := b.waitMessage(sid, 30*time.Second, "session_closed", isEvent(session.EventSessionClosed))
	var d session.SessionClosedData
	must(t, json.Unmarshal(eventOf(m).Data, &d))
	return d
}

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

// orphan creates an HCPSession as a crashed sidecar would have left it.
func (b *bed) orphan(pod string, state v1alpha1.SessionState, lastSeq int64) string {
	b.t.Helper()
	msgID := envelope.NewMessageID()
	sid := deriveSID(msgID)
	hs := &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: sid, Namespace: b.ns,
			Labels:      map[string]string{v1alpha1.LabelCalleeID: calleeID, v1alpha1.LabelCallerID: callerID},
			Annotations: map[string]string{AnnotationSequenceCeiling: "1000"}},
		Spec: v1alpha1.HCPSessionSpec{SessionID: sid, CalleeID: calleeID, CallerID: callerID, Capability: "analyze",
			TaskMessageID: msgID, RiskLevel: v1alpha1.RiskR1, DataClassification: v1alpha1.DataT1, MaxDuration: "PT1H"},
	}
	must(b.t, b.env.Client.Create(b.t.Context(), hs))
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	exp := metav1.NewTime(now.Add(time.Hour))
	hs.Status = v1alpha1.HCPSessionStatus{State: state, PodName: pod, LastSequence: lastSeq, EventCount: lastSeq}
	if state != v1alpha1.SessionPending {
		hs.Status.StartedAt, hs.Status.TokenExpiresAt = &now, &exp
	}
	must(b.t, b.env.Client.Status().Update(b.t.Context(), hs))
	return sid
}

func TestRecoveryClosesOrphanedSessions(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true})
	mine := b.orphan(b.pod, v1alpha1.SessionRunning, 7)
	minePaused := b.orphan(b.pod, v1alpha1.SessionPaused, 3)
	mineAborting := b.orphan(b.pod, v1alpha1.SessionAborting, 9)
	minePending := b.orphan(b.pod, v1alpha1.SessionPending, 0)
	vanished := b.orphan("vanished-pod", v1alpha1.SessionRunning, 2)
	must(t, b.env.Client.Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "alive-pod", Namespace: b.ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}))
	alive := b.orphan("alive-pod", v1alpha1.SessionRunning, 4)

	b.start()

	for _, c := range []struct {
		sid         string
		final       session.State
		transitions []string
	}{
		{mine, session.StateFailed, []string{"RUNNING>FAILED"}},
		{minePaused, session.StateFailed, []string{"PAUSED>RUNNING", "RUNNING>FAILED"}},
		{mineAborting, session.StateAborted, []string{"ABORTING>ABORTED"}},
		{vanished, session.StateFailed, []string{"RUNNING>FAILED"}},
	} {
		closed := closedOf(t, b, c.sid)
		if closed.FinalState != c.final || closed.Reason != codeHarnessLost {
			t.Fatalf("%s: session_closed = %+v", c.sid, closed)
		}
		if got := b.stateChanges(c.sid); !slices.Equal(got, c.transitions) {
			t.Fatalf("transitions %v, want %v", got, c.transitions)
		}
		// The numbers continue after the reserved ceiling, never reusing
		// one the caller may have seen.
		evs := b.events(c.sid)
		for i, e := range evs {
			if e.Sequence != int64(1001+i) {
				t.Fatalf("%s: event %s has sequence %d, want %d", c.sid, e.EventType, e.Sequence, 1001+i)
			}
		}
		if c.final == session.StateFailed {
			m := b.waitMessage(c.sid, time.Second, "task_failed", isType(envelope.TypeTaskFailed))
			var tf task.TaskFailed
			must(t, json.Unmarshal(m.env.Payload, &tf))
			if tf.Code != codeHarnessLost || !tf.Recoverable {
				t.Fatalf("task_failed = %+v", tf)
			}
		}
		hs := b.waitState(c.sid, v1alpha1.SessionState(c.final), 10*time.Second)
		if hs.Status.Reason != codeHarnessLost || hs.Status.PodName != b.pod || hs.Annotations[AnnotationSequenceCeiling] != "2000" {
			t.Fatalf("%s: %+v %v", c.sid, hs.Status, hs.Annotations)
		}
	}
	testEventually(t, 10*time.Second, func() error {
		var hs v1alpha1.HCPSession
		if err := b.env.Client.Get(t.Context(), client.ObjectKey{Namespace: b.ns, Name: minePending}, &hs); err == nil {
			return fmt.Errorf("the orphaned PENDING session still exists")
		}
		return nil
	})
	if hs := b.hcpSession(alive); hs.Status.State != v1alpha1.SessionRunning {
		t.Fatalf("the session of a live pod was touched: %+v", hs.Status)
	}
}

// TestGracefulShutdownHandsSessionsOver: at SIGTERM the sidecar drains:
// the harness stops each session and returns a checkpoint, the session
// goes RUNNING → PAUSED (harness_moved) and is released (no owner, exact
// last sequence) for another replica; shutdown stays bounded.
func TestGracefulShutdownHandsSessionsOver(t *testing.T) {
	b := newBed(t, bedOptions{timeouts: Timeouts{ShutdownDrain: time.Second}})
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":1000,"step_ms":100}`) }))
	_, quick, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":3,"step_ms":300}`) }))
	b.waitMessage(sid, 20*time.Second, "progress", isEvent(session.EventProgress))
	b.waitMessage(quick, 20*time.Second, "progress", isEvent(session.EventProgress))
	start := time.Now()
	b.stopSC()
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("shutdown took %s", d)
	}
	for _, id := range []string{sid, quick} {
		// Released before the sidecar returned: nothing failed.
		hs := b.hcpSession(id)
		if hs.Status.State != v1alpha1.SessionPaused || hs.Status.Reason != reasonHarnessMoved || hs.Status.PodName != "" {
			t.Fatalf("status after shutdown = %+v", hs.Status)
		}
		evs := b.events(id)
		last := evs[len(evs)-1]
		if last.EventType != session.EventStateChanged || hs.Status.LastSequence != last.Sequence {
			t.Fatalf("last event %+v, status.lastSequence %d", last, hs.Status.LastSequence)
		}
		if slices.ContainsFunc(b.messages(id), isType(envelope.TypeTaskFailed)) {
			t.Fatalf("%s: a task_failed was sent", id)
		}
		b.waitEventOn("HCPSession", id, EventSessionHandedOver, "Released by pod "+b.pod+" at its drain after event "+strconv.FormatInt(last.Sequence, 10))
	}
}

func TestDuplicateAfterRestartAndAcrossReplicas(t *testing.T) {
	b := newBed(t, bedOptions{})
	_, sid, pub := b.submit(newSubmit(nil))
	closedOf(t, b, sid)
	b.waitState(sid, v1alpha1.SessionCompleted, 5*time.Second)
	b.stopSC()

	// A restarted sidecar answers the duplicate from the HCPSession.
	r1 := b.startReplica(b.pod)
	r2 := b.startReplica("callee-pod-1")
	b.publish(pub)
	b.publish(pub)
	// A new task published four times while two replicas compete.
	_, sid2, pub2 := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":3,"step_ms":200}`) }))
	for range 3 {
		b.publish(pub2)
	}
	testEventually(t, 30*time.Second, func() error {
		if n := countType(b.messages(sid), envelope.TypeTaskAccepted); n != 3 {
			return fmt.Errorf("first task: %d task_accepted, want 3", n)
		}
		if n := countType(b.messages(sid2), envelope.TypeTaskAccepted); n != 4 {
			return fmt.Errorf("second task: %d task_accepted, want 4", n)
		}
		return nil
	})
	closedOf(t, b, sid2)
	for _, s := range []string{sid, sid2} {
		var first string
		for _, m := range b.messages(s) {
			if m.env.Type != envelope.TypeTaskAccepted {
				continue
			}
			if first == "" {
				first = string(m.d.Body)
			} else if string(m.d.Body) != first {
				t.Fatalf("replies differ:\n%s\n%s", first, m.d.Body)
			}
		}
	}
	if n := r1.harness.Started() + r2.harness.Started(); n != 1 {
		t.Fatalf("the harnesses started %d tasks, want 1", n)
	}
	if n := countEvent(b.events(sid2), session.EventSessionCreated); n != 1 {
		t.Fatalf("%d session_created", n)
	}
	checkSequences(t, b.events(sid2))

	// An abort reaches the session whichever replica receives it.
	_, sid3, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":300,"step_ms":100}`) }))
	acc := acceptedOf(t, b.waitMessage(sid3, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))
	b.waitMessage(sid3, 10*time.Second, "progress", isEvent(session.EventProgress))
	for range 4 {
		b.abort(sid3, acc.SessionToken, "stop")
	}
	if closed := closedOf(t, b, sid3); closed.FinalState != session.StateAborted {
		t.Fatalf("session_closed = %+v", closed)
	}
	a1 := testutil.ToFloat64(r1.metrics.MessagesIn.WithLabelValues("abort"))
	a2 := testutil.ToFloat64(r2.metrics.MessagesIn.WithLabelValues("abort"))
	t.Logf("abort commands consumed: %s %v, %s %v", r1.pod, a1, r2.pod, a2)
	if a1+a2 != 4 {
		t.Fatalf("aborts consumed %v + %v, want 4", a1, a2)
	}
}

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

// TestBrokerConnectionLoss closes the callee's broker connections in the
// middle of a session: publishing waits for the reconnect, confirms lost
// with the connection are republished with the same message id and
// sequence, and the caller ends up with every event (duplicates possible,
// losses not).
func TestBrokerConnectionLoss(t *testing.T) {
	b := newBed(t, bedOptions{})
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) {
		ts.Inputs = json.RawMessage(`{"steps":60,"step_ms":25,"log_every":1}`)
	}))
	b.waitMessage(sid, 20*time.Second, "progress", isEvent(session.EventProgress))
	for range 2 {
		must(t, b.broker.CloseConnectionsOf(b.calleeU))
		time.Sleep(700 * time.Millisecond)
	}
	closed := closedOf(t, b, sid)
	if closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v", closed)
	}
	seen := map[int64]int{}
	var last int64
	for _, e := range b.events(sid) {
		seen[e.Sequence]++
		last = max(last, e.Sequence)
	}
	dups := 0
	for seq := int64(1); seq <= last; seq++ {
		if seen[seq] == 0 {
			t.Fatalf("event %d lost (received %v)", seq, seen)
		}
		dups += seen[seq] - 1
	}
	// 60 progress + 60 log + session_created + 2 state_changed + session_closed.
	if last != 124 {
		t.Fatalf("last sequence %d, want 124", last)
	}
	t.Logf("%d events, %d duplicates after two connection losses", last, dups)
	b.waitState(sid, v1alpha1.SessionCompleted, 10*time.Second)
	testEventually(t, 10*time.Second, func() error {
		if n := b.queueDepth("hcp.cmd." + calleeID); n != 0 {
			return fmt.Errorf("command queue holds %d messages", n)
		}
		return nil
	})
}

func TestHarnessDeath(t *testing.T) {
	b := newBed(t, bedOptions{timeouts: Timeouts{HarnessCheck: 200 * time.Millisecond}})
	long := newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":1000,"step_ms":100}`) })

	t.Run("restarted harness lost the session", func(t *testing.T) {
		_, sid, _ := b.submit(long)
		b.waitMessage(sid, 20*time.Second, "progress", isEvent(session.EventProgress))
		b.harness.Crash()
		closed := closedOf(t, b, sid)
		if closed.FinalState != session.StateFailed || closed.Reason != codeHarnessLost {
			t.Fatalf("session_closed = %+v", closed)
		}
		b.waitState(sid, v1alpha1.SessionFailed, 5*time.Second)
	})
	t.Run("harness down", func(t *testing.T) {
		l2 := newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":1000,"step_ms":100}`) })
		_, sid, _ := b.submit(l2)
		b.waitMessage(sid, 20*time.Second, "progress", isEvent(session.EventProgress))
		b.first.harnessSrv.CloseClientConnections()
		_ = b.first.harnessSrv.Listener.Close()
		b.harness.Crash()
		start := time.Now()
		closed := closedOf(t, b, sid)
		if closed.FinalState != session.StateFailed || closed.Reason != codeHarnessLost {
			t.Fatalf("session_closed = %+v", closed)
		}
		t.Logf("failed %s after the harness went down", time.Since(start).Round(time.Millisecond))
		// A harness that is down gets new tasks rejected, not accepted.
		_, rsid, _ := b.submit(newSubmit(nil))
		rj := rejectedOf(t, b.waitMessage(rsid, 20*time.Second, "task_rejected", isType(envelope.TypeTaskRejected)))
		if rj.ReasonCode != task.ReasonHarnessUnavailable {
			t.Fatalf("task_rejected = %+v", rj)
		}
	})
}
