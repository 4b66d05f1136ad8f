package callee

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestDuplicateCannotExtendToken: whoever can write hcpsessions/status (the
// sidecar's ServiceAccount does) cannot get a longer-lived session token
// out of a duplicate task_submit. The token's iat is the HCPSession's
// spec.issuedAt (the submit's timestamp; its creationTimestamp for a
// session recorded before spec.issuedAt existed) and its exp adds
// spec.maxDuration, all immutable; the status fields are for display only.
func TestDuplicateCannotExtendToken(t *testing.T) {
	b := newBed(t, bedOptions{})
	_, sid, pub := b.submit(newSubmit(func(ts *task.TaskSubmit) {
		ts.Inputs = json.RawMessage(`{"steps":300,"step_ms":100}`)
		ts.Constraints.MaxDuration = task.Duration(10 * time.Minute)
	}))
	first := b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted))
	acc := acceptedOf(t, first)
	expect := token.Expectations{Issuer: calleeID, Audience: callerID, Subject: sid}
	claims, err := token.Verify(b.key.Public().(ed25519PublicKey), acc.SessionToken, expect, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	hs := b.waitState(sid, v1alpha1.SessionRunning, 5*time.Second)
	if hs.Spec.IssuedAt == nil {
		t.Fatal("the HCPSession has no spec.issuedAt")
	}
	issued := hs.Spec.IssuedAt.UTC()
	if !claims.IssuedAt.Equal(issued) || !claims.ExpiresAt.Equal(issued.Add(10*time.Minute)) || hs.Spec.MaxDuration != "PT10M" {
		t.Fatalf("claims iat %s exp %s; HCPSession issuedAt %s with maxDuration %s", claims.IssuedAt, claims.ExpiresAt, issued, hs.Spec.MaxDuration)
	}
	if hs.Status.StartedAt == nil || !hs.Status.StartedAt.Equal(hs.Spec.IssuedAt) || hs.Status.TokenExpiresAt == nil || !hs.Status.TokenExpiresAt.UTC().Equal(claims.ExpiresAt) {
		t.Fatalf("status startedAt %v tokenExpiresAt %v: want the token's times, for display", hs.Status.StartedAt, hs.Status.TokenExpiresAt)
	}

	// Someone holding the ServiceAccount's permissions rewrites the
	// status times, then replays the task_submit to get a fresh reply.
	tamper := client.RawPatch(types.MergePatchType, []byte(`{"status":{"startedAt":"2099-01-01T00:00:00Z","tokenExpiresAt":"2100-01-01T00:00:00Z"}}`))
	if err := b.env.Client.Status().Patch(t.Context(), hs, tamper); err != nil {
		t.Fatal(err)
	}
	b.publish(pub)
	testEventually(t, 20*time.Second, func() error {
		if n := countType(b.messages(sid), envelope.TypeTaskAccepted); n != 2 {
			return fmt.Errorf("%d task_accepted, want 2", n)
		}
		return nil
	})
	var replies []received
	for _, m := range b.messages(sid) {
		if m.env.Type == envelope.TypeTaskAccepted {
			replies = append(replies, m)
		}
	}
	if string(replies[1].d.Body) != string(first.d.Body) {
		t.Fatalf("the duplicate's reply differs from the original:\n%s\n%s", first.d.Body, replies[1].d.Body)
	}
	again, err := token.Verify(b.key.Public().(ed25519PublicKey), acceptedOf(t, replies[1]).SessionToken, expect, time.Now())
	if err != nil || !again.ExpiresAt.Equal(claims.ExpiresAt) {
		t.Fatalf("re-issued token: exp %v (%v), want %s", again.ExpiresAt, err, claims.ExpiresAt)
	}
	b.abort(sid, acc.SessionToken, "done")
	closedOf(t, b, sid)
}

