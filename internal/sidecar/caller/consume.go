package caller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Reasons under which discarded deliveries are counted (metric
// hcp_sidecar_rejects_total).
const (
	ReasonMalformed     = "malformed"
	ReasonUnauthSender  = "unauthenticated_sender"
	ReasonSpoofedSender = "spoofed_sender"
	ReasonLateEvent     = "late_event"
	ReasonGapSkipped    = "gap_skipped"
	ReasonContradiction = "contradictory_answer"
)

// item is one decoded, validated delivery on its way through a session
// worker.
type item struct {
	d amqp.Delivery
	// dctx is the transport's per-delivery context: it ends when the
	// delivery's channel is gone (the delivery can no longer be settled).
	dctx   context.Context
	env    *envelope.Envelope
	sender string // callee id from the validated user_id

	event     *session.EventPayload
	eventData session.EventData
	// mark is the event's envelope.HeaderConfirmedThrough, if marked.
	mark   int64
	marked bool
	// epoch is the message's envelope.HeaderOwnerEpoch (0 without one).
	epoch     int64
	accepted  *task.TaskAccepted
	rejected  *task.TaskRejected
	completed *task.TaskCompleted
	failed    *task.TaskFailed

	settled atomic.Bool
	// holder counts the unsettled deliveries of the item's session worker.
	holder *atomic.Int32
}

func (it *item) stale() bool { return it.dctx != nil && it.dctx.Err() != nil }

// seq is the event's sequence (0 for other types).
func (it *item) seq() int64 {
	if it.event == nil {
		return 0
	}
	return it.event.Sequence
}

// handle is the transport.Handler: it runs on the consumer's goroutine, so
// it only decodes and dispatches; the session workers settle deliveries.
func (s *Sidecar) handle(ctx context.Context, d amqp.Delivery) {
	it, reason, err := s.decode(ctx, d)
	if err != nil {
		// It can never become valid: ack it so it does not block the queue.
		s.m.Rejects.WithLabelValues(reason).Inc()
		s.log.Info("Discarded an invalid delivery", "reason", reason, "error", err.Error(),
			"routingKey", d.RoutingKey, "messageID", d.MessageId, "userID", d.UserId, "redelivered", d.Redelivered)
		s.settle(&item{d: d, dctx: ctx}, true)
		return
	}
	s.m.MessagesIn.WithLabelValues(string(it.env.Type)).Inc()
	s.dispatch(it)
}

// decode validates a delivery end to end: envelope and AMQP properties,
// direction, routing key, sender identity (a callee of this vhost) and the
// payload of its type.
func (s *Sidecar) decode(ctx context.Context, d amqp.Delivery) (*item, string, error) {
	env, err := envelope.FromDelivery(d, 0)
	if err != nil {
		s.m.MessagesIn.WithLabelValues("invalid").Inc()
		return nil, ReasonMalformed, err
	}
	if !env.Type.IsEvent() {
		s.m.MessagesIn.WithLabelValues("invalid").Inc()
		return nil, ReasonMalformed, fmt.Errorf("message type %s does not belong on the event channel", env.Type)
	}
	// Identity first: an unauthenticated message's content is not worth
	// looking at.
	uid := envelope.Identity(d)
	if uid == "" {
		s.m.MessagesIn.WithLabelValues(string(env.Type)).Inc()
		return nil, ReasonUnauthSender, errors.New("no user_id: the sender is unauthenticated")
	}
	role, vhost, calleeID, err := topology.ParseUsername(uid)
	if err != nil {
		s.m.MessagesIn.WithLabelValues(string(env.Type)).Inc()
		return nil, ReasonUnauthSender, err
	}
	if role != topology.RoleCallee || vhost != s.cfg.Vhost {
		s.m.MessagesIn.WithLabelValues(string(env.Type)).Inc()
		return nil, ReasonUnauthSender, fmt.Errorf("sender %q is not a callee of vhost %q", uid, s.cfg.Vhost)
	}
	if d.RoutingKey != "" {
		callerID, sid, typ, err := topology.ParseEventRoutingKey(d.RoutingKey)
		switch {
		case err != nil:
			s.m.MessagesIn.WithLabelValues(string(env.Type)).Inc()
			return nil, ReasonMalformed, err
		case callerID != s.cfg.ID || !strings.EqualFold(sid, env.Session()) || typ != env.Type:
			s.m.MessagesIn.WithLabelValues(string(env.Type)).Inc()
			return nil, ReasonMalformed, fmt.Errorf("routing key %q does not match the envelope (session %s, type %s)", d.RoutingKey, env.Session(), env.Type)
		}
	}
	epoch, err := envelope.OwnerEpoch(d.Headers)
	if err != nil {
		s.m.MessagesIn.WithLabelValues(string(env.Type)).Inc()
		return nil, ReasonMalformed, err
	}
	it := &item{d: d, dctx: ctx, env: env, sender: calleeID, epoch: epoch}
	// Session ids are compared in canonical lowercase.
	sid := strings.ToLower(env.Session())
	it.env.SessionID = &sid
	var perr error
	switch env.Type {
	case envelope.TypeEvent:
		var p session.EventPayload
		if p, perr = session.UnmarshalEventPayload(env.Payload); perr == nil {
			it.eventData, perr = p.Decode()
			it.event = &p
			it.mark, it.marked = envelope.ConfirmedThrough(d.Headers)
		}
	case envelope.TypeTaskAccepted:
		var p task.TaskAccepted
		if perr = decodePayload(env.Payload, &p); perr == nil {
			if perr = p.Validate(); perr == nil && !strings.EqualFold(p.SessionID, sid) {
				perr = fmt.Errorf("payload session_id %s differs from the envelope's %s", p.SessionID, sid)
			}
			p.TaskMessageID = strings.ToLower(p.TaskMessageID)
			it.accepted = &p
		}
	case envelope.TypeTaskRejected:
		var p task.TaskRejected
		if perr = decodePayload(env.Payload, &p); perr == nil {
			perr = p.Validate()
			p.TaskMessageID = strings.ToLower(p.TaskMessageID)
			it.rejected = &p
		}
	case envelope.TypeTaskCompleted:
		var p task.TaskCompleted
		if perr = decodePayload(env.Payload, &p); perr == nil {
			perr = p.Validate()
			it.completed = &p
		}
	case envelope.TypeTaskFailed:
		var p task.TaskFailed
		if perr = decodePayload(env.Payload, &p); perr == nil {
			perr = p.Validate()
			it.failed = &p
		}
	}
	if perr != nil {
		s.m.MessagesIn.WithLabelValues(string(env.Type)).Inc()
		return nil, ReasonMalformed, fmt.Errorf("%s payload: %w", env.Type, perr)
	}
	return it, "", nil
}

// decodePayload decodes a payload; unknown fields are tolerated (tolerant
// reader, as package task documents).
func decodePayload(b []byte, v any) error {
	return json.Unmarshal(b, v)
}

// dispatch hands it to its session's worker, starting one if needed.
func (s *Sidecar) dispatch(it *item) {
	sid := it.env.Session()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		// Stopping (Drain, or Run's ctx ended): the workers finish what
		// they already have, and this is not theirs any more. Not settled:
		// when the channel closes the broker returns it to the head of the
		// queue, in order (a nack would send a quorum queue message to the
		// back, behind events that follow it).
		return
	}
	w := s.streams[sid]
	if w == nil {
		w = s.newStream(sid)
		s.streams[sid] = w
		s.workers.Add(1)
		go w.run()
	}
	s.dispatchedAt.Store(s.clk.Now().UnixNano())
	if s.mustRelease(w, it) {
		s.release(w, it)
		return
	}
	if !w.stalled.Load() && !w.gapped.Load() {
		s.movedAt.Store(s.clk.Now().UnixNano())
	}
	it.holder = &w.held
	w.held.Add(1)
	s.holding.Add(1)
	w.inbox.put(it)
	if w.asleep {
		s.wakeLocked(w)
	}
}
