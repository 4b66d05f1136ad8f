package callee

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// holdCreates holds every HCPSession create until release is closed (then
// makes it), or until its context ends (then makes none: a replica that
// died between its reply and its create).
type holdCreates struct {
	client.Client
	release <-chan struct{}
	held    *atomic.Int32
}

func (c holdCreates) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*v1alpha1.HCPSession); ok {
		c.held.Add(1)
		select {
		case <-c.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return c.Client.Create(ctx, obj, opts...)
}

// createGate holds the bed's HCPSession creates (holdCreates) until release
// is closed, counting them in held.
type createGate struct {
	release chan struct{}
	held    atomic.Int32
}

func newCreateGate() *createGate { return &createGate{release: make(chan struct{})} }

func (g *createGate) wrap(c client.Client) client.Client {
	return holdCreates{Client: c, release: g.release, held: &g.held}
}

// refuseCreates fails every HCPSession create with err.
type refuseCreates struct {
	client.Client
	err error
}

func (c refuseCreates) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*v1alpha1.HCPSession); ok {
		return c.err
	}
	return c.Client.Create(ctx, obj, opts...)
}

// submitAt publishes a task_submit stamped at (its envelope timestamp).
func (b *bed) submitAt(at time.Time, ts *task.TaskSubmit) (msgID, sid string, pub amqp.Publishing) {
	b.t.Helper()
	env, err := envelope.NewAt(at, envelope.TypeTaskSubmit, "", ts)
	must(b.t, err)
	pub, err = envelope.EncodePublishing(env, b.callerU)
	must(b.t, err)
	b.publish(pub)
	return env.MessageID, topology.SessionID(calleeID, callerID, env.MessageID), pub
}

// claimsOf verifies a task_accepted's session token with the bed's key.
func (b *bed) claimsOf(sid string, a task.TaskAccepted) *token.Claims {
	b.t.Helper()
	c, err := token.Verify(b.key.Public().(ed25519PublicKey), a.SessionToken,
		token.Expectations{Issuer: calleeID, Audience: callerID, Subject: sid, Leeway: time.Minute}, time.Now())
	must(b.t, err)
	return c
}

func (b *bed) sessionExists(sid string) bool {
	var hs v1alpha1.HCPSession
	err := b.env.Client.Get(b.t.Context(), client.ObjectKey{Namespace: b.ns, Name: sid}, &hs)
	if err != nil && !apierrors.IsNotFound(err) {
		b.t.Fatal(err)
	}
	return err == nil
}

// task_accepted goes out while the HCPSession's create is still in flight
// (no API write on the path to the answer), with a token whose iat is the
// task_submit's timestamp; the harness hears of the task only once the
// create succeeded, and the record's spec.issuedAt re-issues the same
// token to a later copy.
func TestAcceptedBeforeTheCreate(t *testing.T) {
	g := newCreateGate()
	b := newBed(t, bedOptions{wrapClient: g.wrap})
	stamp := time.Now().Add(-3 * time.Second)
	_, sid, pub := b.submitAt(stamp, newSubmit(nil))
	m := b.waitMessage(sid, 20*time.Second, "task_accepted while the create is held", isType(envelope.TypeTaskAccepted))
	acc := acceptedOf(t, m)
	if c := b.claimsOf(sid, acc); !c.IssuedAt.Equal(stamp.UTC().Truncate(time.Second)) {
		t.Fatalf("token iat %s, want the submit's timestamp %s", c.IssuedAt, stamp.UTC().Truncate(time.Second))
	}
	time.Sleep(300 * time.Millisecond)
	if n := b.harness.Started(); n != 0 || b.sessionExists(sid) {
		t.Fatalf("before the create: the harness started %d tasks, HCPSession exists %v", n, b.sessionExists(sid))
	}
	if g.held.Load() == 0 {
		t.Fatal("no create was held: the test proves nothing")
	}
	close(g.release)
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed %+v", closed)
	}
	hs := b.hcpSession(sid)
	if hs.Spec.IssuedAt == nil || !hs.Spec.IssuedAt.Time.Equal(stamp.UTC().Truncate(time.Second)) {
		t.Fatalf("spec.issuedAt %v, want %s", hs.Spec.IssuedAt, stamp.UTC().Truncate(time.Second))
	}
	if n := b.harness.Started(); n != 1 {
		t.Fatalf("the harness started %d tasks", n)
	}
	b.publish(pub)
	testEventually(t, 20*time.Second, func() error {
		if n := countType(b.messages(sid), envelope.TypeTaskAccepted); n != 2 {
			return fmt.Errorf("%d task_accepted, want the copy's too", n)
		}
		return nil
	})
	requireIdentical(t, b.messages(sid), envelope.TypeTaskAccepted)
}

