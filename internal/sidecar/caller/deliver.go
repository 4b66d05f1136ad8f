package caller

import (
	"time"
)

// pump delivers whatever is next, in stream order, until something has to
// wait (a gap) or the sidecar stops.
func (w *stream) pump() {
	for !w.stopping() {
		var b *barrier
		if len(w.barriers) > 0 {
			b = w.barriers[0]
		}
		if !w.stopAt.IsZero() && w.nextStale(b) {
			// Stopping and the channel is gone: the broker redelivers it
			// to the next instance; delivering it now would only make that
			// redelivery a duplicate.
			return
		}
		switch {
		case b != nil && (w.tracker.LastProcessed() >= b.anchor || (len(w.ready) > 0 && w.ready[0].Seq > b.anchor)):
			if !w.deliverBarrier(b) {
				return
			}
		case len(w.ready) > 0:
			if w.waitForAccepted() {
				return
			}
			if !w.deliverEvents() {
				return
			}
		default:
			return
		}
	}
}

// waitForAccepted reports whether the next event must wait for the
// session's task_accepted (see awaitAccepted).
func (w *stream) waitForAccepted() bool {
	if !w.awaitAccepted {
		return false
	}
	now := w.s.clk.Now()
	if w.awaitSince.IsZero() {
		w.awaitSince = now
	}
	if now.Sub(w.awaitSince) < w.s.o.GapTimeout {
		return true
	}
	w.log().Info("WARNING: the session's events arrived but its task_accepted did not; delivering them without it",
		"task", w.taskMessageID)
	w.awaitAccepted = false
	return false
}

// nextStale reports whether the next message to deliver comes from a closed
// channel.
func (w *stream) nextStale(b *barrier) bool {
	if b != nil && (w.tracker.LastProcessed() >= b.anchor || (len(w.ready) > 0 && w.ready[0].Seq > b.anchor)) {
		return b.item.stale()
	}
	return len(w.ready) > 0 && w.ready[0].Item.stale()
}

// Outcomes of deliverRetrying.
type outcome int

const (
	delivered outcome = iota // the app answered 2xx
	stopped                  // the sidecar stops
	poisoned                 // the app refused it Options.MaxAttempts times
)

// deliverRetrying sends (send POSTs to the app) until the app answers
// 2xx, backing off exponentially between attempts (the deliveries stay
// held, see stream). It gives up when the sidecar stops, and, with poison,
// after the app refused it (an answer other than 2xx, or no answer within
// AppTimeout) Options.MaxAttempts times: an app that cannot be reached
// refuses nothing, and is retried for as long as it takes. send rebuilds
// its request per attempt so that a redelivered copy swapped in meanwhile
// is the one sent.
//
// keep is how many of the ready events the attempts carry: while the app
// fails, the ones after them may be handed back to the queue (shedReady).
func (w *stream) deliverRetrying(what string, keep int, poison bool, send func() error) outcome {
	refusals := 0
	for attempt := 1; ; attempt++ {
		if w.stopping() {
			return stopped
		}
		err := send()
		if err == nil {
			if w.setStalled(false) {
				w.log().Info("The app takes this session's messages again", "attempts", attempt)
			}
			return delivered
		}
		if isRefusal(err) {
			refusals++
			if poison && refusals >= w.s.o.MaxAttempts {
				w.log().Info("WARNING: the app refused a message every time; giving up on it", "what", what, "refusals", refusals, "error", err.Error())
				return poisoned
			}
		}
		w.setStalled(true)
		d := w.s.o.AppBackoff.after(attempt)
		w.log().Info("The app did not take a message; retrying after a backoff (the delivery stays unacked)", "what", what,
			"attempt", attempt, "retryIn", d.String(), "error", err.Error())
		if !w.backoff(d, keep) {
			if w.stopAt.IsZero() {
				w.stopAt = w.s.clk.Now().Add(w.s.o.DrainTimeout)
			}
			// The app is failing: no point spending the drain time on it.
			return stopped
		}
	}
}

