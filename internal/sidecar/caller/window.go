package caller

import (
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// holdCap is how many unsettled deliveries a session that cannot deliver
// may hold: half the prefetch window, so that the other half keeps the
// other sessions moving.
func (s *Sidecar) holdCap() int { return max(1, s.cfg.Prefetch/2) }

// lingerCap is how many deliveries may be unsettled (holding) before the
// store's group commit is hurried rather than left to linger: half the
// prefetch window. The acks of a lingering commit hold their deliveries,
// and a slow fsync holds those that arrive meanwhile; past half the window
// the broker could soon stop sending, so the commit goes at once, as it
// would without a linger.
func (s *Sidecar) lingerCap() int { return max(1, s.cfg.Prefetch/2) }

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
		w.log().Info("This session cannot take more messages now (its app is failing, or a gap); returning its further deliveries to the queue so that other sessions go on",
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

// releaseHorizon bounds how long the worker counts on a released event
// coming back (the broker could drop it: a delivery limit, a TTL); after
// that, a gap it leaves is handled like any other.
const releaseHorizon = 2 * time.Minute

func (w *stream) noteReleased(seq int64, at time.Time) {
	w.relMu.Lock()
	defer w.relMu.Unlock()
	if w.released == nil {
		w.released = map[int64]time.Time{}
	}
	w.released[seq] = at
}

// lowestReleased returns the lowest sequence from from on that was
// released to the queue and is still expected back.
func (w *stream) lowestReleased(from int64) (int64, bool) {
	w.relMu.Lock()
	defer w.relMu.Unlock()
	var lo int64
	for seq := range w.released {
		if seq >= from && (lo == 0 || seq < lo) {
			lo = seq
		}
	}
	return lo, lo != 0
}

// awaitReleased forgets the released events that came back (seq) or are
// processed or too old, and reports the highest sequence still expected
// back (0: none) and whether the stream's next sequence is among them.
func (w *stream) awaitReleased(seen int64) (top int64, nextReleased bool) {
	w.relMu.Lock()
	defer w.relMu.Unlock()
	if len(w.released) == 0 {
		return 0, false // the usual case, on every event: no more work
	}
	now, done, next := w.s.clk.Now(), w.tracker.LastProcessed(), w.tracker.NextExpected()
	for seq, at := range w.released {
		if seq == seen || seq <= done || now.Sub(at) > releaseHorizon {
			delete(w.released, seq)
			continue
		}
		top = max(top, seq)
		nextReleased = nextReleased || seq == next
	}
	return top, nextReleased
}

// windowFull reports whether the session workers hold the whole prefetch
// window and nothing has reached the dispatcher for two ticks.
func (w *stream) windowFull(now time.Time) bool {
	window := w.s.cfg.Prefetch
	return window > 0 && int(w.s.holding.Load()) >= window &&
		now.Sub(time.Unix(0, w.s.dispatchedAt.Load())) >= 2*w.s.tickEvery()
}

// shed hands the upper half of the reorder buffer back to the queue when
// the prefetch window is full and nothing has arrived for a while: the
// deliveries held by sessions waiting for gaps (and by sessions whose app
// fails) then fill the window, and the events they wait for, behind them
// in the queue, could never come. The released events are remembered
// (noteReleased), so they are waited for like the gap, never given up on.
// The dispatcher's global share (Sidecar.mustRelease) keeps this rare;
// this is the backstop when fillers and failing apps fill the window.
func (w *stream) shed(now time.Time) {
	n := w.tracker.Buffered()
	if n == 0 || !w.windowFull(now) {
		return
	}
	w.handBack(now, "reorder buffer", w.tracker.Unbuffer(max(n/2, 1)))
}

// shedReady is shed for a session whose app fails its messages: the ready
// events after the keep being retried go back to the queue (they are
// awaited again, see session.Tracker.Return).
func (w *stream) shedReady(now time.Time, keep int) {
	if len(w.ready) <= keep || !w.windowFull(now) {
		return
	}
	back, err := w.tracker.Return(w.ready[keep].Seq)
	if err != nil { // ready events are the tracker's in-flight ones
		w.log().Error(err, "Could not hand ready events back")
		return
	}
	w.ready = w.ready[:keep]
	w.handBack(now, "ready events", back)
}

// handBack nacks the deliveries of events taken out of the stream, with
// requeue, remembering them as released: they are waited for, never given
// up on.
func (w *stream) handBack(now time.Time, what string, back []session.Entry[*item]) {
	if len(back) == 0 {
		return
	}
	for _, e := range back {
		w.noteReleased(e.Seq, now)
		w.s.m.Released.Inc()
		if e.Item.stale() {
			w.s.forget(e.Item)
			continue
		}
		w.s.settle(e.Item, false)
	}
	w.log().Info("The prefetch window is full of deliveries that wait; returned some of this session's to the queue so that others can arrive",
		"what", what, "returned", len(back), "from", back[0].Seq, "next", w.tracker.NextExpected())
}

// mirror publishes the tracker's position to the dispatcher.
func (w *stream) mirror() {
	w.next.Store(w.tracker.NextExpected())
	lo, gapped := w.tracker.LowestBuffered()
	w.gapEnd.Store(lo)
	w.gapped.Store(gapped)
	if !w.gapped.Load() && !w.stalled.Load() {
		w.releasing.Store(false) // the next release is logged again
	}
	w.setMirrored(int64(w.tracker.Buffered()))
}

// setMirrored publishes the size of the reorder buffer into
// Sidecar.buffered; an exiting worker sets it to 0.
func (w *stream) setMirrored(n int64) {
	if n != w.mirrored {
		w.s.buffered.Add(n - w.mirrored)
		w.mirrored = n
	}
}

// setStalled sets stalled and counts it in Sidecar.stalledSessions; it
// reports whether stalled changed.
func (w *stream) setStalled(v bool) bool {
	if w.stalled.Swap(v) == v {
		return false
	}
	if v {
		w.s.stalledSessions.Add(1)
	} else {
		w.s.stalledSessions.Add(-1)
	}
	return true
}

// leave withdraws an exiting worker from the sidecar-wide counts.
func (w *stream) leave() {
	w.setMirrored(0)
	w.setStalled(false)
}
