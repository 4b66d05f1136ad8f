package session

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// ErrNotInFlight is matched by errors from Commit and Requeue for a
// sequence that is not in flight.
var ErrNotInFlight = errors.New("sequence not in flight")

// Tracker is a caller's per-session view of the event stream: it keeps
// last_processed_sequence, deduplicates redeliveries, releases events in
// sequence order, buffers out-of-order arrivals in a bounded buffer and
// reports gaps (L2 "Integration with L1 Stream Continuity"). T is whatever
// the caller needs to process and acknowledge an event, typically the AMQP
// delivery. A Tracker is safe for concurrent use.
//
// Sequences move through: offered → buffered (ahead of a gap) → ready/in
// flight (handed to the caller) → committed (processed; last processed
// sequence advances, Store saves it). A failed one is requeued instead.
type Tracker[T any] struct {
	mu        sync.Mutex
	sessionID string
	store     Store
	maxBuf    int
	committed int64       // last processed sequence
	next      int64       // lowest sequence not yet handed out
	inflight  []Entry[T]  // handed out, not committed, ascending
	buf       map[int64]T // ahead of next
	requeued  int64       // requeued sequence awaited again (0: none)
	reported  Range       // last gap reported (zero: none)
	skipped   []Range     // recently skipped gaps, oldest first
}

// NewTracker returns a Tracker for a session, resuming from the Store's
// last processed sequence when a Store is given.
func NewTracker[T any](sessionID string, opts TrackerOptions) (*Tracker[T], error) {
	t := &Tracker[T]{sessionID: sessionID, store: opts.Store, maxBuf: opts.MaxBuffer, buf: map[int64]T{}}
	if t.maxBuf <= 0 {
		t.maxBuf = DefaultMaxBuffer
	}
	if t.store != nil {
		last, err := t.store.Load(sessionID)
		if err != nil {
			return nil, fmt.Errorf("load last processed sequence of session %s: %w", sessionID, err)
		}
		if last < 0 {
			return nil, fmt.Errorf("load last processed sequence of session %s: negative value %d", sessionID, last)
		}
		t.committed = last
	}
	t.next = t.committed + 1
	return t, nil
}

// Offer classifies an arriving event; see Verdict for what to do with it.
func (t *Tracker[T]) Offer(seq int64, item T) Outcome[T] {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out Outcome[T]
	switch {
	case seq < 1:
		out.Verdict = Invalid
		return out
	case t.wasSkipped(seq):
		out.Verdict = Late
		return out
	case seq <= t.committed:
		out.Verdict = Duplicate
		return out
	case t.isInFlight(seq):
		out.Verdict = InFlight
		return out
	case seq < t.next:
		// Below next but neither committed nor in flight: part of a skipped
		// gap older than the ones still remembered.
		out.Verdict = Late
		return out
	}
	if _, ok := t.buf[seq]; ok {
		out.Verdict = Duplicate
		return out
	}
	if seq == t.next {
		out.Verdict = Deliver
		out.Ready = t.handOut(Entry[T]{seq, item})
	} else {
		out.Verdict = Buffered
		t.buf[seq] = item
		// Never give up on a requeued event: it is known to be in the queue,
		// and its nack freed the prefetch slot it needs to come back.
		if len(t.buf) > t.maxBuf && t.next != t.requeued {
			t.skipGap(&out)
		}
	}
	t.reportGap(&out)
	return out
}

// Skip gives up on the gap before the lowest buffered event, releasing the
// buffered events behind it; use it when a gap has been open too long.
// Without buffered events there is nothing to skip to and Skip returns a
// zero Outcome. Unlike the automatic skip on buffer overflow, Skip also
// gives up on a requeued event that has not come back (it may have been
// dropped by the broker: TTL, overflow, delivery limit), so give the
// application time to recover before calling it.
func (t *Tracker[T]) Skip() Outcome[T] {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out Outcome[T]
	if len(t.buf) == 0 {
		return out
	}
	t.skipGap(&out)
	t.reportGap(&out)
	return out
}

