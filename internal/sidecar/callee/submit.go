package callee

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/internal/sidecar/tracing"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Labels of the rejects metric for messages that get no task_rejected.
const (
	rejectUnanswerable   = "unanswerable"    // no usable user_id: nobody to answer
	rejectUnexpectedType = "unexpected_type" // an event type on the command queue
	rejectAbortRefused   = "abort_refused"   // an abort that failed verification
	rejectDeliveryLimit  = "delivery_limit"  // an abort given up at the queue's delivery limit
)

// handle is the consumer's Handler: it must return promptly, so each
// delivery is processed on its own goroutine (the prefetch window bounds how
// many run at once). Every path settles the delivery exactly once.
func (s *Sidecar) handle(ctx context.Context, d amqp.Delivery) {
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		d, t := tracked(d)
		defer func() {
			if r := recover(); r != nil {
				// A bug must not crash the sidecar, loop the message, nor
				// lose it without a word (poison.go).
				s.afterPanic(ctx, d, t, r)
			}
		}()
		s.process(ctx, d)
	}()
}

func (s *Sidecar) process(ctx context.Context, d amqp.Delivery) {
	env, err := envelope.FromDelivery(d, envelope.MaxEnvelopeBytes)
	if err != nil {
		s.countIn("invalid")
		s.malformed(ctx, d, err)
		return
	}
	s.countIn(string(env.Type))
	switch env.Type {
	case envelope.TypeTaskSubmit:
		s.submit(ctx, d, env)
	case envelope.TypeAbort:
		s.abortCommand(ctx, d, env)
	default:
		s.log.Info("Discarded a message of a type that does not belong on a command queue", "type", env.Type, "messageId", env.MessageID, "userId", d.UserId)
		s.countReject(rejectUnexpectedType)
		s.deadLetter(d)
	}
}

// malformed answers a message that is not a valid envelope with
// task_rejected(malformed) when a reply address can be derived from its
// user_id, and dead-letters it otherwise. It is never requeued.
func (s *Sidecar) malformed(ctx context.Context, d amqp.Delivery, cause error) {
	callerID, idErr := identify(d.UserId, s.cfg.Vhost)
	log := s.log.WithValues("messageId", truncate(d.MessageId, 64), "userId", truncate(d.UserId, 80), "reason", oneLine(cause.Error(), 300))
	if idErr != nil {
		log.Info("Dead-lettered a malformed command from an unauthenticated sender", "identity", idErr.Error())
		s.countReject(rejectUnanswerable)
		s.deadLetter(d)
		return
	}
	if d.Type == string(envelope.TypeAbort) {
		// Aborts have no reply message; the sender learns nothing new.
		log.Info("Dead-lettered a malformed abort", "caller", callerID)
		s.countReject(string(task.ReasonMalformed))
		s.deadLetter(d)
		return
	}
	msgID := d.MessageId
	if msgID == "" {
		msgID = "unknown"
	}
	msgID = truncate(strings.ToLower(msgID), 120)
	sid := topology.SessionID(s.id, callerID, msgID)
	log.Info("Rejected a malformed command", "caller", callerID)
	s.replyRejected(ctx, d, callerID, sid, msgID, s.clk.Now(), task.ReasonMalformed, "malformed message: "+oneLine(cause.Error(), 900))
}

// command is a task_submit being processed.
type command struct {
	d        amqp.Delivery
	ts       *task.TaskSubmit
	callerID string // authenticated (user_id)
	sid      string
	msgID    string // lowercase
	// gate is what the gate decided on, once it ran.
	gate *policy.GateInput
	log  logr.Logger
	// trace is the W3C trace context the session will be created in: the
	// task_submit's, or with tracing on the gate span's (span).
	trace tracing.Context
	span  tracing.Span
	// iat is the session token's iat if the task is admitted: the
	// submit's timestamp (submitIAT); zero: the HCPSession's creation.
	iat time.Time
	// replied is set once a task_accepted went out for this command
	// before its HCPSession existed (accept.go).
	replied bool
}

// submit runs the gate for one task_submit.
func (s *Sidecar) submit(ctx context.Context, d amqp.Delivery, env *envelope.Envelope) {
	msgID := strings.ToLower(env.MessageID)
	log := s.log.WithValues("messageId", msgID)
	callerID, err := identify(d.UserId, s.cfg.Vhost)
	if err != nil {
		log.Info("Dead-lettered a task_submit that cannot be answered", "reason", err.Error())
		s.countReject(rejectUnanswerable)
		s.deadLetter(d)
		return
	}
	sid := topology.SessionID(s.id, callerID, msgID)
	log = log.WithValues("caller", callerID, "session", sid)

	ts, err := decodeSubmit(env.Payload)
	if err != nil {
		log.Info("Rejected a malformed task_submit", "reason", err.Error())
		s.replyRejected(ctx, d, callerID, sid, msgID, s.clk.Now(), task.ReasonMalformed, oneLine(err.Error(), 1000))
		return
	}
	c := &command{d: d, ts: ts, callerID: callerID, sid: sid, msgID: msgID, log: log, trace: tracing.FromAMQP(d.Headers),
		iat: submitIAT(env.Timestamp, s.clk.Now())}

	// A copy of this task_submit being decided on this replica right now:
	// wait for that decision and answer with it.
	s.mu.Lock()
	if s.shuttingDn {
		s.mu.Unlock()
		s.settle(d, false, true) // another replica (or the restarted one) takes it
		return
	}
	if ch, ok := s.deciding[sid]; ok {
		s.mu.Unlock()
		s.waitThen(ctx, ch, func() { s.duplicate(ctx, c, 1) })
		return
	}
	decided := make(chan struct{})
	s.deciding[sid] = decided
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.deciding, sid)
		s.mu.Unlock()
		close(decided)
	}()
	if tracing.Enabled() {
		c.span, c.trace = tracing.StartSpan("hcp.gate", oteltrace.SpanKindConsumer, c.trace,
			attribute.String("hcp.message_id", msgID), attribute.String("hcp.session_id", sid),
			attribute.String("hcp.caller_id", callerID), attribute.String("hcp.capability", ts.Capability))
		defer c.span.End()
	}
	s.decideTask(ctx, c, 0)
}

