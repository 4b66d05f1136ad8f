package caller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/transport"
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
	mark      int64
	marked    bool
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
	it := &item{d: d, dctx: ctx, env: env, sender: calleeID}
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
	select {
	case w.inbox <- it:
	default:
		// Cannot happen with the prefetch bounding what is unsettled, and
		// the consumer must never block. Left unsettled, it comes back
		// after the next reconnect.
		s.log.Error(errors.New("session worker inbox full"), "Left a delivery unsettled", "session", sid)
	}
}

// mustRelease reports whether it, an event for w, goes back to the queue
// rather than to w (see release): w cannot deliver now (its app is
// failing, or it waits for a gap to fill), it is not one of the events w
// waits for, and w holds its share of the prefetch window or, for a gap,
// the reorder buffers of all sessions together do; sessions whose app
// fails divide one share between them. Without these global shares, such
// sessions could fill the window between them, each below its own share:
// nothing more would arrive, the missing events behind them in the queue
// included (measured: 3 sessions, 2 of them with gaps or a failing app,
// stalled for good; see TestGapsDoNotFillTheWindow and
// TestPoisonedSessionDoesNotStallOthers).
func (s *Sidecar) mustRelease(w *stream, it *item) bool {
	if it.event == nil || w.fillsGap(it.seq()) {
		return false
	}
	held, share := int(w.held.Load()), s.holdCap()
	switch {
	case w.stalled.Load():
		// The sessions whose app fails share one half of the window.
		return held >= max(share/max(int(s.stalledSessions.Load()), 1), 1)
	case w.gapped.Load():
		return held >= share || int(s.buffered.Load()) >= share
	}
	return false
}

// fillsGap reports whether seq is the stream's next sequence or, behind a
// gap, one of the missing ones: such an event is never released. Released,
// it would go to the back of the queue, behind the session's later events,
// and every one of them would have to go round the queue before it comes
// back.
func (w *stream) fillsGap(seq int64) bool {
	next := w.next.Load()
	return seq == next || (w.gapped.Load() && seq > next && seq < w.gapEnd.Load())
}

// releaseDelay is how long a released delivery of a session whose app is
// failing is kept before it goes back to the queue, when no other session
// is moving: an immediate nack would have it delivered again at once, in a
// loop that helps nobody. While other sessions move, and always for a
// session waiting for a gap to fill, the release is immediate: a delayed
// release holds a prefetch slot meanwhile, and with the session's held
// share and its releases in their delay filling the window the consumer
// takes a few messages a second (measured: 6,000 events of 3 sessions
// stalled for minutes behind one gap). A gap fills only when the missing
// event comes round the queue, so the faster its session's later events go
// back, the sooner it does.
const releaseDelay = time.Second

// holdCap is how many unsettled deliveries a session that cannot deliver
// may hold: half the prefetch window, so that the other half keeps the
// other sessions moving.
func (s *Sidecar) holdCap() int { return max(1, s.cfg.Prefetch/2) }

// release returns an event of a session that cannot deliver now (its app
// is failing, or it waits for a gap to fill) and already holds its share
// of the prefetch window to the queue (after releaseDelay) instead of
// handing it to its worker; the event that fills the gap is never
// released. Without this, such a session would fill the window: the others
// would stall, and the missing event, queued behind, could never arrive.
// The session keeps the head of its stream held in place, so nothing it
// delivers later is out of order: the released events come back and are
// ordered by their sequence like any other. The worker remembers their
// sequences, so that it waits for them rather than skip them as a gap, and
// so that a terminal message is anchored after them. Unsequenced messages
// are never released (a session has at most a few).
func (s *Sidecar) release(w *stream, it *item) {
	w.noteReleased(it.seq(), s.clk.Now())
	if w.releasing.CompareAndSwap(false, true) {
		w.log.Info("This session cannot take more messages now (its app is failing, or a gap); returning its further deliveries to the queue so that other sessions go on",
			"held", w.held.Load(), "cap", s.holdCap(), "appFailing", w.stalled.Load(), "gap", w.gapped.Load())
	}
	s.m.Released.Inc()
	if w.stalled.Load() && s.clk.Now().Sub(time.Unix(0, s.movedAt.Load())) >= releaseDelay {
		s.clk.AfterFunc(releaseDelay, func() { s.settle(it, false) })
		return
	}
	s.settle(it, false)
}

// Held returns how many deliveries the session workers hold unsettled
// (for diagnostics and tests: with nothing in flight it is 0; a delivery
// counted and never settled nor forgotten is a leak that narrows the
// prefetch window for good).
func (s *Sidecar) Held() int { return int(s.holding.Load()) }

// forget marks a delivery whose channel is gone as settled without
// settling it (the broker redelivers it), so that it no longer counts as
// held.
func (s *Sidecar) forget(it *item) { s.markSettled(it) }

// markSettled marks it settled and no longer held, once: it reports
// whether this call did (the caller then sends the frame, if any).
func (s *Sidecar) markSettled(it *item) bool {
	if !it.settled.CompareAndSwap(false, true) {
		return false
	}
	if it.holder != nil {
		it.holder.Add(-1)
		s.holding.Add(-1)
	}
	return true
}

// ackAll acks items once each, with as few frames as is safe
// (transport.AckAll: one ack with multiple=true for a burst below every
// other unsettled delivery of its channel).
func (s *Sidecar) ackAll(items []*item) {
	ds := make([]amqp.Delivery, 0, len(items))
	for _, it := range items {
		if s.markSettled(it) {
			ds = append(ds, it.d)
		}
	}
	if len(ds) == 0 {
		return
	}
	if err := transport.AckAll(ds); err != nil {
		s.log.V(1).Info("Could not ack deliveries; the broker redelivers them", "error", err.Error())
	}
}

// settle acks (ack=true) or nacks with requeue, once. Errors are logged: a
// delivery from a closed channel cannot be settled and comes back. Only
// deliveries that were never handed to a session are nacked: on a quorum
// queue a nacked message goes to the back of the queue, so a nack would
// reorder a session's stream (release: the worker reorders by sequence).
func (s *Sidecar) settle(it *item, ack bool) {
	if !s.markSettled(it) {
		return
	}
	var err error
	if ack {
		err = it.d.Ack(false)
	} else {
		err = it.d.Nack(false, true)
	}
	if err != nil {
		s.log.V(1).Info("Could not settle a delivery; the broker redelivers it", "ack", ack, "error", err.Error())
	}
}