// SkipThrough gives up on the missing sequences from the next expected one
// through to (capped below the lowest buffered event), handing out the
// buffered events that this unblocks; use it when the missing events are
// known to be gone (see envelope.HeaderConfirmedThrough). Without buffered
// events, or with to below the next expected sequence, it does nothing.
// Like Skip, it also gives up on a requeued event in that range.
func (t *Tracker[T]) SkipThrough(to int64) Outcome[T] {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out Outcome[T]
	lo, ok := t.lowestBuffered()
	if !ok || to < t.next {
		return out
	}
	if to >= lo-1 {
		t.skipGap(&out)
	} else {
		gap := Range{t.next, to}
		t.remember(gap)
		out.Skipped = &gap
		t.next = to + 1
		t.reported = Range{} // what is left of the gap is reported again
		if t.requeued != 0 && t.requeued <= to {
			t.requeued = 0
		}
	}
	t.reportGap(&out)
	return out
}

// Commit records that the application processed seq, which must be the
// oldest in-flight sequence: last_processed_sequence advances to seq and is
// saved to the Store. Committing an already committed sequence is a no-op.
// When the Store fails the in-memory value has still advanced (the event
// was processed) and the error is returned for logging; after a restart the
// event may be redelivered once.
func (t *Tracker[T]) Commit(seq int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if seq <= t.committed && !t.isInFlight(seq) {
		return nil
	}
	if len(t.inflight) == 0 || t.inflight[0].Seq != seq {
		if t.isInFlight(seq) {
			return fmt.Errorf("commit %d of session %s: %w in order; the oldest in flight is %d", seq, t.sessionID, ErrNotInFlight, t.inflight[0].Seq)
		}
		return fmt.Errorf("commit %d of session %s: %w", seq, t.sessionID, ErrNotInFlight)
	}
	// The slot lets go of the item: the array would keep it alive.
	t.inflight[0] = Entry[T]{}
	t.inflight = t.inflight[1:]
	t.committed = seq
	if t.store != nil {
		if err := t.store.Save(t.sessionID, seq); err != nil {
			return fmt.Errorf("save last processed sequence %d of session %s: %w", seq, t.sessionID, err)
		}
	}
	return nil
}

// Requeue records that processing seq failed and its delivery will be
// nacked with requeue: seq is expected again (its redelivery gets Deliver)
// and the events handed out after it go back into the buffer, so drop them
// from whatever batch is being processed and keep their deliveries
// unacked; they come back in Ready after seq. A requeued event is never
// skipped automatically (only by an explicit Skip), and its absence is not
// reported as a gap.
func (t *Tracker[T]) Requeue(seq int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	back, err := t.takeBack("requeue", seq)
	if err != nil {
		return err
	}
	for _, e := range back[1:] {
		t.buf[e.Seq] = e.Item
	}
	t.unreport(seq)
	return nil
}

// Return takes back the in-flight events from seq on, for a caller that
// nacks their deliveries with requeue (to free its prefetch window while
// the application fails): they are expected again, from seq, like a
// requeued event (never skipped automatically, the hole not reported as a
// gap). It returns them in order.
func (t *Tracker[T]) Return(seq int64) ([]Entry[T], error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	back, err := t.takeBack("return", seq)
	if err != nil {
		return nil, err
	}
	t.unreport(seq)
	return back, nil
}

// takeBack removes the in-flight events from seq on and makes seq the next
// expected sequence, awaited again.
func (t *Tracker[T]) takeBack(op string, seq int64) ([]Entry[T], error) {
	i := slices.IndexFunc(t.inflight, func(e Entry[T]) bool { return e.Seq == seq })
	if i < 0 {
		return nil, fmt.Errorf("%s %d of session %s: %w", op, seq, t.sessionID, ErrNotInFlight)
	}
	back := slices.Clone(t.inflight[i:])
	t.inflight = slices.Clip(t.inflight[:i])
	t.next = seq
	t.requeued = seq
	return back, nil
}

// unreport marks the hole from seq to the buffered events as already
// reported: it is the caller's, not the transport's.
func (t *Tracker[T]) unreport(seq int64) {
	if lo, ok := t.lowestBuffered(); ok {
		t.reported = Range{seq, lo - 1}
	}
}