// backoff waits d, or until the sidecar stops (false). Meanwhile, if the
// prefetch window fills, it hands back to the queue what this session
// holds beyond the keep ready events being retried (see shed).
func (w *stream) backoff(d time.Duration, keep int) bool {
	timer := w.s.clk.NewTimer(d)
	defer timer.Stop()
	tick := w.s.clk.NewTicker(w.s.tickEvery())
	defer tick.Stop()
	for {
		select {
		case <-timer.C():
			return true
		case <-tick.C():
			now := w.s.clk.Now()
			w.shedReady(now, keep)
			w.shed(now)
			w.mirror()
		case <-w.s.stopCh:
			return false
		}
	}
}

// deliverEvents delivers the next ready events: one per request, or
// every consecutive one ready (up to Sidecar.batchLimit, never past a
// terminal message's anchor) in one request to the app's batch endpoint,
// with Options.AppMaxBatch above 1 or while the app offers batches
// (HeaderBatchMax). A 2xx means the app processed all of them. If the app
// withdraws its offer while a batch is retried, the retry carries the
// first event alone.
func (w *stream) deliverEvents() bool {
	n := w.batchLen()
	fixed := w.s.o.AppMaxBatch > 1
	send := func() error {
		if !fixed {
			n = min(n, w.s.batchLimit())
		}
		ms := w.msgs[:0]
		for _, e := range w.ready[:n] {
			ms = append(ms, w.s.appMessage(e.Item, w.callee, w.taskMessageID))
		}
		// Encoded before deliver or deliverBatch returns: the slots are
		// let go of at once (they point into the envelopes).
		defer func() {
			clear(ms)
			if cap(ms) <= 16 { // a large batch's array is not kept
				w.msgs = ms[:0]
			}
		}()
		if w.lost != nil && w.lost.To < w.ready[0].Seq {
			ms[0].Lost = w.lost
		}
		if fixed || n > 1 {
			return w.s.deliverBatch(ms)
		}
		return w.s.deliver(ms[0])
	}
	switch w.deliverRetrying("event", n, true, send) {
	case stopped:
		return false
	case poisoned:
		w.deadLetter(w.ready[0])
		w.ready = dropFront(w.ready, 1)
		return true
	}
	batch := w.ready[:n]
	w.ready = w.ready[n:]
	last := batch[n-1].Seq
	if w.lost != nil && w.lost.To < last {
		w.lost = nil
	}
	// The app has them: the next events may go at once.
	w.commitEvents(batch)
	// Their slots let go of them (commitEvents keeps what it needs), so
	// that a waiting session does not hold its delivered messages.
	clear(batch)
	if len(w.ready) == 0 {
		w.ready = nil
	}
	return true
}

// batchLen is how many of the ready events the next request carries.
func (w *stream) batchLen() int {
	limit := min(len(w.ready), w.s.batchLimit())
	n := 1
	for n < limit && (len(w.barriers) == 0 || w.ready[n].Seq <= w.barriers[0].anchor) {
		n++
	}
	return n
}

// deliverBarrier delivers the unsequenced message b (task_accepted,
// task_rejected, task_completed, task_failed), retrying until the app takes
// it, then commits and acks it. It returns false only when the sidecar
// stops first.
func (w *stream) deliverBarrier(b *barrier) bool {
	tid := func() string {
		switch {
		case b.item.accepted != nil:
			return b.item.accepted.TaskMessageID
		case b.item.rejected != nil:
			return b.item.rejected.TaskMessageID
		}
		return w.taskMessageID
	}
	// Answers and results are retried until the app takes them: a session
	// has at most two, and without them the app never learns how it ended.
	if w.deliverRetrying(string(b.kind), 0, false, func() error { return w.s.deliver(w.s.appMessage(b.item, w.callee, tid())) }) != delivered {
		return false
	}
	it := b.item
	w.barriers = dropFront(w.barriers, 1)
	w.commitBarrier(b)
	w.s.settle(it, true)
	if isTerminal(b.kind) {
		// The synchronous write of commitBarrier covered every earlier
		// event, and their acks ran before it returned. The position goes
		// to the status writer (fresh: the HCPSession is looked up again
		// if it was missing); the write that holds the session's last
		// sequence follows session_closed (writeFinalPosition).
		w.reportAcked(true)
	}
	return true
}

// dropFront removes the first n elements of q, clearing their slots, so
// that the backing array keeps no delivered message alive (its body,
// headers and decoded payload) while the session waits for more; an
// emptied queue lets its array go.
func dropFront[T any](q []T, n int) []T {
	if n >= len(q) {
		return nil
	}
	clear(q[:n])
	return q[n:]
}
