package callee

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// rejectPanic labels hcp_sidecar_rejects_total for a command whose
// processing panicked (a bug): counted once per delivery, whatever the
// answer.
const rejectPanic = "panic"

// settleTracker wraps a delivery's Acknowledger to know whether it was
// settled: a command that panicked after it was answered (and settled)
// gets no second answer.
type settleTracker struct {
	amqp.Acknowledger
	done atomic.Bool
}

func (t *settleTracker) Ack(tag uint64, multiple bool) error {
	t.done.Store(true)
	return t.Acknowledger.Ack(tag, multiple)
}

func (t *settleTracker) Nack(tag uint64, multiple, requeue bool) error {
	t.done.Store(true)
	return t.Acknowledger.Nack(tag, multiple, requeue)
}

func (t *settleTracker) Reject(tag uint64, requeue bool) error {
	t.done.Store(true)
	return t.Acknowledger.Reject(tag, requeue)
}

// tracked returns d with a settleTracker (nil when d has no Acknowledger).
func tracked(d amqp.Delivery) (amqp.Delivery, *settleTracker) {
	if d.Acknowledger == nil {
		return d, nil
	}
	t := &settleTracker{Acknowledger: d.Acknowledger}
	d.Acknowledger = t
	return d, t
}

// deadLetter returns d to the broker without requeueing it: with a
// dead-letter exchange on the command queue it is kept there, without one
// the broker drops it (as an ack would). Used for what cannot be answered;
// the caller counts it under its reason.
func (s *Sidecar) deadLetter(d amqp.Delivery) {
	s.settle(d, false, false)
}

// afterPanic settles a command whose processing panicked (r), so that
// nothing is lost without a word and nothing loops: a task_submit already
// answered stays answered; one with an authenticated caller gets the
// answer its HCPSession records, or task_rejected (internal), and is acked
// once that reply is confirmed; anything else goes to the dead-letter
// queue. If answering panics too, the command is dead-lettered.
func (s *Sidecar) afterPanic(ctx context.Context, d amqp.Delivery, t *settleTracker, r any) {
	log := s.log.WithValues("messageId", truncate(d.MessageId, 64), "type", truncate(d.Type, 32))
	log.Error(fmt.Errorf("panic: %v", r), "Failed to process a command", "stack", string(debug.Stack()))
	s.countReject(rejectPanic)
	if t != nil && t.done.Load() {
		log.Info("The command was answered and settled before the failure")
		return
	}
	defer func() {
		if r := recover(); r != nil {
			log.Error(fmt.Errorf("panic: %v", r), "Failed to answer a command that failed; dead-lettering it")
			s.deadLetter(d)
		}
	}()
	callerID, err := identify(d.UserId, s.cfg.Vhost)
	if err != nil || d.Type != string(envelope.TypeTaskSubmit) {
		log.Info("Dead-lettered a command that failed and cannot be answered")
		s.deadLetter(d)
		return
	}
	msgID := strings.ToLower(d.MessageId)
	if msgID == "" {
		msgID = "unknown"
	}
	msgID = truncate(msgID, 120)
	sid := topology.SessionID(s.id, callerID, msgID)
	log = log.WithValues("caller", callerID, "session", sid)
	var hs v1alpha1.HCPSession
	err = s.reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: sid}, &hs)
	switch {
	case apierrors.IsNotFound(err) || (err == nil && hs.Spec.CallerID != callerID):
		s.rejectAfterPanic(ctx, d, callerID, sid, msgID)
	case err != nil:
		log.Error(err, "Failed to read the HCPSession of a command that failed; the command will be retried")
		s.retryLater(ctx, d)
	default:
		s.answerRecorded(ctx, d, callerID, &hs)
	}
}

// panicMessage is the task_rejected message of a task that failed inside
// the callee sidecar.
const panicMessage = "the callee failed while processing the task (internal error); submit it again with a new message_id"

// rejectAfterPanic answers a task without a record with task_rejected
// (internal), remembered like the gate's rejections so that a redelivered
// copy gets the same reply, and task_failed with the same reason (the
// failure may have come after its task_accepted, before its create: the
// caller then keeps the acceptance and ends the session; one without it
// keeps the rejection).
func (s *Sidecar) rejectAfterPanic(ctx context.Context, d amqp.Delivery, callerID, sid, msgID string) {
	r := rejection{at: s.clk.Now().UTC().Truncate(time.Second), code: task.ReasonInternal, msg: panicMessage}
	if v, ok := s.rejections.Get(sid); ok {
		r = v.(rejection)
	} else {
		s.rejections.Add(sid, r)
	}
	pub, err := s.rejectedPublishing(sid, msgID, r.at, r.code, r.msg)
	if err == nil {
		err = s.publishConfirmed(s.life, topology.EventRoutingKey(callerID, sid, envelope.TypeTaskRejected), traced(pub, d))
		s.countOut(string(envelope.TypeTaskRejected))
	}
	if err == nil {
		// It may have failed after its task_accepted went out, before its
		// create (accept.go): end that acceptance too.
		err = s.sendFailed(callerID, sid, r.at, string(r.code), r.msg, true)
	}
	s.settleReply(ctx, d, s.log.WithValues("caller", callerID, "session", sid), topology.EventRoutingKey(callerID, sid, envelope.TypeTaskRejected), err)
}

// answerRecorded answers a task whose HCPSession exists with the decision
// it records; an undecided one (its decision was cut short by the
// failure) is recorded REJECTED (internal) first, with an optimistic lock.
func (s *Sidecar) answerRecorded(ctx context.Context, d amqp.Delivery, callerID string, hs *v1alpha1.HCPSession) {
	log := s.log.WithValues("caller", callerID, "session", hs.Name)
	if undecided(hs) {
		now := s.clk.Now().UTC().Truncate(time.Second)
		if err := s.casStatus(ctx, hs, func(st *v1alpha1.HCPSessionStatus) {
			st.State, st.PodName = v1alpha1.SessionRejected, s.pod
			st.Reason, st.Message = string(task.ReasonInternal), panicMessage
			st.Error = &v1alpha1.SessionError{Code: string(task.ReasonInternal), Message: panicMessage}
			st.CompletedAt = &metav1.Time{Time: now}
		}); err != nil {
			log.Error(err, "Failed to record the rejection of a task that failed; the command will be retried")
			s.retryLater(ctx, d)
			return
		}
		s.st.Seed(hs.Name, hs.Status, s.clk.Now())
		s.forgetWhenWritten(hs.Name)
	}
	typ := envelope.TypeTaskRejected
	pub, err := s.rejectedReply(hs)
	if hs.DecidedState() != v1alpha1.SessionRejected && hs.Spec.MaxDuration != "" {
		typ = envelope.TypeTaskAccepted
		pub, err = s.acceptedReply(hs)
	}
	if err != nil {
		log.Error(err, "Failed to rebuild the reply of a task that failed; dead-lettering it")
		s.deadLetter(d)
		return
	}
	log.Info("Answered a task that failed with the decision its HCPSession records", "reply", typ)
	s.sendReply(ctx, d, log, callerID, hs.Name, typ, pub)
}
