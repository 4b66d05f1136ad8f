package callee

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

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
