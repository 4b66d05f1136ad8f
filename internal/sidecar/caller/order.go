package caller

import (
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// offer hands an event to the tracker: it is ready in order, buffered
// behind a gap, or settled at once (a duplicate, late, malformed).
func (w *stream) offer(it *item) {
	seq := it.seq()
	if seq > 0 && !w.sameBody(it) {
		return
	}
	w.awaitReleased(seq)
	w.maxSeen = max(w.maxSeen, seq)
	if it.marked {
		w.marked, w.mark = true, max(w.mark, it.mark)
	}
	out := w.tracker.Offer(seq, it)
	switch out.Verdict {
	case session.Deliver:
	case session.Buffered:
		if w.gapSince.IsZero() {
			w.gapSince = w.s.clk.Now()
		}
	case session.Duplicate:
		w.s.m.Duplicates.WithLabelValues("sequence").Inc()
		w.log().V(1).Info("Skipped a duplicate event", "sequence", seq, "lastProcessed", w.tracker.LastProcessed(), "redelivered", it.d.Redelivered)
		w.settleDurable(it)
	case session.InFlight:
		w.swapInFlight(seq, it)
	case session.Late:
		w.s.m.Rejects.WithLabelValues(ReasonLateEvent).Inc()
		w.log().Info("WARNING: dropped an event that arrived after its gap was skipped", "sequence", seq)
		w.s.settle(it, true)
	default:
		w.s.m.Rejects.WithLabelValues(ReasonMalformed).Inc()
		w.s.settle(it, true)
	}
	w.note(out, LostBufferOverflow)
	w.resolveGap()
}

// swapInFlight handles a second copy of an event handed out but not yet
// delivered: a redelivery after the channel of the first copy closed
// replaces it (only the live copy can be acked); a second live copy (the
// callee published twice) is a duplicate.
func (w *stream) swapInFlight(seq int64, it *item) {
	for i := range w.ready {
		if w.ready[i].Seq == seq && w.ready[i].Item.stale() {
			w.s.forget(w.ready[i].Item) // no longer held: it was counted
			w.ready[i].Item = it
			return
		}
	}
	w.s.m.Duplicates.WithLabelValues("sequence").Inc()
	w.s.settle(it, true)
}

// note logs gaps and queues what the tracker released; a gap skipped is
// announced to the app, with reason, on the next event delivered.
func (w *stream) note(out session.Outcome[*item], reason string) {
	if out.Gap != nil {
		if _, released := w.awaitReleased(0); released {
			// This sidecar returned the missing events to the queue itself.
			w.log().V(1).Info("Holding later events until released ones come back", "missing", out.Gap.String(), "buffered", w.tracker.Buffered())
		} else {
			w.log().Info("WARNING: gap in the event stream; holding later events until it fills", "missing", out.Gap.String(),
				"buffered", w.tracker.Buffered())
		}
	}
	if out.Skipped != nil {
		w.s.m.Rejects.WithLabelValues(ReasonGapSkipped).Add(float64(out.Skipped.Len()))
		w.log().Info("WARNING: skipped a gap in the event stream; those events are treated as lost and the app is told with the next event",
			"skipped", out.Skipped.String(), "reason", reason, "confirmedThrough", w.mark)
		if w.lost == nil {
			w.lost = &Lost{From: out.Skipped.From, Reason: reason}
		}
		w.lost.To = out.Skipped.To
		w.gapSince, w.gapWarned = time.Time{}, false
		if w.tracker.Buffered() > 0 {
			w.gapSince = w.s.clk.Now()
		}
	}
	w.ready = append(w.ready, out.Ready...)
}

// resolveGap gives up on the missing events that the session's mark shows
// are no longer in the queue (see envelope.HeaderConfirmedThrough): every
// event up to the mark was queued before the events that arrived since,
// and this sidecar has not returned it to the queue itself. The rest of a
// gap is waited for: its events were not confirmed yet when the later ones
// were published, and the callee republishes them until they are.
func (w *stream) resolveGap() {
	if !w.marked || w.tracker.Buffered() == 0 {
		return
	}
	to := w.mark
	if r, ok := w.lowestReleased(w.tracker.NextExpected()); ok {
		to = min(to, r-1)
	}
	if out := w.tracker.SkipThrough(to); out.Skipped != nil {
		w.note(out, LostNotInQueue)
	}
}

// onTick runs the timeouts: stale buffers, gaps that do not fill, terminal
// messages whose preceding events never come.
func (w *stream) onTick() {
	now := w.s.clk.Now()
	if w.lastDctx != nil && w.lastDctx.Err() != nil && w.tracker.Buffered() > 0 {
		w.dropStale()
	}
	// An event released to the queue comes back: a gap where it belongs is
	// waited for, and so is a terminal message anchored after it.
	top, awaiting := w.awaitReleased(0)
	if w.tracker.Buffered() > 0 {
		if w.gapOpened.IsZero() {
			w.gapOpened = now
		}
		switch {
		case now.Sub(w.gapOpened) >= w.s.o.MaxGapWait:
			// Bounded: the events held back behind it went round the queue
			// for MaxGapWait (see poison.go).
			w.log().Info("WARNING: a gap in the event stream stayed open for the longest wait; giving it up so that the events behind it are delivered",
				"next", w.tracker.NextExpected(), "open", now.Sub(w.gapOpened).String())
			w.note(w.tracker.Skip(), LostGapWaitLimit)
			w.gapOpened = time.Time{}
		case w.gapSince.IsZero() || awaiting:
			w.gapSince = now
		case w.marked:
			// The callee's marks say when events are gone (resolveGap);
			// until then they are on their way: wait, whatever the time.
			w.resolveGap()
			if !w.gapWarned && now.Sub(w.gapSince) >= w.s.o.GapTimeout {
				w.gapWarned = true
				w.log().Info("WARNING: a gap in the event stream is still open; waiting for the callee to republish the missing events",
					"next", w.tracker.NextExpected(), "confirmedThrough", w.mark, "open", now.Sub(w.gapSince).String())
			}
		case now.Sub(w.gapSince) >= w.s.o.GapTimeout:
			w.note(w.tracker.Skip(), LostGapTimeout)
		}
	} else {
		w.gapSince, w.gapOpened = time.Time{}, time.Time{}
	}
	w.shed(now)
	w.reportAcked(false)
	if len(w.barriers) > 0 {
		b := w.barriers[0]
		if top > w.tracker.LastProcessed() {
			b.since = now
		}
		if w.tracker.LastProcessed() < b.anchor && len(w.ready) == 0 && w.tracker.Buffered() == 0 &&
			now.Sub(b.since) >= 2*w.s.o.GapTimeout {
			w.log().Info("WARNING: events before a terminal message never arrived; delivering it", "type", b.kind,
				"lastProcessed", w.tracker.LastProcessed(), "expectedUpTo", b.anchor)
			b.anchor = w.tracker.LastProcessed()
		}
	}
	w.pump()
	w.mirror()
}
