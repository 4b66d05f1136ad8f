package caller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// apiBed is a real API server (envtest) with a namespace for HCPSessions.
type apiBed struct {
	t   *testing.T
	env *testbed.Env
	ns  string
}

func newAPIBed(t *testing.T) *apiBed {
	t.Helper()
	env := testbed.StartEnv(t, testbed.Options{WithoutTopologyCRDs: true, AddToScheme: []func(*runtime.Scheme) error{v1alpha1.AddToScheme}})
	return &apiBed{t: t, env: env, ns: env.CreateNamespace(t, "caller-")}
}

// writer runs a status writer, as each caller pod has its own; it is
// stopped at the end of the test.
func (a *apiBed) writer(b *bed) *status.Writer {
	w := status.New(status.Options{Client: a.env.Client, Namespace: a.ns, Interval: time.Second, Metrics: b.metrics, Log: b.logger().WithName("status")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	a.t.Cleanup(func() {
		cancel()
		<-done
	})
	return w
}

// withAPI points a sidecar at the API server: HCPSessions in the bed's
// namespace, callerAckedSequence through w.
func (a *apiBed) withAPI(w *status.Writer) sidecarOpt {
	return func(o *Options) {
		o.Client = a.env.Client
		o.Reader = a.env.Client
		o.Status = w
		o.Config.Namespace = a.ns
	}
}

// withStateDir gives the sidecar its own state directory (a new pod's
// empty emptyDir).
func withStateDir(dir string) sidecarOpt {
	return func(o *Options) { o.Config.StateDir = dir }
}

// hcpSession creates the HCPSession the callee sidecar would create when it
// decides the task taskID of callerID.
func (a *apiBed) hcpSession(calleeID, callerID, taskID string) *v1alpha1.HCPSession {
	a.t.Helper()
	sid := topology.SessionID(calleeID, callerID, taskID)
	hs := &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: sid, Namespace: a.ns, Labels: map[string]string{
			v1alpha1.LabelCalleeID: calleeID, v1alpha1.LabelCallerID: callerID,
		}},
		Spec: v1alpha1.HCPSessionSpec{SessionID: sid, CalleeID: calleeID, CallerID: callerID, Capability: "analyze",
			TaskMessageID: taskID, RiskLevel: "R1", DataClassification: "T1"},
	}
	if err := a.env.Client.Create(context.Background(), hs); err != nil {
		a.t.Fatal(err)
	}
	// A merge patch, not an update: the sidecar may already be writing
	// callerAckedSequence (its streams run), and an update would conflict.
	orig := hs.DeepCopy()
	hs.Status.State = v1alpha1.SessionRunning
	if err := a.env.Client.Status().Patch(context.Background(), hs, client.MergeFrom(orig)); err != nil {
		a.t.Fatal(err)
	}
	return hs
}

// acked reads status.callerAckedSequence of the HCPSession name.
func (a *apiBed) acked(name string) int64 {
	a.t.Helper()
	var hs v1alpha1.HCPSession
	if err := a.env.Client.Get(context.Background(), types.NamespacedName{Namespace: a.ns, Name: name}, &hs); err != nil {
		a.t.Fatal(err)
	}
	return hs.Status.CallerAckedSequence
}

// lastSeq is what the app has received of session sid.
func (b *bed) lastSeq(sid string) int64 {
	l, _ := b.app.Session(sid)
	return l.LastSequence
}

