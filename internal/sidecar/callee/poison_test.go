package callee

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// panicky panics while recording a task whose intent says so, as a bug
// in the sidecar or a library would: before the HCPSession is created
// ("panic before create") or right after ("panic after create").
type panicky struct{ client.Client }

func (c panicky) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	hs, ok := obj.(*v1alpha1.HCPSession)
	if !ok {
		return c.Client.Create(ctx, obj, opts...)
	}
	switch hs.Spec.Intent {
	case "panic before create":
		panic("test: a bug while recording the decision")
	case "panic after create":
		if err := c.Client.Create(ctx, obj, opts...); err != nil {
			return err
		}
		panic("test: a bug after recording the decision")
	}
	return c.Client.Create(ctx, obj, opts...)
}

// A task_submit whose processing panics is answered, not discarded: with
// no record, task_rejected (internal); with an undecided record, the record
// turns REJECTED (internal) and the same reply goes out. The command is
// acked once the reply is confirmed (the queue ends empty), the panic is
// counted (hcp_sidecar_rejects_total{reason="panic"}), and the sidecar
// goes on taking tasks.
func TestPanicWhileDecidingATaskRejectsIt(t *testing.T) {
	b := newBed(t, bedOptions{
		// A concurrency limit: an admission is recorded PENDING first,
		// then decided (so "panic after create" leaves it undecided).
		sessions:   v1alpha1.SessionsSpec{MaxConcurrent: new(int32(10))},
		wrapClient: func(c client.Client) client.Client { return panicky{c} },
	})
	for i, intent := range []string{"panic before create", "panic after create"} {
		_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Intent = intent }))
		rej := rejectedOf(t, b.waitMessage(sid, 20*time.Second, "task_rejected after "+intent, isType(envelope.TypeTaskRejected)))
		if rej.ReasonCode != task.ReasonInternal || !strings.Contains(rej.Message, "internal error") {
			t.Fatalf("%s: task_rejected %+v, want reason internal", intent, rej)
		}
		var hs v1alpha1.HCPSession
		err := b.env.Client.Get(t.Context(), client.ObjectKey{Namespace: b.ns, Name: sid}, &hs)
		switch intent {
		case "panic before create":
			if !apierrors.IsNotFound(err) {
				t.Fatalf("%s: HCPSession %v, %v; want none", intent, hs.Status, err)
			}
		default:
			if err != nil || hs.Status.State != v1alpha1.SessionRejected || hs.Status.Error == nil || hs.Status.Error.Code != string(task.ReasonInternal) {
				t.Fatalf("%s: HCPSession status %+v, %v; want REJECTED internal", intent, hs.Status, err)
			}
		}
		if n := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(rejectPanic)); n != float64(i+1) {
			t.Fatalf("rejects{panic} = %v, want %d", n, i+1)
		}
	}
	testEventually(t, 10*time.Second, func() error {
		if n := b.queueDepth(topology.CommandQueue(calleeID)); n != 0 {
			return fmt.Errorf("command queue holds %d messages", n)
		}
		return nil
	})
	if n := b.countReplies(envelope.TypeTaskRejected); n != 2 {
		t.Fatalf("%d task_rejected, want 2 (one per task)", n)
	}
	_, sid, _ := b.submit(newSubmit(nil))
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("a task after the failures: session_closed = %+v", closed)
	}
}

// Commands that cannot be answered (no authenticated sender, an event on
// the command queue, a malformed abort) are returned to the broker without
// requeueing: the command queue's dead-letter queue keeps them, where
// they were dropped before.
func TestUnanswerableCommandsAreDeadLettered(t *testing.T) {
	const dlq = "hcp.cmd.lab.dead"
	b := newBed(t, bedOptions{deadLetterQueue: dlq})
	env, err := envelope.New(envelope.TypeTaskSubmit, "", newSubmit(nil))
	must(t, err)
	noUser, err := envelope.EncodePublishing(env, b.callerU)
	must(t, err)
	noUser.UserId = ""
	b.publish(noUser)
	eventEnv, _ := envelope.New(envelope.TypeEvent, envelope.NewMessageID(), map[string]any{"event_type": "progress"})
	eventPub, _ := envelope.EncodePublishing(eventEnv, b.callerU)
	b.publish(eventPub)
	b.publish(amqp.Publishing{Type: "abort", MessageId: envelope.NewMessageID(), UserId: b.callerU, Body: []byte("not json")})
	testEventually(t, 20*time.Second, func() error {
		if n := b.queueDepth(dlq); n != 3 {
			return fmt.Errorf("dead-letter queue holds %d messages, want 3", n)
		}
		if n := b.queueDepth(topology.CommandQueue(calleeID)); n != 0 {
			return fmt.Errorf("command queue holds %d messages", n)
		}
		return nil
	})
}
