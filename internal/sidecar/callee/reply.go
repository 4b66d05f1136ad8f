package callee

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/tracing"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// sessionClaims are the session token's claims, derived only from what
// nobody can change after the HCPSession's creation: spec.issuedAt (iat:
// the task_submit's timestamp, whole seconds), or for a session without it
// its creation time (set by the API server), and its spec (callee id,
// caller, capability, risk, and maxDuration for exp; CEL keeps them
// immutable). Nothing comes from status, which the sidecar's
// ServiceAccount (and so anyone who holds its token) may write: a
// re-issued token is the original byte for byte, and writing
// status.tokenExpiresAt cannot extend it. With spec.issuedAt the claims
// exist before the object does: the reply can go out before the create
// (accept.go).
func sessionClaims(calleeID string, hs *v1alpha1.HCPSession) (token.Claims, error) {
	iat := hs.CreationTimestamp.Time
	if hs.Spec.IssuedAt != nil {
		iat = hs.Spec.IssuedAt.Time
	}
	if iat.IsZero() {
		return token.Claims{}, errors.New("the HCPSession has neither spec.issuedAt nor a creationTimestamp")
	}
	if hs.Spec.MaxDuration == "" {
		return token.Claims{}, errors.New("the HCPSession has no spec.maxDuration: it was not admitted")
	}
	d, err := task.ParseDuration(string(hs.Spec.MaxDuration))
	if err != nil {
		return token.Claims{}, fmt.Errorf("spec.maxDuration: %w", err)
	}
	return token.NewClaims(calleeID, hs.Spec.CallerID, hs.Name, hs.Spec.Capability, task.RiskLevel(hs.Spec.RiskLevel), iat, d), nil
}

// acceptedReply rebuilds the task_accepted of an accepted session from the
// stored object's immutable part (sessionClaims); the original and every
// duplicate are byte for byte equal.
func (s *Sidecar) acceptedReply(hs *v1alpha1.HCPSession) (amqp.Publishing, error) {
	claims, err := sessionClaims(s.id, hs)
	if err != nil {
		return amqp.Publishing{}, err
	}
	tok, err := token.Issue(s.keys.signer(), claims)
	if err != nil {
		return amqp.Publishing{}, err
	}
	payload := task.TaskAccepted{
		TaskMessageID: hs.Spec.TaskMessageID,
		SessionID:     hs.Name,
		SessionToken:  tok,
		RiskLevel:     claims.Risk,
		ExpiresAt:     task.NewTimestamp(claims.ExpiresAt),
	}
	pub, err := s.replyPublishing(hs.Name, envelope.TypeTaskAccepted, claims.IssuedAt, payload)
	if err == nil {
		// A duplicate's reply (rebuilt on any replica) carries the epoch
		// stored with the session, as the original did.
		pub.Headers = withEpoch(pub.Headers, storedEpoch(hs))
	}
	return pub, err
}

// rejectedReply rebuilds the task_rejected of a rejected session.
func (s *Sidecar) rejectedReply(hs *v1alpha1.HCPSession) (amqp.Publishing, error) {
	at, code, msg := recordedRejection(hs)
	return s.rejectedPublishing(hs.Name, hs.Spec.TaskMessageID, at, code, msg)
}

// recordedRejection is when and why a rejected session was rejected.
func recordedRejection(hs *v1alpha1.HCPSession) (at time.Time, code task.ReasonCode, msg string) {
	code, msg = task.ReasonInternal, "rejected"
	if e := hs.Status.Error; e != nil {
		code, msg = task.ReasonCode(e.Code), e.Message
	}
	at = hs.CreationTimestamp.Time
	if hs.Status.CompletedAt != nil {
		at = hs.Status.CompletedAt.Time
	}
	return at, code, msg
}

func (s *Sidecar) rejectedPublishing(sid, msgID string, at time.Time, code task.ReasonCode, msg string) (amqp.Publishing, error) {
	if strings.TrimSpace(msg) == "" {
		msg = string(code)
	}
	return s.replyPublishing(sid, envelope.TypeTaskRejected, at, task.TaskRejected{TaskMessageID: msgID, ReasonCode: code, Message: msg})
}

// replyPublishing builds the envelope of a reply with a message id derived
// from the session id, so a re-sent reply is the same message.
func (s *Sidecar) replyPublishing(sid string, t envelope.MessageType, at time.Time, payload any) (amqp.Publishing, error) {
	raw, err := json.Marshal(payload)
	if err != nil {
		return amqp.Publishing{}, err
	}
	env := &envelope.Envelope{
		HCPVersion: envelope.Version,
		MessageID:  derivedID("reply", sid),
		Timestamp:  at.UTC().Truncate(time.Millisecond),
		SessionID:  &sid,
		Type:       t,
		Payload:    raw,
	}
	return envelope.EncodePublishing(env, s.username)
}