// TestCallerPodMoved: a caller sidecar delivering running sessions is
// stopped gracefully and a new one starts with an EMPTY state directory,
// as when the caller pod is rescheduled (its emptyDir is gone). The new
// sidecar resumes every session where the app acknowledged it, from the
// HCPSession's status.callerAckedSequence, which the old one left exact:
//   - copies of events the old pod delivered (a callee republish after a
//     lost confirm) are recognised and not delivered again;
//   - no gap is reported or skipped: the stream goes on at once;
//   - a task the old pod submitted and that was answered only after the
//     move is recognised as this caller's (callee verified, task known);
//   - a session whose HCPSession names another caller is refused.
func TestCallerPodMoved(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest and RabbitMQ")
	}
	a := newAPIBed(t)
	b := newBed(t, "lab")
	a1 := b.start(a.withAPI(a.writer(b)))

	const k, n = 40, 80
	v1, v2, v3 := a1.submit(t, taskReq("lab")), a1.submit(t, taskReq("lab")), a1.submit(t, taskReq("lab"))
	s1, s2, s3 := newScript(t, "lab", v1.MessageID, n), newScript(t, "lab", v2.MessageID, n), newScript(t, "lab", v3.MessageID, n)
	hs1, hs2 := a.hcpSession("lab", b.callerID, v1.MessageID), a.hcpSession("lab", b.callerID, v2.MessageID)
	c := b.callee("lab")
	// task_accepted and events 1..k of sessions 1 and 2; task 3 stays
	// unanswered (its callee has not decided yet: no HCPSession).
	for i := 0; i <= k; i++ {
		c.publish(s1.msgs[i])
		c.publish(s2.msgs[i])
	}
	eventually(t, 20*time.Second, "events 1..k delivered by the first pod", func() error {
		if b.lastSeq(s1.sessionID) != k || b.lastSeq(s2.sessionID) != k {
			return fmt.Errorf("last sequences %d, %d", b.lastSeq(s1.sessionID), b.lastSeq(s2.sessionID))
		}
		return nil
	})
	a1.stop(t)
	// Exact when Run returns: the next pod may read it at once.
	for _, hs := range []*v1alpha1.HCPSession{hs1, hs2} {
		if got := a.acked(hs.Name); got != k {
			t.Errorf("after a graceful stop, %s callerAckedSequence = %d, want %d", hs.Name, got, k)
		}
	}

	// While no caller pod runs: the callee republishes events the old pod
	// had already delivered (lost confirms), and the rest streams on.
	c.publish(s1.msgs[k])
	c.publish(s2.msgs[k-1])
	c.publish(s2.msgs[k])
	for i := k + 1; i < len(s1.msgs); i++ {
		c.publish(s1.msgs[i])
		c.publish(s2.msgs[i])
	}
	// Task 3 is decided after the move.
	hs3 := a.hcpSession("lab", b.callerID, v3.MessageID)
	for _, m := range s3.msgs {
		c.publish(m)
	}
	// Another caller's session, sent to this caller's queue.
	foreignTask := envelope.NewMessageID()
	a.hcpSession("lab", "beta", foreignTask)
	foreign := topology.SessionID("lab", "beta", foreignTask)
	fe, err := envelope.New(envelope.TypeEvent, foreign, mustEvent(t, 1, &session.LogData{Level: session.LogInfo, Message: "not yours"}))
	if err != nil {
		t.Fatal(err)
	}
	c.publish(fe)
	gapsBefore := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped))

	// The moved pod: an empty state directory.
	a2 := b.start(a.withAPI(a.writer(b)), withStateDir(t.TempDir()))
	for _, s := range []*script{s1, s2, s3} {
		eventually(t, 30*time.Second, "session "+s.sessionID+" complete", func() error { return b.complete(s.sessionID, n) })
	}
	snap := b.app.Snapshot()
	t.Logf("after the move: app received %d messages, %d duplicates, %d problems; sidecar skipped %.0f duplicates",
		snap.Total, snap.Duplicates, snap.Problems, testutil.ToFloat64(b.metrics.Duplicates.WithLabelValues("sequence")))
	if snap.Duplicates != 0 || snap.Deduplicated != 0 || snap.Problems != 0 {
		t.Errorf("app saw %d duplicates, %d redelivered copies, %d problems, want none", snap.Duplicates, snap.Deduplicated, snap.Problems)
	}
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped)) - gapsBefore; got != 0 {
		t.Errorf("%.0f events reported lost (gap skipped) after the move, want 0", got)
	}
	if _, ok := b.app.Session(foreign); ok {
		t.Errorf("another caller's session was delivered to the app")
	}
	var tv TaskView
	if st := a2.call(t, http.MethodGet, "/hcp/v1/tasks/"+v3.MessageID, nil, &tv); st != http.StatusOK || tv.Status != TaskAccepted || tv.CalleeID != "lab" {
		t.Errorf("GET task %s on the new pod: HTTP %d %+v, want it accepted by lab", v3.MessageID, st, tv)
	}
	var sv SessionView
	if st := a2.call(t, http.MethodGet, "/hcp/v1/sessions/"+s3.sessionID, nil, &sv); st != http.StatusOK || sv.Unverified || sv.CalleeID != "lab" {
		t.Errorf("GET session %s on the new pod: HTTP %d %+v, want it verified, callee lab", s3.sessionID, st, sv)
	}
	a2.stop(t)
	for _, hs := range []*v1alpha1.HCPSession{hs1, hs2, hs3} {
		if got := a.acked(hs.Name); got != n {
			t.Errorf("%s callerAckedSequence = %d, want %d", hs.Name, got, n)
		}
	}
}

