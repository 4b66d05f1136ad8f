package callee

import (
	"bytes"
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// writesDown fails every write to HCPSessions and ConfigMaps while down is
// set: an API server outage as the owner sees it (reads still work through
// the bed's uncached reader).
type writesDown struct {
	client.Client
	down *atomic.Bool
}

func (c writesDown) fail(obj client.Object) error {
	switch obj.(type) {
	case *v1alpha1.HCPSession, *corev1.ConfigMap:
		if c.down.Load() {
			return apierrors.NewServiceUnavailable("test: the API server is down")
		}
	}
	return nil
}

func (c writesDown) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
	if err := c.fail(obj); err != nil {
		return err
	}
	return c.Client.Patch(ctx, obj, p, opts...)
}

func (c writesDown) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := c.fail(obj); err != nil {
		return err
	}
	return c.Client.Update(ctx, obj, opts...)
}

func (c writesDown) Status() client.SubResourceWriter {
	return downStatus{SubResourceWriter: c.Client.Status(), c: c}
}

type downStatus struct {
	client.SubResourceWriter
	c writesDown
}

func (s downStatus) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := s.c.fail(obj); err != nil {
		return err
	}
	return s.SubResourceWriter.Patch(ctx, obj, p, opts...)
}

// A completion during an API server outage is published only once its
// outcome is recorded: nothing while the outage lasts (complete answers 503
// and the harness retries), task_completed exactly once after it, with the
// terminal record and the COMPLETED status stored.
func TestNoCompletionLostInAnAPIOutage(t *testing.T) {
	var down atomic.Bool
	b := newBed(t, bedOptions{wrapClient: func(c client.Client) client.Client { return writesDown{Client: c, down: &down} }})
	sid := b.startSlow(`{"steps":4,"step_ms":300}`)
	b.waitEpoch(sid, 1)
	down.Store(true)
	time.Sleep(4 * time.Second) // the harness finished and keeps retrying complete
	if n := countType(b.messages(sid), envelope.TypeTaskCompleted); n != 0 {
		t.Fatalf("task_completed published during the outage, before its outcome was recorded: %s", summary(b.messages(sid)))
	}
	down.Store(false)
	b.waitMessage(sid, 30*time.Second, "session_closed", isEvent(session.EventSessionClosed))
	hs := b.waitState(sid, v1alpha1.SessionCompleted, 20*time.Second)
	if n := countType(b.messages(sid), envelope.TypeTaskCompleted); n != 1 {
		t.Fatalf("%d task_completed", n)
	}
	rec := terminalOf(hs)
	if rec == nil || rec.Epoch != 1 || rec.Status.State != v1alpha1.SessionCompleted {
		t.Fatalf("terminal record %+v", rec)
	}
	checkSequences(t, b.events(sid))
}