// derivedID is a deterministic id in UUID v4 form.
func derivedID(parts ...string) string {
	h := sha256.New()
	h.Write([]byte("hcp.io/callee-sidecar/v1"))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	var u uuid.UUID
	copy(u[:], h.Sum(nil))
	u[6] = (u[6] & 0x0f) | 0x40
	u[8] = (u[8] & 0x3f) | 0x80
	return u.String()
}

// replyRejected publishes a task_rejected with no HCPSession behind it.
func (s *Sidecar) replyRejected(ctx context.Context, d amqp.Delivery, callerID, sid, msgID string, at time.Time, code task.ReasonCode, msg string) {
	if s.sendRejected(ctx, d, callerID, sid, msgID, at, code, msg) {
		s.countReject(string(code))
	}
}

// sendRejected builds and sends a task_rejected, reporting whether it
// could be built (if not, the command is discarded).
func (s *Sidecar) sendRejected(ctx context.Context, d amqp.Delivery, callerID, sid, msgID string, at time.Time, code task.ReasonCode, msg string) bool {
	pub, err := s.rejectedPublishing(sid, msgID, at, code, msg)
	if err != nil {
		s.log.Error(err, "Failed to build task_rejected")
		s.settle(d, true, false)
		return false
	}
	s.sendReply(ctx, d, s.log.WithValues("caller", callerID, "session", sid), callerID, sid, envelope.TypeTaskRejected, pub)
	return true
}

// sendReply publishes a reply to the authenticated caller and settles the
// command (settleReply).
func (s *Sidecar) sendReply(ctx context.Context, d amqp.Delivery, log logr.Logger, callerID, sid string, t envelope.MessageType, pub amqp.Publishing) {
	rk := topology.EventRoutingKey(callerID, sid, t)
	err := s.publishConfirmed(s.life, rk, traced(pub, d))
	s.countOut(string(t))
	s.settleReply(ctx, d, log, rk, err)
}

// traced gives a reply without a session (no headers: a rejection) the
// trace of the command it answers.
func traced(pub amqp.Publishing, d amqp.Delivery) amqp.Publishing {
	if pub.Headers == nil {
		pub.Headers = tracing.FromAMQP(d.Headers).AMQPHeaders()
	}
	return pub
}

// settleReply settles a command once its reply (routing key rk) was
// published with result err: ack once confirmed; ack too when the
// caller's queue does not exist (retrying cannot help and would block the
// queue); requeue after a pause on transient failures.
func (s *Sidecar) settleReply(ctx context.Context, d amqp.Delivery, log logr.Logger, rk string, err error) {
	switch {
	case err == nil:
		s.settle(d, true, false)
	case errors.Is(err, transport.ErrUnroutable):
		log.Error(err, "Reply unroutable: the caller's event queue does not exist; discarded the command", "routingKey", rk)
		s.settle(d, true, false)
	default:
		log.Error(err, "Failed to publish the reply; the command will be retried")
		s.retryLater(ctx, d)
	}
}

// settleAfter acks d once p is confirmed.
func (s *Sidecar) settleAfter(ctx context.Context, d amqp.Delivery, log logr.Logger, p *pending) {
	if p == nil {
		s.settle(d, true, false)
		return
	}
	select {
	case <-p.done:
	case <-s.life.Done():
		s.settle(d, false, true)
		return
	}
	switch {
	case p.err == nil:
		s.settle(d, true, false)
	case errors.Is(p.err, transport.ErrUnroutable):
		log.Error(p.err, "task_accepted unroutable: the caller's event queue does not exist")
		s.settle(d, true, false)
	default:
		// The session is recorded RUNNING: a redelivery re-sends the
		// same task_accepted.
		log.Error(p.err, "Failed to publish task_accepted; the command will be redelivered")
		s.retryLater(ctx, d)
	}
}

// publishConfirmed publishes a reply and waits for the confirm,
// republishing it (same message) after a lost connection or a nack, at most
// 8 times: a reply that cannot be sent is retried through the command
// queue (retryLater) instead.
func (s *Sidecar) publishConfirmed(ctx context.Context, rk string, pub amqp.Publishing) error {
	return s.retry().Publish(ctx, s.pub, topology.EventsExchange, rk, pub)
}