// tap is an app endpoint in front of the bed's app that remembers what one
// sidecar delivered: the last event sequence per session and the number of
// messages.
type tap struct {
	mu    sync.Mutex
	last  map[string]int64
	count int
	srv   *httptest.Server
}

func (b *bed) tap(t *testing.T) *tap {
	tp := &tap{last: map[string]int64{}}
	app := b.app.Handler()
	tp.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := httptest.NewRecorder()
		r.Body = io.NopCloser(bytes.NewReader(body))
		app.ServeHTTP(rec, r)
		if rec.Code/100 == 2 {
			var m AppMessage
			_ = json.Unmarshal(body, &m)
			tp.mu.Lock()
			tp.count++
			if m.Sequence > tp.last[m.SessionID] {
				tp.last[m.SessionID] = m.Sequence
			}
			tp.mu.Unlock()
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(tp.srv.Close)
	return tp
}

func (tp *tap) snapshot() (map[string]int64, int) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return maps.Clone(tp.last), tp.count
}

// through makes a sidecar deliver to the app through tp.
func (tp *tap) through() sidecarOpt {
	return func(o *Options) { o.Config.HarnessURL = tp.srv.URL }
}

// TestDrainLeavesPositionExact: Drain, as the pod's preStop hook calls it,
// while sessions stream and the next pod already waits as the queue's
// standby consumer (single active consumer, as the operator declares the
// queue; as in a rolling update). When Drain returns, every session's
// callerAckedSequence is exactly the last event the draining sidecar
// delivered (the status interval is an hour: only Drain's flush can have
// written it), the sidecar delivers nothing more and is not ready; a second
// Drain is a no-op; Run still ends cleanly. The standby pod, with an empty
// state directory, takes over when the drained consumer's channel closes,
// and the app gets every event exactly once, in order, with no gap
// reported.
func TestDrainLeavesPositionExact(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest and RabbitMQ")
	}
	a := newAPIBed(t)
	b := newBed(t, "lab")
	b.app.SetDelay(2 * time.Millisecond)
	hourly := func(o *Options) { o.StatusInterval = time.Hour }
	tapA := b.tap(t)
	a1 := b.start(a.withAPI(a.writer(b)), hourly, tapA.through())
	// Let the first sidecar's consumer be the active one.
	eventually(t, 10*time.Second, "the first sidecar consuming", a1.sc.Ready)
	// The next pod, standing by: the broker hands it nothing while the
	// first one consumes.
	a2 := b.start(a.withAPI(a.writer(b)), hourly, withStateDir(t.TempDir()))
	const sessions, events = 3, 300
	st := b.startStreams(t, a1, sessions, events, 10*time.Millisecond)
	var hss []*v1alpha1.HCPSession
	for _, s := range st.scripts {
		hss = append(hss, a.hcpSession("lab", b.callerID, s.taskID))
	}
	st.waitReceived(t, st.total()/3)
	gapsBefore := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := a1.sc.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	took := time.Since(start)
	last, count := tapA.snapshot()
	for i, s := range st.scripts {
		got := a.acked(hss[i].Name)
		t.Logf("session %s: the draining sidecar delivered up to %d; callerAckedSequence %d", s.sessionID, last[s.sessionID], got)
		if got != last[s.sessionID] {
			t.Errorf("after Drain, session %s callerAckedSequence = %d, want %d (the last event the app acknowledged)", s.sessionID, got, last[s.sessionID])
		}
	}
	t.Logf("Drain took %s; the draining sidecar had delivered %d of %d messages", took.Round(time.Millisecond), count, st.total())
	if count >= st.total() {
		t.Fatal("the streams ended before Drain: nothing was handed over")
	}
	if err := a1.sc.Drain(ctx); err != nil {
		t.Errorf("second Drain: %v", err)
	}
	if err := a1.sc.Ready(); err == nil {
		t.Error("a drained sidecar reports ready")
	}

	f := st.finish(t, events)
	t.Logf("drained and taken over by a new pod mid-stream: %s", f)
	f.check(t)
	if _, after := tapA.snapshot(); after != count {
		t.Errorf("the drained sidecar delivered %d more messages after Drain returned", after-count)
	}
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped)) - gapsBefore; got != 0 {
		t.Errorf("%.0f events reported lost (gap skipped) after the handover, want 0", got)
	}
	a1.stop(t) // Run returns nil after Drain
	a2.stop(t)
	for i, s := range st.scripts {
		if got := a.acked(hss[i].Name); got != events {
			t.Errorf("session %s callerAckedSequence = %d after the new pod stopped, want %d", s.sessionID, got, events)
		}
	}
}