// decideTask runs expiry, dedup and the gate, then records and answers the
// decision. depth counts re-decisions after an orphaned record was cleared.
func (s *Sidecar) decideTask(ctx context.Context, c *command, depth int) {
	ts, log := c.ts, c.log
	now := s.clk.Now()
	// The cache answers the common case; after an orphaned record was
	// cleared, only the API server is trusted.
	var reader client.Reader = s.c
	if depth > 0 {
		reader = s.reader
	}
	var existing v1alpha1.HCPSession
	exists := reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: c.sid}, &existing) == nil
	if !exists {
		// Decided by a sidecar of an earlier release, under the id that
		// left the caller out: a duplicate all the same.
		legacy := topology.LegacySessionID(s.id, c.msgID)
		if reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: legacy}, &existing) == nil && existing.Spec.CallerID == c.callerID {
			c.sid, exists = legacy, true
			c.log = c.log.WithValues("session", legacy)
		}
	}

	// A task this replica rejected without a record gets the same reply.
	if !exists && s.rejectedBefore(ctx, c) {
		return
	}
	// Expiry comes before any side effect. An expired duplicate of a task
	// already answered still gets its original answer: a duplicate starts
	// nothing, and the caller must not see two different answers.
	if ts.Expired(now) && !exists {
		at := "expires_at " + fmtTime(ts.ExpiresAt)
		if ts.ExpiresAt == nil || (ts.Constraints.Deadline != nil && !now.Before(ts.Constraints.Deadline.Time)) {
			at = "constraints.deadline " + fmtTime(ts.Constraints.Deadline)
		}
		s.decideAndReply(ctx, c, nil, policy.Verdict{Reason: task.ReasonExpired,
			Message: fmt.Sprintf("the task expired (%s) before it could start (now %s)", at, now.UTC().Format(time.RFC3339))}, depth)
		return
	}
	if exists {
		s.duplicate(ctx, c, depth)
		return
	}

	// The session's duration counts from its iat, which a deadline cuts
	// short: the same maximum duration for every copy of the submit.
	in, cl, err := s.gateInput(ctx, c.callerID, ts, cmp.Or(c.iat, now))
	if err != nil {
		log.Error(err, "Failed to read what the gate needs")
		s.decideAndReply(ctx, c, cl, policy.Verdict{Reason: task.ReasonInternal, Message: "the callee could not evaluate the task: " + oneLine(err.Error(), 300)}, depth)
		return
	}
	c.gate = &in
	v := outlived(policy.Gate(in), c.iat, now)
	if ts.Constraints.DataClassification == "" {
		// The class the gate judged by is the session's (HCPSession spec,
		// the harness's task).
		ts.Constraints.DataClassification = v.DataClass
	}
	if v.Admitted {
		if err := s.harnessReachable(ctx); err != nil {
			v = policy.Verdict{Reason: task.ReasonHarnessUnavailable, Risk: v.Risk, Message: "the callee harness is not reachable: " + oneLine(err.Error(), 300)}
		}
	}
	s.decideAndReply(ctx, c, cl, v, depth)
}

// waitThen runs f once ch is closed (or after PendingWait).
func (s *Sidecar) waitThen(ctx context.Context, ch <-chan struct{}, f func()) {
	t := s.clk.NewTimer(s.t.PendingWait)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C():
	case <-ctx.Done():
		return // the delivery's channel is gone: it will come back
	}
	f()
}

// podAlive reports whether a pod of the namespace exists. Without
// permission to read pods it assumes so (and says so once).
func (s *Sidecar) podAlive(ctx context.Context, name string) bool {
	if name == s.pod {
		return true
	}
	var p metav1.PartialObjectMetadata
	p.SetGroupVersionKind(podGVK)
	err := s.reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: name}, &p)
	switch {
	case err == nil:
		return true // a terminating pod still runs its sidecar
	case apierrors.IsNotFound(err):
		return false
	default:
		s.podGoneWarn.Do(func() {
			s.log.Info("Cannot read pods; sessions of vanished replicas are left to their own recovery", "error", err.Error(), "pod", klog.KRef(s.ns, name))
		})
		return true
	}
}

func (s *Sidecar) countIn(t string) {
	if s.m != nil {
		s.m.MessagesIn.WithLabelValues(t).Inc()
	}
}

func (s *Sidecar) countOut(t string) {
	if s.m != nil {
		s.m.MessagesOut.WithLabelValues(t).Inc()
	}
}

func (s *Sidecar) countReject(reason string) {
	if s.m != nil {
		s.m.Rejects.WithLabelValues(reason).Inc()
	}
}

func fmtTime(t *task.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.String()
}

func truncateRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n])
}