func (s *Sidecar) retry() transport.Retry { return transport.Retry{Max: 8, After: s.clk.After} }

// retryLater returns the command to the queue after a pause, so a transient
// failure (API server, broker) is retried, unless returning it would exceed
// the queue's delivery limit (spec.commandQueue.deliveryLimit), past which
// the broker drops it silently: then giveUp answers instead.
func (s *Sidecar) retryLater(ctx context.Context, d amqp.Delivery) {
	if limit, last := s.lastDelivery(ctx, d); last {
		s.giveUp(d, limit)
		return
	}
	select {
	case <-ctx.Done():
		return // channel gone: the broker requeues it anyway
	case <-s.clk.After(time.Second):
	}
	s.settle(d, false, true)
}

// lastDelivery reports whether d may not be returned to its queue again:
// quorum queues count returns in x-delivery-count and drop a message
// returned more than x-delivery-limit times.
func (s *Sidecar) lastDelivery(ctx context.Context, d amqp.Delivery) (limit int64, last bool) {
	c, err := s.callee(ctx)
	if err != nil || c.Spec.CommandQueue.DeliveryLimit == nil {
		return 0, false
	}
	limit = int64(*c.Spec.CommandQueue.DeliveryLimit)
	return limit, deliveryCount(d)+1 > limit
}

// deliveryCount is how often d was returned to its queue before.
func deliveryCount(d amqp.Delivery) int64 {
	switch n := d.Headers["x-delivery-count"].(type) {
	case int64:
		return n
	case int32:
		return int64(n)
	case int16:
		return int64(n)
	case int8:
		return int64(n)
	case int:
		return int64(n)
	}
	return 0
}

// giveUp settles a command that cannot be retried without the broker
// dropping it, so that nothing disappears without a word: a task_submit is
// rejected to its authenticated caller (reason internal; it may submit
// again), anything else is logged as an error and counted. The reply is
// published once, without retrying through the queue.
func (s *Sidecar) giveUp(d amqp.Delivery, limit int64) {
	log := s.log.WithValues("messageId", truncate(d.MessageId, 64), "type", d.Type, "deliveries", deliveryCount(d)+1, "deliveryLimit", limit)
	callerID, err := identify(d.UserId, s.cfg.Vhost)
	if err != nil || d.Type != string(envelope.TypeTaskSubmit) {
		log.Error(err, "Gave up on a command at its queue's delivery limit; dead-lettered it")
		s.countReject(rejectDeliveryLimit)
		s.deadLetter(d)
		return
	}
	msgID := truncate(strings.ToLower(d.MessageId), 120)
	sid := topology.SessionID(s.id, callerID, msgID)
	msg := fmt.Sprintf("the callee could not process the task within its command queue's delivery limit (%d deliveries; "+
		"its Kubernetes API or the broker was unavailable); submit it again with a new message_id", limit)
	now := s.clk.Now()
	pub, err := s.rejectedPublishing(sid, msgID, now, task.ReasonInternal, msg)
	if err == nil {
		err = s.publishConfirmed(s.life, topology.EventRoutingKey(callerID, sid, envelope.TypeTaskRejected), pub)
		s.countOut(string(envelope.TypeTaskRejected))
	}
	if err == nil && s.session(sid) == nil && !s.admittedRecord(sid) {
		// A replica may have accepted it and stopped before its create
		// (accept.go): end that acceptance too.
		err = s.sendFailed(callerID, sid, now, string(task.ReasonInternal), msg, true)
	}
	s.countReject(string(task.ReasonInternal))
	if err != nil {
		log.Error(err, "Gave up on a task at its queue's delivery limit and could not tell its caller", "caller", callerID)
	} else {
		log.Error(nil, "Gave up on a task at its queue's delivery limit; rejected it to its caller", "caller", callerID, "session", sid)
	}
	s.settle(d, true, false)
}

// settle acks (ack=true) or nacks (requeue) a delivery, logging failures: a
// stale delivery (its channel closed) is redelivered by the broker.
func (s *Sidecar) settle(d amqp.Delivery, ack, requeue bool) {
	var err error
	if ack {
		err = d.Ack(false)
	} else {
		err = d.Nack(false, requeue)
	}
	if err != nil {
		if errors.Is(err, transport.ErrStaleDelivery) || errors.Is(err, amqp.ErrClosed) {
			s.log.V(1).Info("Could not settle a delivery from a closed channel; the broker redelivers it", "messageId", d.MessageId)
			return
		}
		s.log.Error(err, "Failed to settle a delivery", "messageId", d.MessageId)
	}
}