// TestReplicasTakeTurns: two pods of one caller (replicas, or a rolling
// update) take turns as the queue's active consumer. Pod 1 delivers events
// 1..20 and stops; pod 2 (its own, empty state directory) delivers 21..40
// and stops; pod 1 comes back on its state directory, whose record says 20.
// The HCPSession says 40, and pod 1 resumes from the higher of the two: a
// copy of event 40 republished by the callee is not delivered again and no
// gap is reported.
func TestReplicasTakeTurns(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest and RabbitMQ")
	}
	a := newAPIBed(t)
	b := newBed(t, "lab")
	dir1, dir2 := t.TempDir(), t.TempDir()
	p1 := b.start(a.withAPI(a.writer(b)), withStateDir(dir1))
	const n = 60
	v := p1.submit(t, taskReq("lab"))
	s := newScript(t, "lab", v.MessageID, n)
	hs := a.hcpSession("lab", b.callerID, v.MessageID)
	c := b.callee("lab")
	upTo := func(from, to int) {
		for i := from; i <= to; i++ {
			c.publish(s.msgs[i])
		}
		eventually(t, 20*time.Second, fmt.Sprintf("events up to %d", to), func() error {
			if got := b.lastSeq(s.sessionID); got != int64(to) {
				return fmt.Errorf("last sequence %d", got)
			}
			return nil
		})
	}
	upTo(0, 20)
	p1.stop(t)
	p2 := b.start(a.withAPI(a.writer(b)), withStateDir(dir2))
	upTo(21, 40)
	p2.stop(t)
	if got := a.acked(hs.Name); got != 40 {
		t.Fatalf("callerAckedSequence %d after pod 2 stopped, want 40", got)
	}
	gapsBefore := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped))
	c.publish(s.msgs[40]) // a republished copy
	for i := 41; i < len(s.msgs); i++ {
		c.publish(s.msgs[i])
	}
	p1 = b.start(a.withAPI(a.writer(b)), withStateDir(dir1))
	eventually(t, 30*time.Second, "the session complete", func() error { return b.complete(s.sessionID, n) })
	if snap := b.app.Snapshot(); snap.Duplicates != 0 || snap.Problems != 0 {
		t.Errorf("app saw %d duplicates, %d problems, want none", snap.Duplicates, snap.Problems)
	}
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped)) - gapsBefore; got != 0 {
		t.Errorf("%.0f events reported lost (gap skipped), want 0", got)
	}
	p1.stop(t)
	if got := a.acked(hs.Name); got != n {
		t.Errorf("callerAckedSequence %d, want %d", got, n)
	}
}