// A replica that dies between its task_accepted and its create leaves no
// record: the redelivered command is decided again on another replica,
// which answers with the identical task_accepted (same session id, token,
// message id and timestamp), creates the one HCPSession and runs the task
// once.
func TestCrashBetweenReplyAndCreate(t *testing.T) {
	g := newCreateGate() // never closed: the create dies with its replica
	b := newBed(t, bedOptions{noStart: true})
	b.wrap = g.wrap
	b.start()
	_, sid, _ := b.submit(newSubmit(nil))
	b.waitMessage(sid, 20*time.Second, "task_accepted from the first replica", isType(envelope.TypeTaskAccepted))
	b.wrap = nil
	r2 := b.startReplica("callee-pod-1")
	b.stopSC() // its create is cut short: no record, the command returns to the queue

	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed %+v", closed)
	}
	if n := countType(b.messages(sid), envelope.TypeTaskAccepted); n != 2 {
		t.Fatalf("%d task_accepted, want one from each replica", n)
	}
	requireIdentical(t, b.messages(sid), envelope.TypeTaskAccepted)
	if n1, n2 := b.harness.Started(), r2.harness.Started(); n1 != 0 || n2 != 1 {
		t.Fatalf("harness starts: dead replica %d, second replica %d; want 0 and 1", n1, n2)
	}
	var list v1alpha1.HCPSessionList
	must(t, b.env.Client.List(t.Context(), &list, client.InNamespace(b.ns)))
	if len(list.Items) != 1 {
		t.Fatalf("%d HCPSessions", len(list.Items))
	}
	if n := countType(b.messages(sid), envelope.TypeTaskFailed) + countType(b.messages(sid), envelope.TypeTaskRejected); n != 0 {
		t.Fatalf("%d task_failed or task_rejected", n)
	}
	checkSequences(t, b.events(sid))
}

// When the redelivered command is refused on the second decision (here
// the policy was deleted in between), the caller may hold the first
// replica's task_accepted: the refusal comes with a task_failed that ends
// that session, and nothing runs.
func TestRedeliveredRefusalEndsTheAcceptance(t *testing.T) {
	g := newCreateGate()
	b := newBed(t, bedOptions{noStart: true})
	b.wrap = g.wrap
	b.start()
	_, sid, _ := b.submit(newSubmit(nil))
	b.waitMessage(sid, 20*time.Second, "task_accepted from the first replica", isType(envelope.TypeTaskAccepted))
	must(t, b.env.Client.Delete(t.Context(), &v1alpha1.CapabilityPolicy{ObjectMeta: metav1.ObjectMeta{Name: "lab-policy", Namespace: b.ns}}))
	b.wrap = nil
	r2 := b.startReplica("callee-pod-1")
	b.stopSC()

	rej := rejectedOf(t, b.waitMessage(sid, 20*time.Second, "task_rejected", isType(envelope.TypeTaskRejected)))
	failed := failedOf(t, b.waitMessage(sid, 20*time.Second, "task_failed", isType(envelope.TypeTaskFailed)))
	if rej.ReasonCode != task.ReasonNotAuthorized || failed.Code != string(task.ReasonNotAuthorized) || failed.Message != rej.Message {
		t.Fatalf("task_rejected %+v, task_failed %+v", rej, failed)
	}
	if b.sessionExists(sid) || b.harness.Started()+r2.harness.Started() != 0 {
		t.Fatal("a refused task was recorded or started")
	}
}

