package callee

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