// TestUnsolicitedSessionIsRefused: a callee (here the legitimate callee
// user, allowed to publish to hcp.events) streams a whole session the
// caller never submitted: no task of its store, no HCPSession naming it.
// Nothing of it reaches the app; every message is counted and acked.
// The caller's own session, streamed meanwhile, is untouched.
func TestUnsolicitedSessionIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest and RabbitMQ")
	}
	a := newAPIBed(t)
	b := newBed(t, "lab")
	r := b.start(a.withAPI(a.writer(b)))
	const n = 6
	mine := newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, n)
	a.hcpSession("lab", b.callerID, mine.taskID)
	injected := newScript(t, "lab", envelope.NewMessageID(), n)
	c := b.callee("lab")
	for i := range mine.msgs {
		c.publish(injected.msgs[i])
		c.publish(mine.msgs[i])
	}
	eventually(t, 20*time.Second, "the caller's own session", func() error { return b.complete(mine.sessionID, n) })
	eventually(t, 10*time.Second, "the injected session refused", func() error {
		if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonUnsolicitedSession)); got != float64(len(injected.msgs)) {
			return fmt.Errorf("%s = %.0f, want %d", ReasonUnsolicitedSession, got, len(injected.msgs))
		}
		return nil
	})
	if s, ok := b.app.Session(injected.sessionID); ok {
		t.Fatalf("the app received %d messages of a session the caller never submitted", len(s.Messages))
	}
}

// TestRejectionWithoutRecordIsDelivered: a callee rejects without writing
// an HCPSession, so a pod that has no record of the task (it was submitted
// by the previous pod of this caller) still gets its task_rejected to the
// app: the session id is the one the callee gives a task of this caller
// with that message id. Anything else of that session stays refused.
func TestRejectionWithoutRecordIsDelivered(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest and RabbitMQ")
	}
	a := newAPIBed(t)
	b := newBed(t, "lab")
	b.start(a.withAPI(a.writer(b)))
	taskID := envelope.NewMessageID()
	s := newScript(t, "lab", taskID, 3)
	rej, err := envelope.New(envelope.TypeTaskRejected, s.sessionID, task.TaskRejected{TaskMessageID: taskID, ReasonCode: task.ReasonNotAuthorized, Message: "no rule admits it"})
	if err != nil {
		t.Fatal(err)
	}
	c := b.callee("lab")
	c.publish(rej)
	c.publish(s.msgs[1]) // an event of the session: refused
	eventually(t, 10*time.Second, "the rejection at the app", func() error {
		if l, ok := b.app.Session(s.sessionID); !ok || l.Answer != "task_rejected" {
			return fmt.Errorf("app has %+v", l)
		}
		return nil
	})
	eventually(t, 10*time.Second, "the event refused", func() error {
		if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonUnsolicitedSession)); got != 1 {
			return fmt.Errorf("%s = %.0f, want 1", ReasonUnsolicitedSession, got)
		}
		return nil
	})
	if l, _ := b.app.Session(s.sessionID); len(l.Messages) != 1 {
		t.Errorf("the app got %d messages of the session, want the rejection alone", len(l.Messages))
	}
}