// A create the API server refuses (here: forbidden) ends the accepted
// session at once with task_failed session_not_recorded, nothing runs, the
// command is acknowledged, and a copy gets the same two answers.
func TestRefusedCreateEndsTheSession(t *testing.T) {
	refused := apierrors.NewForbidden(schema.GroupResource{Group: "hcp.io", Resource: "hcpsessions"}, "x", fmt.Errorf("test"))
	b := newBed(t, bedOptions{wrapClient: func(c client.Client) client.Client { return refuseCreates{Client: c, err: refused} }})
	_, sid, pub := b.submit(newSubmit(nil))
	b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted))
	f := failedOf(t, b.waitMessage(sid, 20*time.Second, "task_failed", isType(envelope.TypeTaskFailed)))
	if f.Code != codeNotRecorded || f.Recoverable {
		t.Fatalf("task_failed %+v, want %s, not recoverable", f, codeNotRecorded)
	}
	testEventually(t, 10*time.Second, func() error {
		if n := b.queueDepth(topology.CommandQueue(calleeID)); n != 0 {
			return fmt.Errorf("%d commands in the queue", n)
		}
		return nil
	})
	b.publish(pub)
	testEventually(t, 20*time.Second, func() error {
		if n := countType(b.messages(sid), envelope.TypeTaskFailed); n != 2 {
			return fmt.Errorf("%d task_failed, want the copy's too", n)
		}
		return nil
	})
	requireIdentical(t, b.messages(sid), envelope.TypeTaskAccepted)
	requireIdentical(t, b.messages(sid), envelope.TypeTaskFailed)
	if n := b.harness.Started(); n != 0 {
		t.Fatalf("the harness started %d tasks", n)
	}
}

// An API server that stays unreachable ends the accepted session after
// Timeouts.RecordWait with task_failed session_not_recorded (recoverable);
// once it is back, tasks run again.
func TestUnrecordableSessionFailsAfterRecordWait(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	b := newBed(t, bedOptions{timeouts: Timeouts{RecordWait: 2 * time.Second},
		wrapClient: func(c client.Client) client.Client { return apiDown{Client: c, down: &down} }})
	_, sid, _ := b.submit(newSubmit(nil))
	acc := b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted))
	fm := b.waitMessage(sid, 20*time.Second, "task_failed", isType(envelope.TypeTaskFailed))
	if f := failedOf(t, fm); f.Code != codeNotRecorded || !f.Recoverable {
		t.Fatalf("task_failed %+v, want %s, recoverable", f, codeNotRecorded)
	}
	if gap := fm.env.Timestamp.Sub(acc.env.Timestamp); gap < time.Second {
		t.Fatalf("task_failed %s after task_accepted: the create was not retried", gap)
	}
	down.Store(false)
	_, sid2, _ := b.submit(newSubmit(nil))
	if closed := closedOf(t, b, sid2); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed %+v", closed)
	}
}

// An abort that arrives before the create landed (the caller holds the
// token from task_accepted) waits for the session instead of being
// refused as one that does not exist.
func TestAbortBeforeTheCreate(t *testing.T) {
	g := newCreateGate()
	b := newBed(t, bedOptions{wrapClient: g.wrap})
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":300,"step_ms":100}`) }))
	acc := acceptedOf(t, b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))
	b.abort(sid, acc.SessionToken, "changed my mind")
	time.Sleep(500 * time.Millisecond)
	close(g.release)
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateAborted {
		t.Fatalf("session_closed %+v", closed)
	}
}