// TestStateLabel: HCPSessions carry hcp.io/state equal to status.state, so
// `kubectl get hcps -l hcp.io/state=RUNNING` works, at the cost of one
// label write per state change the sidecar writes, none for the final
// state: that goes in the terminal record's write.
func TestStateLabel(t *testing.T) {
	b := newBed(t, bedOptions{})
	labelOf := func(sid string) string { return b.hcpSession(sid).Labels[v1alpha1.LabelSessionState] }
	selected := func(state v1alpha1.SessionState) map[string]bool {
		var list v1alpha1.HCPSessionList
		must(t, b.env.Client.List(t.Context(), &list, client.InNamespace(b.ns), client.MatchingLabels{v1alpha1.LabelSessionState: string(state)}))
		out := map[string]bool{}
		for _, hs := range list.Items {
			out[hs.Name] = true
		}
		return out
	}

	_, running, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":300,"step_ms":100}`) }))
	_, done, _ := b.submit(newSubmit(nil))
	closedOf(t, b, done)
	testbed.Eventually(t, 10*time.Second, "state labels", func(context.Context) error {
		for sid, want := range map[string]v1alpha1.SessionState{running: v1alpha1.SessionRunning, done: v1alpha1.SessionCompleted} {
			hs := b.hcpSession(sid)
			if got := hs.Labels[v1alpha1.LabelSessionState]; got != string(want) || hs.Status.State != want {
				return fmt.Errorf("session %s: label %q, state %q; want %s", sid, got, hs.Status.State, want)
			}
		}
		return nil
	})
	if s := selected(v1alpha1.SessionRunning); len(s) != 1 || !s[running] {
		t.Fatalf("-l hcp.io/state=RUNNING selects %v, want only %s", s, running)
	}
	// RUNNING→COMPLETED only: an admission without a concurrency limit is
	// created labelled RUNNING (a task the gate rejects has no HCPSession),
	// and COMPLETED is written with the terminal record.
	if n := testutil.ToFloat64(b.metrics.LabelWrites.WithLabelValues("ok")); n != 0 {
		t.Fatalf("%v label writes of their own, want none (created RUNNING, COMPLETED with the terminal record)", n)
	}

	// Abort the running one: it ends ABORTED, labelled so.
	acc := acceptedOf(t, b.waitMessage(running, time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))
	b.abort(running, acc.SessionToken, "stop")
	closedOf(t, b, running)
	testbed.Eventually(t, 10*time.Second, "ABORTED label", func(context.Context) error {
		if got := labelOf(running); got != string(v1alpha1.SessionAborted) {
			return fmt.Errorf("label %q", got)
		}
		return nil
	})
	if n := testutil.ToFloat64(b.metrics.LabelWrites.WithLabelValues("ok")); n > 1 {
		t.Fatalf("%v label writes after the abort, want at most 1 (ABORTING, which may be coalesced away; ABORTED goes with the terminal record)", n)
	}
	if n := testutil.ToFloat64(b.metrics.LabelWrites.WithLabelValues("error")); n != 0 {
		t.Fatalf("%v failed label writes", n)
	}
}