// Reset drops the buffered events and returns them, for use after the AMQP
// channel was lost: their deliveries can no longer be acked and the broker
// will redeliver them. In-flight events stay in flight (the application may
// still finish them; their redelivered copies get InFlight until then).
func (t *Tracker[T]) Reset() []Entry[T] {
	t.mu.Lock()
	defer t.mu.Unlock()
	dropped := make([]Entry[T], 0, len(t.buf))
	for _, s := range slices.Sorted(maps.Keys(t.buf)) {
		dropped = append(dropped, Entry[T]{s, t.buf[s]})
	}
	clear(t.buf)
	t.reported = Range{}
	return dropped
}

// Unbuffer removes the n highest buffered events (fewer if fewer are
// buffered) and returns them in ascending order, for a caller that hands
// their deliveries back to the broker to free its prefetch window: they
// are not skipped, and their next copies are offered like any other. The
// gap before the remaining buffered events is unchanged.
func (t *Tracker[T]) Unbuffer(n int) []Entry[T] {
	t.mu.Lock()
	defer t.mu.Unlock()
	seqs := slices.Sorted(maps.Keys(t.buf))
	out := make([]Entry[T], 0, min(n, len(seqs)))
	for _, s := range seqs[max(len(seqs)-n, 0):] {
		out = append(out, Entry[T]{s, t.buf[s]})
		delete(t.buf, s)
	}
	if len(t.buf) == 0 {
		t.reported = Range{}
	}
	return out
}

// LastProcessed returns last_processed_sequence.
func (t *Tracker[T]) LastProcessed() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.committed
}

// NextExpected returns the lowest sequence not yet handed out.
func (t *Tracker[T]) NextExpected() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.next
}

// Buffered returns the number of buffered events.
func (t *Tracker[T]) Buffered() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.buf)
}

// LowestBuffered returns the lowest buffered sequence (ok false: none):
// the sequences from NextExpected up to it are the gap.
func (t *Tracker[T]) LowestBuffered() (seq int64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lowestBuffered()
}

// InFlight returns the number of events handed out and not yet committed.
func (t *Tracker[T]) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.inflight)
}

// handOut marks first and every buffered successor as in flight.
func (t *Tracker[T]) handOut(first Entry[T]) []Entry[T] {
	ready := []Entry[T]{first}
	if first.Seq >= t.requeued {
		t.requeued = 0
	}
	t.next = first.Seq + 1
	for {
		item, ok := t.buf[t.next]
		if !ok {
			break
		}
		delete(t.buf, t.next)
		ready = append(ready, Entry[T]{t.next, item})
		t.next++
	}
	t.inflight = append(t.inflight, ready...)
	return ready
}

// skipGap skips from next to the lowest buffered event and hands out what
// that unblocks. The buffer must not be empty.
func (t *Tracker[T]) skipGap(out *Outcome[T]) {
	lo, _ := t.lowestBuffered()
	gap := Range{t.next, lo - 1}
	out.Skipped = &gap
	t.remember(gap)
	item := t.buf[lo]
	delete(t.buf, lo)
	out.Ready = append(out.Ready, t.handOut(Entry[T]{lo, item})...)
}

// remember records a skipped gap, so that late copies are recognised.
func (t *Tracker[T]) remember(gap Range) {
	t.skipped = append(t.skipped, gap)
	if len(t.skipped) > maxSkipped {
		t.skipped = slices.Delete(t.skipped, 0, len(t.skipped)-maxSkipped)
	}
}

// reportGap sets out.Gap when the gap before the buffered events is new.
func (t *Tracker[T]) reportGap(out *Outcome[T]) {
	lo, ok := t.lowestBuffered()
	if !ok {
		t.reported = Range{}
		return
	}
	g := Range{t.next, lo - 1}
	// A gap filling from its start is the same gap.
	if g.To != t.reported.To || g.From < t.reported.From {
		t.reported = g
		out.Gap = &g
	}
}

func (t *Tracker[T]) lowestBuffered() (int64, bool) {
	if len(t.buf) == 0 {
		return 0, false
	}
	var lo int64
	first := true
	for s := range t.buf {
		if first || s < lo {
			lo, first = s, false
		}
	}
	return lo, true
}

func (t *Tracker[T]) isInFlight(seq int64) bool {
	for _, e := range t.inflight {
		if e.Seq == seq {
			return true
		}
	}
	return false
}

func (t *Tracker[T]) wasSkipped(seq int64) bool {
	for _, r := range t.skipped {
		if seq >= r.From && seq <= r.To {
			return true
		}
	}
	return false
}
