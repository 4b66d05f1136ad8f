package callee

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// holdStatus holds every HCPSession status write until release is closed,
// and counts them.
type holdStatus struct {
	client.Client
	release <-chan struct{}
	writes  *atomic.Int32
}

func (c holdStatus) Status() client.SubResourceWriter {
	return heldStatusWriter{SubResourceWriter: c.Client.Status(), release: c.release, writes: c.writes}
}

type heldStatusWriter struct {
	client.SubResourceWriter
	release <-chan struct{}
	writes  *atomic.Int32
}

func (w heldStatusWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if _, ok := obj.(*v1alpha1.HCPSession); ok {
		w.writes.Add(1)
		select {
		case <-w.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// An admission no concurrency limit applies to is decided by the
// HCPSession's create alone: task_accepted goes out while every status
// write is held (before, the RUNNING write came first, and nothing was
// answered until the API server took it). The object records the decision
// (annotation hcp.io/admitted, state label RUNNING), a duplicate submit
// meanwhile is answered with the same acceptance, and the RUNNING status
// lands once writes go through.
func TestAdmissionIsDecidedByTheCreate(t *testing.T) {
	release := make(chan struct{})
	var writes atomic.Int32
	b := newBed(t, bedOptions{wrapClient: func(c client.Client) client.Client {
		return holdStatus{Client: c, release: release, writes: &writes}
	}})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	msgID, sid, pub := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":1000,"step_ms":100}`) }))
	first := acceptedOf(t, b.waitMessage(sid, 20*time.Second, "task_accepted while status writes are held", isType(envelope.TypeTaskAccepted)))

	hs := b.hcpSession(sid)
	if hs.Annotations[v1alpha1.AnnotationAdmitted] != "true" || hs.Labels[v1alpha1.LabelSessionState] != string(v1alpha1.SessionRunning) {
		t.Fatalf("the created HCPSession does not record its admission: annotations %v, labels %v", hs.Annotations, hs.Labels)
	}
	if hs.Status.State != "" || hs.DecidedState() != v1alpha1.SessionRunning {
		t.Fatalf("status.state %q, decided state %q; want none written yet and RUNNING decided", hs.Status.State, hs.DecidedState())
	}

	b.waitEvent(EventTaskAccepted, "Accepted task "+msgID+" of caller "+callerID, "session "+sid)

	// A copy of the submit while the state is still unwritten: the same
	// acceptance, the same token.
	b.publish(pub)
	testEventually(t, 20*time.Second, func() error {
		if n := b.countReplies(envelope.TypeTaskAccepted); n < 2 {
			return fmt.Errorf("%d task_accepted, want the duplicate's too", n)
		}
		return nil
	})
	for _, m := range b.messages(sid) {
		if m.env.Type == envelope.TypeTaskAccepted {
			if again := acceptedOf(t, m); again.SessionToken != first.SessionToken {
				t.Fatal("the duplicate was answered with another session token")
			}
		}
	}

	close(release)
	released = true
	got := b.waitState(sid, v1alpha1.SessionRunning, 20*time.Second)
	if got.Status.PodName != b.pod || got.Status.Reason != "accepted" || got.Status.StartedAt == nil || got.Status.TokenExpiresAt == nil {
		t.Fatalf("status after the held writes went through: %+v", got.Status)
	}
	if writes.Load() == 0 {
		t.Fatal("no status write was held: the test proves nothing")
	}
}

// With a concurrency limit the create is only a claim: the recount decides,
// and the decision is the status write (no hcp.io/admitted).
func TestCountedAdmissionIsDecidedByItsStatus(t *testing.T) {
	b := newBed(t, bedOptions{sessions: v1alpha1.SessionsSpec{MaxConcurrent: new(int32(5))}})
	_, sid, _ := b.submit(newSubmit(nil))
	b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted))
	hs := b.hcpSession(sid)
	if _, ok := hs.Annotations[v1alpha1.AnnotationAdmitted]; ok {
		t.Fatalf("a counted admission carries %s", v1alpha1.AnnotationAdmitted)
	}
	if hs.Status.State == "" {
		t.Fatal("task_accepted went out before the counted decision was written")
	}
}

// A session admitted at its creation whose sidecar died before writing its
// state is a running session to take over (here: no checkpoint, so it
// fails harness_lost and the caller is told), never an undecided claim to
// delete and decide again: the caller may hold its acceptance.
func TestOrphanAdmittedAtCreationIsTakenOver(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true})
	msgID := envelope.NewMessageID()
	sid := deriveSID(msgID)
	must(t, b.env.Client.Create(t.Context(), &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: sid, Namespace: b.ns,
			Labels: map[string]string{v1alpha1.LabelCalleeID: calleeID, v1alpha1.LabelCallerID: callerID,
				v1alpha1.LabelSessionState: string(v1alpha1.SessionRunning)},
			Annotations: map[string]string{AnnotationSequenceCeiling: "1000", AnnotationDecidingPod: b.pod, v1alpha1.AnnotationAdmitted: "true"}},
		Spec: v1alpha1.HCPSessionSpec{SessionID: sid, CalleeID: calleeID, CallerID: callerID, Capability: "analyze",
			TaskMessageID: msgID, RiskLevel: v1alpha1.RiskR1, DataClassification: v1alpha1.DataT1, MaxDuration: "PT1H"},
	}))
	b.start()

	closed := closedOf(t, b, sid)
	if closed.FinalState != session.StateFailed || closed.Reason != codeHarnessLost {
		t.Fatalf("session_closed = %+v", closed)
	}
	b.waitMessage(sid, 5*time.Second, "task_failed", isType(envelope.TypeTaskFailed))
	hs := b.waitState(sid, v1alpha1.SessionFailed, 10*time.Second)
	if hs.Status.Reason != codeHarnessLost || hs.Status.PodName != b.pod {
		t.Fatalf("status %+v", hs.Status)
	}
	b.waitEventOn("HCPSession", sid, EventSessionTakenOver, "pod "+b.pod+") restarted without its session log")
	b.waitEventOn("HCPSession", sid, EventSessionFailed, "Ended FAILED", codeHarnessLost)
	b.waitEvent(EventSessionFailed, "Session "+sid+" of caller "+callerID, "ended FAILED")
	if n := b.countReplies(envelope.TypeTaskRejected); n != 0 {
		t.Fatalf("%d task_rejected for a session that was admitted", n)
	}
}