// Two callers may pick the same message id: each gets a task of its own.
// The dedup key is (callee, caller, message id), so the second is neither
// answered with the first's reply (its token) nor refused.
func TestSameMessageIDFromTwoCallers(t *testing.T) {
	b := newBed(t, bedOptions{policies: []v1alpha1.PolicyRule{{
		Name: "both", Callers: v1alpha1.CallerMatch{IDs: []string{callerID, "beta"}},
		Capabilities: []string{"analyze"}, MaxRiskLevel: v1alpha1.RiskR4,
	}}})
	beta := topology.Username(topology.RoleCaller, b.vhost, "beta")
	p := topology.CallerPermissions("beta")
	must(t, testbed.Answered(b.broker.API.PutUser(beta, rabbithole.UserSettings{Password: password, Tags: rabbithole.UserTags{}})))
	must(t, testbed.Answered(b.broker.API.UpdatePermissionsIn(b.vhost, beta, rabbithole.Permissions{Configure: p.Configure, Write: p.Write, Read: p.Read})))
	t.Cleanup(func() { _ = b.broker.DeleteUsers(beta) })
	admin, err := amqp.Dial(b.broker.AMQPURI(b.broker.Username, b.broker.Password, b.vhost))
	must(t, err)
	defer func() { _ = admin.Close() }()
	ach, err := admin.Channel()
	must(t, err)
	_, err = ach.QueueDeclare(topology.EventQueue("beta"), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	must(t, err)
	must(t, ach.QueueBind(topology.EventQueue("beta"), topology.EventBindingKey("beta"), topology.EventsExchange, false, nil))

	msgID, sidA, _ := b.submit(newSubmit(nil))
	accA := acceptedOf(t, b.waitMessage(sidA, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))

	// beta publishes its own task under the same message id.
	conn, err := amqp.Dial(b.broker.AMQPURI(beta, password, b.vhost))
	must(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	must(t, err)
	env, err := envelope.New(envelope.TypeTaskSubmit, "", newSubmit(func(ts *task.TaskSubmit) { ts.CallerID = "beta" }))
	must(t, err)
	env.MessageID = msgID
	pub, err := envelope.EncodePublishing(env, beta)
	must(t, err)
	must(t, ch.PublishWithContext(t.Context(), topology.CommandsExchange, calleeID, false, false, pub))
	ds, err := ch.Consume(topology.EventQueue("beta"), "", false, false, false, false, nil)
	must(t, err)
	var reply *envelope.Envelope
	for reply == nil {
		select {
		case d := <-ds:
			e, err := envelope.FromDelivery(d, 0)
			must(t, err)
			_ = d.Ack(false)
			if e.Type == envelope.TypeTaskAccepted || e.Type == envelope.TypeTaskRejected {
				reply = e
			}
		case <-time.After(20 * time.Second):
			t.Fatal("beta got no answer")
		}
	}
	if reply.Type != envelope.TypeTaskAccepted {
		t.Fatalf("beta's task was answered %s: %s", reply.Type, reply.Payload)
	}
	var accB task.TaskAccepted
	must(t, json.Unmarshal(reply.Payload, &accB))
	sidB := topology.SessionID(calleeID, "beta", msgID)
	if accB.SessionID != sidB || accB.SessionID == accA.SessionID || accB.SessionToken == accA.SessionToken {
		t.Fatalf("beta's session %s (token shared: %v), alpha's %s; want %s, a token of its own", accB.SessionID, accB.SessionToken == accA.SessionToken, accA.SessionID, sidB)
	}
	// The reply may come before the record (reply-first acceptance).
	var hs v1alpha1.HCPSession
	testEventually(t, 10*time.Second, func() error {
		return b.env.Client.Get(t.Context(), client.ObjectKey{Namespace: b.ns, Name: sidB}, &hs)
	})
	if hs.Spec.CallerID != "beta" {
		t.Fatalf("beta's HCPSession names caller %q", hs.Spec.CallerID)
	}
}

// A task decided by a sidecar of an earlier release (its HCPSession named
// by the legacy id, without the caller) and redelivered to this one is
// answered as a duplicate, never run a second time.
func TestRedeliveryOfALegacyDecision(t *testing.T) {
	b := newBed(t, bedOptions{})
	ts := newSubmit(nil)
	env, err := envelope.New(envelope.TypeTaskSubmit, "", ts)
	must(t, err)
	legacy := topology.LegacySessionID(calleeID, env.MessageID)
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	hs := &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: legacy, Namespace: b.ns,
			Labels: map[string]string{v1alpha1.LabelCalleeID: calleeID, v1alpha1.LabelCallerID: callerID}},
		Spec: v1alpha1.HCPSessionSpec{SessionID: legacy, CalleeID: calleeID, CallerID: callerID, Capability: "analyze",
			TaskMessageID: env.MessageID, RiskLevel: v1alpha1.RiskR1, DataClassification: v1alpha1.DataT1},
	}
	must(t, b.env.Client.Create(t.Context(), hs))
	hs.Status = v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRejected, Reason: string(task.ReasonNotAuthorized),
		Message: "decided before the upgrade", CompletedAt: &now,
		Error: &v1alpha1.SessionError{Code: string(task.ReasonNotAuthorized), Message: "decided before the upgrade"}}
	must(t, b.env.Client.Status().Update(t.Context(), hs))

	pub, err := envelope.EncodePublishing(env, b.callerU)
	must(t, err)
	b.publish(pub)
	rej := rejectedOf(t, b.waitMessage(legacy, 20*time.Second, "task_rejected", isType(envelope.TypeTaskRejected)))
	if rej.ReasonCode != task.ReasonNotAuthorized || rej.Message != "decided before the upgrade" {
		t.Fatalf("answered %+v, want the original rejection", rej)
	}
	var list v1alpha1.HCPSessionList
	must(t, b.env.Client.List(t.Context(), &list, client.InNamespace(b.ns)))
	if len(list.Items) != 1 || b.harness.Started() != 0 {
		t.Fatalf("%d HCPSessions, %d tasks started; want the legacy one only, none started", len(list.Items), b.harness.Started())
	}
}