// A task_submit stamped ahead of the callee's clock (beyond the token
// leeway) would get a token not valid yet: it is recorded before it is
// answered, with the creation time as iat. One stamped so long ago that
// its maximum duration has passed is refused as expired.
func TestSubmitTimestampBounds(t *testing.T) {
	g := newCreateGate()
	b := newBed(t, bedOptions{wrapClient: g.wrap})
	_, ahead, _ := b.submitAt(time.Now().Add(time.Hour), newSubmit(nil))
	testEventually(t, 10*time.Second, func() error {
		if g.held.Load() == 0 {
			return fmt.Errorf("no create yet")
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	if n := countType(b.messages(ahead), envelope.TypeTaskAccepted); n != 0 {
		t.Fatal("a submit stamped an hour ahead was answered before its record existed")
	}
	close(g.release)
	acc := acceptedOf(t, b.waitMessage(ahead, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))
	hs := b.hcpSession(ahead)
	if c := b.claimsOf(ahead, acc); hs.Spec.IssuedAt != nil || !c.IssuedAt.Equal(hs.CreationTimestamp.Time) {
		t.Fatalf("token iat %s, spec.issuedAt %v, creation %s", c.IssuedAt, hs.Spec.IssuedAt, hs.CreationTimestamp)
	}

	_, stale, _ := b.submitAt(time.Now().Add(-2*time.Hour), newSubmit(nil)) // analyze: at most PT1H
	if rej := rejectedOf(t, b.waitMessage(stale, 20*time.Second, "task_rejected", isType(envelope.TypeTaskRejected))); rej.ReasonCode != task.ReasonExpired {
		t.Fatalf("task_rejected %+v, want expired", rej)
	}
}

func failedOf(t *testing.T, m received) task.TaskFailed {
	t.Helper()
	var f task.TaskFailed
	must(t, json.Unmarshal(m.env.Payload, &f))
	return f
}

// requireIdentical fails unless every message of type typ is the same
// body byte for byte.
func requireIdentical(t *testing.T, ms []received, typ envelope.MessageType) {
	t.Helper()
	var bodies []string
	for _, m := range ms {
		if m.env.Type == typ {
			bodies = append(bodies, string(m.d.Body))
		}
	}
	if len(bodies) == 0 {
		t.Fatalf("no %s", typ)
	}
	if i := slices.IndexFunc(bodies, func(s string) bool { return s != bodies[0] }); i > 0 {
		t.Fatalf("%s differ:\n%s\n%s", typ, bodies[0], bodies[i])
	}
}

// A running session keeps its token once, in the harness's task:
// session_created carries the token task_accepted did, and the session
// drops its own copy after it (about half a KiB per live session).
func TestRunningSessionKeepsOneToken(t *testing.T) {
	b := newBed(t, bedOptions{})
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) {
		ts.Inputs = json.RawMessage(`{"steps":30,"step_ms":50}`)
	}))
	acc := acceptedOf(t, b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))
	var created session.SessionCreatedData
	must(t, json.Unmarshal(eventOf(b.waitMessage(sid, 20*time.Second, "session_created", isEvent(session.EventSessionCreated))).Data, &created))
	if created.SessionToken == "" || created.SessionToken != acc.SessionToken {
		t.Fatalf("session_created's token %q, task_accepted's %q", created.SessionToken, acc.SessionToken)
	}
	ss := b.sc.session(sid)
	if ss == nil {
		t.Fatal("the session is not running")
	}
	must(t, ss.acquire(t.Context()))
	tok, task := ss.token, string(ss.task)
	ss.release()
	if tok != "" || !strings.Contains(task, acc.SessionToken) {
		t.Fatalf("the running session holds a token of its own (%d bytes); its task holds it: %v", len(tok), strings.Contains(task, acc.SessionToken))
	}
}
