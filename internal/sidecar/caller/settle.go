package caller

import (
	"sync"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/transport"
)

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

// ackAll acks items once each, with as few frames as is safe
// (transport.AckAll: one ack with multiple=true for a burst below every
// other unsettled delivery of its channel).
func (s *Sidecar) ackAll(items []*item) {
	// The copies of the deliveries go in a pooled slice: an amqp.Delivery
	// is some 300 bytes, and a slice of them per group commit was one of
	// the larger allocations per event.
	p := deliveriesPool.Get().(*[]amqp.Delivery)
	ds := (*p)[:0]
	defer func() {
		clear(ds)
		*p = ds[:0]
		deliveriesPool.Put(p)
	}()
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

// deliveriesPool holds ackAll's slices (*[]amqp.Delivery).
var deliveriesPool = sync.Pool{New: func() any { return new([]amqp.Delivery) }}

// ackBatch is the deliveries whose acks wait for one group commit.
type ackBatch struct {
	t     *Ticket
	items []*item
}

// ackAfter acks items once t is done (the fsync that covers their
// records has returned). Every delivery queued for one ticket, of every
// session, goes in one ackAll: one basic.ack frame with multiple=true per
// group commit where that is safe, not one per event.
func (s *Sidecar) ackAfter(t *Ticket, items []*item) {
	s.ackMu.Lock()
	for _, b := range s.acks {
		if b.t == t {
			b.items = append(b.items, items...)
			s.ackMu.Unlock()
			return
		}
	}
	s.acks = append(s.acks, &ackBatch{t: t, items: items})
	s.ackMu.Unlock()
	// Registered once per ticket, before the callbacks of the sessions
	// that queue items after this one; if t is done already it runs now.
	t.Then(func(error) { s.ackBatchOf(t) })
}

// ackBatchOf acks the deliveries queued for t (ackAfter).
func (s *Sidecar) ackBatchOf(t *Ticket) {
	s.ackMu.Lock()
	var items []*item
	for i, b := range s.acks {
		if b.t == t {
			items = b.items
			s.acks = append(s.acks[:i], s.acks[i+1:]...)
			break
		}
	}
	s.ackMu.Unlock()
	s.ackAll(items)
}

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

// forget marks a delivery whose channel is gone as settled without
// settling it (the broker redelivers it), so that it no longer counts as
// held.
func (s *Sidecar) forget(it *item) { s.markSettled(it) }

// settleDurable acks a message that needs no delivery (a duplicate) once
// every record write of this session made so far is durable: a duplicate
// of an event whose own ack is still waiting for its fsync must not leave
// the queue before that fsync. The commit is hurried: duplicates come in
// bursts (a redelivery after a lost channel) that could fill the window
// while it lingers.
func (w *stream) settleDurable(it *item) {
	if w.lastTicket == nil {
		w.s.settle(it, true)
		return
	}
	w.lastTicket.Then(func(error) { w.s.settle(it, true) })
	w.lastTicket.Hurry()
}

// waitDurable waits until every record write of this session is durable and
// the acks waiting for it are sent.
func (w *stream) waitDurable() {
	if w.lastTicket != nil {
		_ = w.lastTicket.Wait()
	}
}

// raise sets v to seq unless it is already higher.
func raise(v *atomic.Int64, seq int64) {
	for {
		cur := v.Load()
		if seq <= cur || v.CompareAndSwap(cur, seq) {
			return
		}
	}
}