// documentedMaxMessageSize is the broker's max_message_size docs/install.md
// sets (kubectl hcp doctor checks it too: DocumentedMaxMessageSize).
const documentedMaxMessageSize = 8 << 20

// Oversized messages get a clear answer and cost the sidecar nothing: a
// task_submit above the 1 MiB envelope limit is refused with malformed (and
// the size) before it is parsed; a hostile publish above the broker's
// max_message_size (at most 8 MiB, set by the test bed as docs/install.md
// says) is refused by the broker before any consumer buffers it. Either way
// the sidecar keeps serving.
//
// The broker's limit is not taken on trust: the test fails when rabbitmqctl
// reads a max_message_size above the documented one, and, whether or not
// it could read it, publishes one message just above the documented limit
// (so every larger one is refused too) and fails unless the broker refuses
// it.
func TestOversizedMessages(t *testing.T) {
	b := newBed(t, bedOptions{})
	big := newSubmit(func(ts *task.TaskSubmit) {
		ts.Inputs = json.RawMessage(`{"pad":"` + strings.Repeat("x", envelope.MaxEnvelopeBytes+512<<10) + `"}`)
	})
	_, sid, _ := b.submit(big)
	rej := rejectedOf(t, b.waitMessage(sid, 20*time.Second, "task_rejected", isType(envelope.TypeTaskRejected)))
	if rej.ReasonCode != task.ReasonMalformed || !strings.Contains(rej.Message, "bytes") {
		t.Fatalf("a 1.5 MiB task_submit was answered %+v, want malformed naming the size", rej)
	}

	limit, known := b.broker.MaxMessageSize()
	if known && limit > documentedMaxMessageSize {
		t.Fatalf("the broker's max_message_size is %d bytes, above the %d docs/install.md sets: a hostile publisher could make the sidecar buffer that much per delivery. "+
			"hack/testbed-rabbitmq.sh sets it at run time (RABBITMQ_MAX_MESSAGE_SIZE; a broker restart forgets it): run it again, or set max_message_size in rabbitmq.conf", limit, documentedMaxMessageSize)
	}
	setting := "unknown to this process (rabbitmqctl needs root or the rabbitmq user on the broker's host)"
	if known {
		setting = fmt.Sprintf("%d bytes", limit)
	}
	conn, err := amqp.Dial(b.broker.AMQPURI(b.callerU, password, b.vhost))
	must(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	must(t, err)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	hostile := make([]byte, documentedMaxMessageSize+1)
	_ = ch.PublishWithContext(t.Context(), topology.CommandsExchange, calleeID, false, false,
		amqp.Publishing{ContentType: envelope.ContentType, UserId: b.callerU, Body: hostile})
	select {
	case e := <-closed:
		if e == nil || e.Code != amqp.PreconditionFailed || !strings.Contains(e.Reason, "max size") {
			t.Fatalf("the broker closed the channel with %v, want PRECONDITION_FAILED naming the max size", e)
		}
		if known && !strings.Contains(e.Reason, fmt.Sprintf("max size %d", limit)) {
			t.Fatalf("the broker refused the publish with %q, not naming the max_message_size %d rabbitmqctl reads", e.Reason, limit)
		}
		t.Logf("a publish of %d bytes refused by the broker: %s", len(hostile), e.Reason)
	case <-time.After(30 * time.Second):
		t.Fatalf("the broker accepted a message of %d bytes: its max_message_size (%s) is above the %d docs/install.md sets", len(hostile), setting, documentedMaxMessageSize)
	}

	// The sidecar still serves.
	_, sid2, _ := b.submit(newSubmit(nil))
	b.waitMessage(sid2, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted))
	if n := b.queueDepth(topology.CommandQueue(calleeID)); n != 0 {
		t.Fatalf("%d messages left on the command queue", n)
	}
}