// A session whose owner recorded its outcome and was lost before publishing
// it (or before writing the terminal status) is finished by the next owner
// from the record: the same messages, byte for byte, and the terminal
// status; the task is never handed to a harness again, although a
// checkpoint would allow resuming it.
func TestNewOwnerReplaysTheTerminalRecord(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true})
	sid := b.orphan("vanished-pod", v1alpha1.SessionRunning, 7)
	hs := b.hcpSession(sid)
	b.saveCheckpoint(sid, orphanTask(t, sid, `{"steps":12,"step_ms":20,"checkpoint_every":1}`),
		checkpoint.Checkpoint{ID: "ckpt-005", Resumable: true, Sequence: 7, State: []byte(`{"step":5}`)})

	now := time.Now()
	rec := terminalRecord{Epoch: 1}
	add := func(t envelope.MessageType, seq int64, payload any) {
		pub, err := envelope.NewPublishing(now, t, sid, payload, b.calleeU)
		must(b.t, err)
		rec.Messages = append(rec.Messages, recordedMessage{RoutingKey: topology.EventRoutingKey(callerID, sid, t), Seq: seq, Body: pub.Body})
	}
	ev := func(seq int64, d session.EventData) json.RawMessage {
		raw, err := json.Marshal(d)
		must(t, err)
		return session.EventPayload{EventType: d.EventType(), Sequence: seq, Data: raw}.AppendJSON(nil)
	}
	add(envelope.TypeEvent, 8, ev(8, &session.StateChangedData{FromState: session.StateRunning, ToState: session.StateCompleted, Reason: "completed"}))
	add(envelope.TypeTaskCompleted, 0, &task.TaskCompleted{Result: json.RawMessage(`"done"`), Summary: task.Summary{EventCount: 9, Duration: task.Duration(time.Second)}})
	add(envelope.TypeEvent, 9, ev(9, &session.SessionClosedData{FinalState: session.StateCompleted, Reason: "completed"}))
	rec.Status = v1alpha1.HCPSessionStatus{State: v1alpha1.SessionCompleted, Reason: "completed", LastSequence: 9, EventCount: 9,
		CompletedAt: &metav1.Time{Time: now.UTC().Truncate(time.Second)}, Result: &v1alpha1.SessionResult{Summary: "done"}}
	raw, err := json.Marshal(rec)
	must(t, err)
	hs.Annotations[AnnotationTerminalRecord] = string(raw)
	must(t, b.env.Client.Update(t.Context(), hs))

	b.start()
	b.waitMessage(sid, 30*time.Second, "session_closed", isEvent(session.EventSessionClosed))
	got := b.waitState(sid, v1alpha1.SessionCompleted, 20*time.Second)
	if n, _ := b.harness.Starts(sid); n != 0 {
		t.Fatalf("a session whose outcome was recorded ran on the harness again (%d starts)", n)
	}
	if got.Status.OwnerEpoch != 2 || got.Status.LastSequence != 9 || got.Status.Result == nil || got.Status.Result.Summary != "done" {
		t.Fatalf("status %+v", got.Status)
	}
	ms := b.messages(sid)
	if len(ms) != len(rec.Messages) {
		t.Fatalf("got %s, want the %d recorded messages", summary(ms), len(rec.Messages))
	}
	for i, m := range ms {
		if !bytes.Equal(m.d.Body, rec.Messages[i].Body) {
			t.Fatalf("message %d differs from the record:\n%s\n%s", i, m.d.Body, rec.Messages[i].Body)
		}
		if ownerEpoch(m.d.Headers) != 2 {
			t.Fatalf("message %d carries epoch %d, want 2", i, ownerEpoch(m.d.Headers))
		}
	}
}

// failedPatches counts the HCPSession metadata patches the API server
// refused (a failed JSON-patch test is one).
type failedPatches struct {
	client.Client
	n *atomic.Int32
}

func (c failedPatches) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	err := c.Client.Patch(ctx, obj, patch, opts...)
	if _, ok := obj.(*v1alpha1.HCPSession); ok && err != nil {
		c.n.Add(1)
	}
	return err
}

// A task that ends before the session's first status write (which stores
// the owner epoch) has landed: the terminal record's write does not first
// try a test of the epoch that cannot pass yet; it reads the object and
// writes conditional on what it read, refused by nothing.
func TestQuickTaskTerminalRecordWithoutAFailedPatch(t *testing.T) {
	var failed atomic.Int32
	b := newBed(t, bedOptions{wrapClient: func(c client.Client) client.Client { return failedPatches{Client: c, n: &failed} }})
	for range 3 {
		_, sid, _ := b.submit(newSubmit(nil))
		if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
			t.Fatalf("session_closed %+v", closed)
		}
		if hs := b.hcpSession(sid); hs.Labels[v1alpha1.LabelSessionState] != string(v1alpha1.SessionCompleted) {
			t.Fatalf("state label %q", hs.Labels[v1alpha1.LabelSessionState])
		}
	}
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d HCPSession metadata patches refused for 3 quick tasks; want none", n)
	}
}