// TestRejectionFloodWritesNothing: a flood of task_submits the gate
// refuses (HCP_REJECT_FLOOD of them, default 2,000; docs/performance.md
// has the 10,000 run) gets a task_rejected each, leaves no HCPSession
// behind and a handful of aggregated Events on the Callee, not one object
// per submit; a redelivered copy of a rejected submit gets the identical
// reply.
func TestRejectionFloodWritesNothing(t *testing.T) {
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("HCP_REJECT_FLOOD")); err == nil && v > 0 {
		n = v
	}
	b := newBed(t, bedOptions{})
	start := time.Now()
	var firstPub amqp.Publishing
	var firstSID string
	for i := range n {
		_, sid, pub := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Capability = "restricted" }))
		if i == 0 {
			firstPub, firstSID = pub, sid
		}
	}
	testEventually(t, 5*time.Minute, func() error {
		if got := b.countReplies(envelope.TypeTaskRejected); got < n {
			return fmt.Errorf("%d of %d task_rejected", got, n)
		}
		return nil
	})
	took := time.Since(start)
	var sessions v1alpha1.HCPSessionList
	must(t, b.env.Client.List(t.Context(), &sessions, client.InNamespace(b.ns)))
	var evs corev1.EventList
	testbed.Eventually(t, 10*time.Second, "the rejection Events", func(ctx context.Context) error {
		if err := b.env.Client.List(ctx, &evs, client.InNamespace(b.ns)); err != nil {
			return err
		}
		if len(evs.Items) == 0 {
			return errors.New("no Event yet")
		}
		return nil
	})
	var counted int32
	for _, e := range evs.Items {
		counted += e.Count
	}
	t.Logf("%d rejected submits in %s (%.0f/s): %d HCPSessions, %d Event objects (counting %d)", n, took.Round(time.Millisecond),
		float64(n)/took.Seconds(), len(sessions.Items), len(evs.Items), counted)
	if len(sessions.Items) != 0 {
		t.Fatalf("%d HCPSessions after %d rejected submits, want 0", len(sessions.Items), n)
	}
	if len(evs.Items) > 50 {
		t.Fatalf("%d Event objects after %d rejected submits; the recorder should aggregate them", len(evs.Items), n)
	}

	// A redelivered copy of the first: the very same reply.
	before := b.messages(firstSID)
	b.publish(firstPub)
	testEventually(t, 20*time.Second, func() error {
		if got := len(b.messages(firstSID)); got != len(before)+1 {
			return fmt.Errorf("%d replies, want %d", got, len(before)+1)
		}
		return nil
	})
	again := b.messages(firstSID)
	if string(again[len(again)-1].d.Body) != string(before[0].d.Body) {
		t.Fatalf("the copy's reply differs:\n%s\n%s", before[0].d.Body, again[len(again)-1].d.Body)
	}
}
