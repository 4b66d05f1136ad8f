package caller

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// idleTimeout is how long a session worker with nothing held lingers
// before it exits; its state is in the store and a new worker resumes it.
const idleTimeout = time.Minute

// endedLinger is how long the worker of an ended session lingers.
const endedLinger = 2 * time.Second

// trackerStore gives a Tracker its starting point. The worker persists
// last_processed_sequence itself, in the same write as the rest of the
// session record and outside the tracker's lock, so Save does nothing.
type trackerStore struct{ st *Store }

func (t trackerStore) Load(id string) (int64, error) { return t.st.Load(id) }
func (trackerStore) Save(string, int64) error        { return nil }

// barrier is a message without an L2 sequence in a session's stream:
// task_accepted or task_rejected (anchor 0: before every event), or
// task_completed / task_failed (anchor: the highest sequence seen when it
// arrived, so it follows every event that preceded it in the queue). Events
// with a higher sequence wait until it is delivered.
type barrier struct {
	kind   envelope.MessageType
	anchor int64
	item   *item
	since  time.Time
}

func isTerminal(t envelope.MessageType) bool {
	return t == envelope.TypeTaskCompleted || t == envelope.TypeTaskFailed
}

// stream is one session's worker: it owns the session's tracker and
// delivers to the app one message at a time.
//
// A message the app fails is retried in place with exponential backoff,
// its delivery held unacked; it is not nacked. RabbitMQ puts a message
// nacked with requeue at the back of a quorum queue (measured on 3.10: it
// comes back after everything already queued), so the session's later
// events would arrive first, fill the reorder buffer and the prefetch
// window, and the gap could only be skipped, losing the event. Held in
// place, the event keeps its position; if the channel is lost meanwhile
// (or the broker's consumer timeout closes it), the broker returns every
// unacked message to the head of the queue, in order.
type stream struct {
	s       *Sidecar
	id      string
	log     logr.Logger
	inbox   chan *item
	tracker *session.Tracker[*item]

	// ready are events handed out by the tracker, in order, not yet
	// delivered.
	ready    []session.Entry[*item]
	barriers []*barrier
	// maxSeen is the highest sequence offered (or persisted).
	maxSeen       int64
	callee        string
	unverified    bool
	taskMessageID string
	capability    string
	taskLooked    bool
	gapSince      time.Time
	// mark is the highest envelope.HeaderConfirmedThrough of the session's
	// events (marked: one carried it): the sequences up to it were in the
	// queue ahead of the events that arrived since. lost is the range given
	// up on, announced with the next event delivered (AppMessage.Lost).
	mark   int64
	marked bool
	lost   *Lost
	// gapWarned says the current gap's long wait was logged.
	gapWarned bool
	// awaitAccepted: this sidecar submitted the session's task and has not
	// seen its answer yet, so events wait (up to GapTimeout from
	// awaitSince) for task_accepted to be delivered first. The callee
	// publishes it first, but a republish after a lost confirm can put it
	// behind the session's first events.
	awaitAccepted bool
	awaitSince    time.Time
	lastDctx      context.Context
	lastActive    time.Time
	// lastTicket is the group commit of the session's latest record write;
	// acks wait for it (see deliverEvent).
	lastTicket *Ticket
	// acked is the highest sequence acked after its fsync (set on the
	// store's committer goroutine); reported is the highest recorded as
	// callerAckedSequence, unreported says a recording was refused (the
	// HCPSession was not found) and is retried.
	acked      atomic.Int64
	reported   int64
	unreported bool
	// stopAt is set when the sidecar stops: the worker delivers what it
	// already holds until then, and leaves the rest unsettled.
	stopAt time.Time
	// held counts the session's deliveries handed to this worker and not
	// settled yet; stalled is set while the app fails its messages (see
	// Sidecar.release); releasing says the release was logged.
	held      atomic.Int32
	stalled   atomic.Bool
	releasing atomic.Bool
	// next and gapped mirror the tracker for the dispatcher: the lowest
	// sequence not handed out yet, and whether later ones are buffered
	// behind a gap. The mirror lags the worker: the dispatcher may see an
	// event that fills the gap right after the one that was next.
	next   atomic.Int64
	gapped atomic.Bool
	// gapEnd is the lowest buffered sequence: the events below it (and
	// from next on) fill the gap and are never released.
	gapEnd atomic.Int64
	// mirrored is the reorder buffer's size as last added to
	// Sidecar.buffered (worker only).
	mirrored int64
	// released are the sequences of the events released to the queue and
	// not seen again, with when (written by the dispatcher, read by the
	// worker).
	relMu    sync.Mutex
	released map[int64]time.Time
	// refused is why the session's messages are refused, if they are:
	// ReasonForeignSession (its HCPSession names another caller) or
	// ReasonUnsolicitedSession (this caller never submitted it).
	refused string
}

// newStream builds the worker of session sid; called with s.mu held. Its
// tracker is made by init, on the worker's goroutine.
func (s *Sidecar) newStream(sid string) *stream {
	return &stream{
		s:          s,
		id:         sid,
		log:        s.log.WithValues("session", sid),
		inbox:      make(chan *item, 4*s.cfg.Prefetch+16),
		lastActive: s.clk.Now(),
	}
}

// init seeds the session from its HCPSession if the store has no record of
// it (see seed) and builds its tracker from the store. It reports false if
// the sidecar stopped first: nothing was delivered, and what the worker got
// stays unsettled.
func (w *stream) init() bool {
	if !w.seed() {
		return false
	}
	rec, _ := w.s.store.Session(w.id)
	tr, err := session.NewTracker[*item](w.id, session.TrackerOptions{Store: trackerStore{w.s.store}, MaxBuffer: w.s.o.MaxBuffer})
	if err != nil { // trackerStore.Load does not fail
		panic(err)
	}
	w.maxSeen = max(w.maxSeen, rec.LastSeq)
	if w.refused == "" && w.callee == "" {
		w.callee, w.unverified = rec.CalleeID, rec.Unverified
		w.taskMessageID, w.capability = rec.TaskMessageID, rec.Capability
	}
	w.s.mu.Lock()
	w.tracker = tr // read under s.mu by the session view
	w.s.mu.Unlock()
	return true
}

func (w *stream) run() {
	defer w.s.workers.Done()
	if !w.init() {
		w.s.mu.Lock()
		if w.s.streams[w.id] == w {
			delete(w.s.streams, w.id)
		}
		w.s.mu.Unlock()
		return
	}
	tick := w.s.clk.NewTicker(w.tickEvery())
	defer tick.Stop()
	for {
		select {
		case <-w.s.stopCh:
			w.drain()
			return
		case it := <-w.inbox:
			w.lastActive = w.s.clk.Now()
			w.accept(it)
			// What else arrived meanwhile joins it, so that with
			// AppMaxBatch the next request carries all of it. The
			// dispatcher learns of a gap after each message, before the
			// delivery: without that it hands the session every event
			// until the delivery returns, and a long gap overflows the
			// reorder buffer.
			w.mirror()
			for range cap(w.inbox) {
				select {
				case it := <-w.inbox:
					w.accept(it)
					w.mirror()
					continue
				default:
				}
				break
			}
			w.advance()
		case <-tick.C():
			w.onTick()
			if w.idle() {
				w.reportAcked(true)
				if w.tryExit() {
					return
				}
			}
		}
	}
}

// tickEvery is the period of the worker's timeouts (onTick).
func (w *stream) tickEvery() time.Duration {
	return min(max(w.s.o.GapTimeout/4, 10*time.Millisecond), time.Second)
}

// stopping reports whether the drain time is over.
func (w *stream) stopping() bool {
	return !w.stopAt.IsZero() && !w.s.clk.Now().Before(w.stopAt)
}

// drain runs when the sidecar stops: deliveries already received are still
// delivered (in order, as usual) until the drain time is over or nothing
// more can be delivered; what is left stays unsettled and returns to the
// head of the queue when the channel closes.
func (w *stream) drain() {
	if w.stopAt.IsZero() {
		w.stopAt = w.s.clk.Now().Add(w.s.o.DrainTimeout)
	}
	w.pump()
	for !w.stopping() {
		select {
		case it := <-w.inbox:
			w.process(it)
			continue
		case <-w.s.clk.After(100 * time.Millisecond):
		}
		break
	}
	// The acks of what was delivered go out before the channel closes.
	w.durable()
	w.reportAcked(true)
	w.s.mu.Lock()
	if w.s.streams[w.id] == w {
		delete(w.s.streams, w.id)
	}
	w.s.mu.Unlock()
	w.leave()
	held := len(w.inbox) + len(w.ready) + len(w.barriers) + w.tracker.Buffered()
	if held > 0 {
		w.log.V(1).Info("Stopped with deliveries unsettled; the broker returns them to the head of the queue", "held", held)
	}
}

func (w *stream) process(it *item) {
	w.accept(it)
	w.advance()
}

// accept takes one message into the session's stream.
func (w *stream) accept(it *item) {
	// A callee rejects without a record (no HCPSession): a task the
	// previous pod of this caller submitted, rejected after the move, is
	// let in alone; the rest of the session stays refused.
	if w.refused != "" && (w.refused != ReasonUnsolicitedSession || !w.rejectionOfOurs(it)) {
		w.s.m.Rejects.WithLabelValues(w.refused).Inc()
		w.log.Info("WARNING: dropped a message of a session that is not this caller's", "reason", w.refused, "sender", it.sender, "type", it.env.Type,
			"messageID", it.env.MessageID)
		w.s.settle(it, true)
		return
	}
	w.checkChannel(it.dctx)
	if !w.verify(it) {
		return
	}
	switch it.env.Type {
	case envelope.TypeEvent:
		w.offer(it)
	case envelope.TypeTaskAccepted:
		w.onAccepted(it)
	case envelope.TypeTaskRejected:
		w.onRejected(it)
	case envelope.TypeTaskCompleted, envelope.TypeTaskFailed:
		w.onTerminal(it)
	}
}

// rejectionOfOurs reports whether it is a task_rejected whose session id is
// the one its sender would give a task of this caller with that message id
// (topology.SessionID): a rejection of a task sent by this caller, though
// this pod has no record of it. The sender is a callee of the vhost
// (checked on arrival); no session follows a rejection, so nothing else of
// the session is let in.
func (w *stream) rejectionOfOurs(it *item) bool {
	return it.rejected != nil && strings.EqualFold(w.id, topology.SessionID(it.sender, w.s.cfg.ID, it.rejected.TaskMessageID))
}

// advance delivers what is ready and publishes the position.
func (w *stream) advance() {
	w.pump()
	w.reportAcked(false)
	w.mirror()
}

// checkChannel notices that the deliveries held came from a channel that is
// gone: buffered ones can no longer be acked and the broker redelivers them,
// so they are dropped (a copy held back would otherwise make the tracker
// call the live redelivery a duplicate and have it acked).
func (w *stream) checkChannel(dctx context.Context) {
	if w.lastDctx != nil && w.lastDctx != dctx && w.lastDctx.Err() != nil {
		w.dropStale()
	}
	if dctx != nil {
		w.lastDctx = dctx
	}
}

func (w *stream) dropStale() {
	dropped := w.tracker.Reset()
	live := 0
	for _, e := range dropped {
		if !e.Item.stale() {
			// Cannot happen (all held deliveries share one channel); if it
			// did, leaving it unsettled would stall the window.
			w.s.settle(e.Item, false)
			live++
			continue
		}
		w.s.forget(e.Item)
	}
	if len(dropped) > 0 {
		w.log.V(1).Info("Dropped buffered events of a closed channel; the broker redelivers them", "count", len(dropped), "live", live)
	}
	w.gapSince = time.Time{}
}

// verify checks that it comes from the session's callee. The callee is
// known from, in order: this session's record, the task the message
// answers, the task whose expected session this is, the HCPSession in the
// sidecar's namespace. A session nothing names (the local state was lost)
// is bound to its first sender, with a warning.
func (w *stream) verify(it *item) bool {
	expected, source := w.expectedCallee(it)
	if expected == "" {
		w.callee, w.unverified = it.sender, true
		w.log.Info("WARNING: no task, task_accepted or HCPSession names this session's callee; bound it to the first sender",
			"callee", it.sender, "type", it.env.Type)
		return true
	}
	if expected != it.sender {
		w.s.m.Rejects.WithLabelValues(ReasonSpoofedSender).Inc()
		w.log.Info("WARNING: dropped a message from a callee that is not the session's", "sender", it.sender,
			"callee", expected, "learntFrom", source, "type", it.env.Type, "messageID", it.env.MessageID)
		w.s.settle(it, true)
		return false
	}
	if source != "first-use" {
		w.unverified = false
	}
	w.callee = expected
	if !w.taskLooked {
		w.taskLooked = true
		t, ok := w.s.store.Task(w.taskMessageID)
		if !ok {
			t, ok = w.s.store.TaskForSession(w.id)
		}
		if ok {
			w.taskMessageID, w.capability = t.MessageID, t.Capability
			rec, _ := w.s.store.Session(w.id)
			w.awaitAccepted = t.State == TaskPending && !rec.AcceptedDelivered && !w.s.isAnswered(t.MessageID)
		}
	}
	return true
}

func (w *stream) expectedCallee(it *item) (callee, source string) {
	if w.callee != "" && !w.unverified {
		return w.callee, "session"
	}
	tid := ""
	switch {
	case it.accepted != nil:
		tid = it.accepted.TaskMessageID
	case it.rejected != nil:
		tid = it.rejected.TaskMessageID
	}
	if tid != "" {
		if t, ok := w.s.store.Task(tid); ok {
			return t.CalleeID, "task"
		}
	}
	if t, ok := w.s.store.TaskForSession(w.id); ok {
		return t.CalleeID, "task"
	}
	if l := w.s.lookupSession(w.id, false); l.found && l.calleeID != "" {
		return l.calleeID, "hcpsession"
	}
	if w.callee != "" {
		return w.callee, "first-use"
	}
	return "", ""
}

// releaseHorizon bounds how long the worker counts on a released event
// coming back (the broker could drop it: a delivery limit, a TTL); after
// that, a gap it leaves is handled like any other.
const releaseHorizon = 2 * time.Minute

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

func (w *stream) noteReleased(seq int64, at time.Time) {
	w.relMu.Lock()
	defer w.relMu.Unlock()
	if w.released == nil {
		w.released = map[int64]time.Time{}
	}
	w.released[seq] = at
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

// setMirrored publishes the size of the reorder buffer into
// Sidecar.buffered; an exiting worker sets it to 0.
func (w *stream) setMirrored(n int64) {
	if n != w.mirrored {
		w.s.buffered.Add(n - w.mirrored)
		w.mirrored = n
	}
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
		w.log.Error(err, "Could not hand ready events back")
		return
	}
	w.ready = w.ready[:keep]
	w.handBack(now, "ready events", back)
}

// windowFull reports whether the session workers hold the whole prefetch
// window and nothing has reached the dispatcher for two ticks.
func (w *stream) windowFull(now time.Time) bool {
	window := w.s.cfg.Prefetch
	return window > 0 && int(w.s.holding.Load()) >= window &&
		now.Sub(time.Unix(0, w.s.dispatchedAt.Load())) >= 2*w.tickEvery()
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
	w.log.Info("The prefetch window is full of deliveries that wait; returned some of this session's to the queue so that others can arrive",
		"what", what, "returned", len(back), "from", back[0].Seq, "next", w.tracker.NextExpected())
}

func (w *stream) offer(it *item) {
	seq := it.seq()
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
		w.log.V(1).Info("Skipped a duplicate event", "sequence", seq, "lastProcessed", w.tracker.LastProcessed(), "redelivered", it.d.Redelivered)
		w.settleDurable(it)
	case session.InFlight:
		w.swapInFlight(seq, it)
	case session.Late:
		w.s.m.Rejects.WithLabelValues(ReasonLateEvent).Inc()
		w.log.Info("WARNING: dropped an event that arrived after its gap was skipped", "sequence", seq)
		w.s.settle(it, true)
	default:
		w.s.m.Rejects.WithLabelValues(ReasonMalformed).Inc()
		w.s.settle(it, true)
	}
	w.note(out, LostBufferOverflow)
	w.resolveGap()
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
			w.log.V(1).Info("Holding later events until released ones come back", "missing", out.Gap.String(), "buffered", w.tracker.Buffered())
		} else {
			w.log.Info("WARNING: gap in the event stream; holding later events until it fills", "missing", out.Gap.String(),
				"buffered", w.tracker.Buffered())
		}
	}
	if out.Skipped != nil {
		w.s.m.Rejects.WithLabelValues(ReasonGapSkipped).Add(float64(out.Skipped.Len()))
		w.log.Info("WARNING: skipped a gap in the event stream; those events are treated as lost and the app is told with the next event",
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

func (w *stream) onAccepted(it *item) {
	rec, _ := w.s.store.Session(w.id)
	tid := it.accepted.TaskMessageID
	t, known := w.s.store.Task(tid)
	switch {
	case rec.AcceptedDelivered || (known && t.State == TaskAccepted && t.Delivered):
		w.duplicate(it)
		return
	case known && t.State == TaskRejected:
		w.contradiction(it, "task_accepted for a task already rejected")
		return
	}
	w.s.markAnswered(tid)
	w.taskMessageID = tid
	w.awaitAccepted = false
	if known {
		w.capability = t.Capability
	} else {
		w.log.Info("Received task_accepted for a task this sidecar has no record of (state lost?); delivering it", "task", tid)
	}
	w.addBarrier(envelope.TypeTaskAccepted, 0, it)
}

func (w *stream) onRejected(it *item) {
	tid := it.rejected.TaskMessageID
	t, known := w.s.store.Task(tid)
	switch {
	case known && t.State == TaskRejected && t.Delivered:
		w.duplicate(it)
		return
	case known && t.State == TaskAccepted:
		w.contradiction(it, "task_rejected for a task already accepted")
		return
	}
	w.s.markAnswered(tid)
	w.taskMessageID = tid
	w.awaitAccepted = false
	if known {
		w.capability = t.Capability
	}
	w.addBarrier(envelope.TypeTaskRejected, 0, it)
}

func (w *stream) onTerminal(it *item) {
	rec, _ := w.s.store.Session(w.id)
	if rec.Terminal != "" {
		w.duplicate(it)
		return
	}
	top, _ := w.awaitReleased(0)
	w.addBarrier(it.env.Type, max(w.maxSeen, w.tracker.LastProcessed(), top), it)
}

func (w *stream) duplicate(it *item) {
	w.s.m.Duplicates.WithLabelValues("message").Inc()
	w.log.V(1).Info("Skipped a duplicate", "type", it.env.Type, "messageID", it.env.MessageID)
	w.s.settle(it, true)
}

func (w *stream) contradiction(it *item, why string) {
	w.s.m.Rejects.WithLabelValues(ReasonContradiction).Inc()
	w.log.Info("WARNING: dropped a contradictory answer", "why", why, "messageID", it.env.MessageID)
	w.s.settle(it, true)
}

// addBarrier queues an unsequenced message. A second copy of one already
// held replaces it and the older copy is acked: if both are live, the newer
// stays unacked until delivered; if the older one's channel is gone, its
// ack fails harmlessly and the live copy is the one kept.
func (w *stream) addBarrier(kind envelope.MessageType, anchor int64, it *item) {
	for _, b := range w.barriers {
		switch {
		case b.kind == kind:
			w.s.m.Duplicates.WithLabelValues("message").Inc()
			w.s.settle(b.item, true)
			b.item = it
			return
		case isTerminal(kind) && isTerminal(b.kind):
			w.contradiction(it, "a second, different terminal message ("+string(kind)+" after "+string(b.kind)+")")
			return
		}
	}
	w.barriers = append(w.barriers, &barrier{kind: kind, anchor: anchor, item: it, since: w.s.clk.Now()})
	slices.SortStableFunc(w.barriers, func(a, b *barrier) int {
		switch {
		case a.anchor < b.anchor:
			return -1
		case a.anchor > b.anchor:
			return 1
		}
		return 0
	})
}

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
	w.log.Info("WARNING: the session's events arrived but its task_accepted did not; delivering them without it",
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

// deliverRetrying sends (send POSTs to the app) until the app answers
// 2xx, backing off exponentially between attempts (the deliveries stay
// held, see stream). It gives up, returning false, only when the sidecar
// stops. send rebuilds its request per attempt so that a redelivered copy
// swapped in meanwhile is the one sent.
//
// keep is how many of the ready events the attempts carry: while the app
// fails, the ones after them may be handed back to the queue (shedReady).
func (w *stream) deliverRetrying(what string, keep int, send func() error) bool {
	for attempt := 1; ; attempt++ {
		if w.stopping() {
			return false
		}
		err := send()
		if err == nil {
			if w.setStalled(false) {
				w.log.Info("The app takes this session's messages again", "attempts", attempt)
			}
			return true
		}
		w.setStalled(true)
		d := w.s.o.AppBackoff.after(attempt)
		w.log.Info("The app did not take a message; retrying after a backoff (the delivery stays unacked)", "what", what,
			"attempt", attempt, "retryIn", d.String(), "error", err.Error())
		if !w.backoff(d, keep) {
			if w.stopAt.IsZero() {
				w.stopAt = w.s.clk.Now().Add(w.s.o.DrainTimeout)
			}
			// The app is failing: no point spending the drain time on it.
			return false
		}
	}
}

// backoff waits d, or until the sidecar stops (false). Meanwhile, if the
// prefetch window fills, it hands back to the queue what this session
// holds beyond the keep ready events being retried (see shed).
func (w *stream) backoff(d time.Duration, keep int) bool {
	timer := w.s.clk.NewTimer(d)
	defer timer.Stop()
	tick := w.s.clk.NewTicker(w.tickEvery())
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
		ms := make([]AppMessage, n)
		for i, e := range w.ready[:n] {
			ms[i] = w.s.appMessage(e.Item, w.callee, w.taskMessageID)
		}
		if w.lost != nil && w.lost.To < w.ready[0].Seq {
			ms[0].Lost = w.lost
		}
		if fixed || n > 1 {
			return w.s.deliverBatch(ms)
		}
		return w.s.deliver(ms[0])
	}
	if !w.deliverRetrying("event", n, send) {
		return false
	}
	batch := w.ready[:n]
	w.ready = w.ready[n:]
	last := batch[n-1].Seq
	if w.lost != nil && w.lost.To < last {
		w.lost = nil
	}
	// The app has them: the next events may go at once.
	// last_processed_sequence advances in memory now and on disk with the
	// next group commit; the deliveries are acked only once that fsync has
	// returned (see the package documentation, "Delivery pipeline").
	for _, e := range batch {
		if err := w.tracker.Commit(e.Seq); err != nil {
			w.log.Error(err, "Tracker refused a commit")
		}
	}
	now := w.s.clk.Now()
	_, t := w.s.store.RecordSession(w.id, func(r *SessionRecord) bool {
		r.LastSeq = max(r.LastSeq, last)
		w.fill(r)
		for _, e := range batch {
			applyEvent(r, e.Item)
		}
		r.UpdatedAt = now
		return true
	})
	w.lastTicket = t
	for _, e := range batch {
		w.s.m.Latency.Observe(now.Sub(e.Item.env.Timestamp).Seconds())
	}
	t.Then(func(err error) {
		if err != nil {
			w.log.Error(err, "Failed to persist last_processed_sequence; acking anyway (after a restart these events may be delivered again)", "upTo", last)
		}
		items := make([]*item, len(batch))
		for i, e := range batch {
			items[i] = e.Item
		}
		w.s.ackAll(items)
		raise(&w.acked, last)
	})
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

// raise sets v to seq unless it is already higher.
func raise(v *atomic.Int64, seq int64) {
	for {
		cur := v.Load()
		if seq <= cur || v.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// settleDurable acks a message that needs no delivery (a duplicate) once
// every record write of this session made so far is durable: a duplicate
// of an event whose own ack is still waiting for its fsync must not leave
// the queue before that fsync.
func (w *stream) settleDurable(it *item) {
	if w.lastTicket == nil {
		w.s.settle(it, true)
		return
	}
	w.lastTicket.Then(func(error) { w.s.settle(it, true) })
}

// durable waits until every record write of this session is durable and
// the acks waiting for it are sent.
func (w *stream) durable() {
	if w.lastTicket != nil {
		_ = w.lastTicket.Wait()
	}
}

// reportAcked records the highest durably acked sequence as
// callerAckedSequence, if it moved. fresh re-reads the HCPSession even if
// it was recently missing (terminal messages, stop). A sequence that could
// not be recorded (the HCPSession not found yet) is retried on later calls.
func (w *stream) reportAcked(fresh bool) {
	seq := w.acked.Load()
	if seq <= w.reported && (!fresh || !w.unreported) {
		return
	}
	if w.s.recordAcked(w.id, max(seq, w.reported), fresh) {
		w.reported, w.unreported = max(seq, w.reported), false
		return
	}
	w.unreported = true
}

// fill copies what the worker knows into the record. It runs inside a
// store update, so it must not call the store.
func (w *stream) fill(r *SessionRecord) {
	if w.callee != "" {
		r.CalleeID = w.callee
	}
	r.Unverified = w.unverified
	if w.taskMessageID != "" {
		r.TaskMessageID = w.taskMessageID
	}
	if r.Capability == "" {
		r.Capability = w.capability
	}
}

// applyEvent folds the lifecycle events into the record's state.
func applyEvent(r *SessionRecord, it *item) {
	switch d := it.eventData.(type) {
	case *session.SessionCreatedData:
		if r.State == "" || r.State == string(session.StatePending) {
			r.State = string(d.State)
		}
		if r.RiskLevel == "" {
			r.RiskLevel = string(d.RiskLevel)
		}
		if r.Token == "" {
			r.Token = d.SessionToken
		}
	case *session.StateChangedData:
		if !session.State(r.State).IsTerminal() {
			r.State = string(d.ToState)
		}
	case *session.SessionClosedData:
		r.State = string(d.FinalState)
		r.Closed = true
	}
}

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
	if !w.deliverRetrying(string(b.kind), 0, func() error { return w.s.deliver(w.s.appMessage(b.item, w.callee, tid())) }) {
		return false
	}
	it := b.item
	w.barriers = w.barriers[1:]
	now := w.s.clk.Now()
	var errs []error
	switch b.kind {
	case envelope.TypeTaskAccepted:
		a := it.accepted
		var capability string
		_, err := w.s.store.UpdateTask(a.TaskMessageID, func(t *TaskRecord) bool {
			if t.CalleeID == "" { // no record: nothing to update
				return false
			}
			capability = t.Capability
			t.State, t.SessionID, t.RiskLevel = TaskAccepted, w.id, string(a.RiskLevel)
			t.AnsweredAt, t.Delivered, t.Envelope = now, true, nil
			return true
		})
		errs = append(errs, err)
		_, err = w.s.store.UpdateSession(w.id, func(r *SessionRecord) bool {
			w.fill(r)
			r.TaskMessageID = a.TaskMessageID
			if capability != "" {
				r.Capability = capability
			}
			r.Token, r.TokenExpiresAt, r.RiskLevel = a.SessionToken, a.ExpiresAt.Time, string(a.RiskLevel)
			r.AcceptedDelivered = true
			if r.State == "" {
				r.State = string(session.StateRunning)
			}
			r.UpdatedAt = now
			return true
		})
		errs = append(errs, err)
	case envelope.TypeTaskRejected:
		rj := it.rejected
		_, err := w.s.store.UpdateTask(rj.TaskMessageID, func(t *TaskRecord) bool {
			if t.CalleeID == "" {
				return false
			}
			t.State, t.ReasonCode, t.ReasonMessage = TaskRejected, string(rj.ReasonCode), rj.Message
			t.AnsweredAt, t.Delivered, t.Envelope = now, true, nil
			return true
		})
		errs = append(errs, err)
		_, err = w.s.store.UpdateSession(w.id, func(r *SessionRecord) bool {
			w.fill(r)
			r.TaskMessageID = rj.TaskMessageID
			r.State, r.Terminal = string(session.StateRejected), string(envelope.TypeTaskRejected)
			r.UpdatedAt = now
			return true
		})
		errs = append(errs, err)
	default: // task_completed, task_failed
		_, err := w.s.store.UpdateSession(w.id, func(r *SessionRecord) bool {
			w.fill(r)
			r.Terminal = string(b.kind)
			if !session.State(r.State).IsTerminal() {
				if b.kind == envelope.TypeTaskCompleted {
					r.State = string(session.StateCompleted)
				} else {
					r.State = string(session.StateFailed)
				}
			}
			r.UpdatedAt = now
			return true
		})
		errs = append(errs, err)
	}
	for _, err := range errs {
		if err != nil {
			w.log.Error(err, "Failed to persist a delivered message; acking anyway (after a restart it may be delivered again)", "type", b.kind)
		}
	}
	w.s.settle(it, true)
	if isTerminal(b.kind) {
		// The synchronous write above covered every earlier event, and
		// their acks ran before it returned: the final callerAckedSequence
		// is known. It is written at once, not after the status interval.
		w.reportAcked(true)
		if !w.unreported {
			w.s.flushStatus(w.id)
		}
	}
	return true
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
		switch {
		case w.gapSince.IsZero() || awaiting:
			w.gapSince = now
		case w.marked:
			// The callee's marks say when events are gone (resolveGap);
			// until then they are on their way: wait, whatever the time.
			w.resolveGap()
			if !w.gapWarned && now.Sub(w.gapSince) >= w.s.o.GapTimeout {
				w.gapWarned = true
				w.log.Info("WARNING: a gap in the event stream is still open; waiting for the callee to republish the missing events",
					"next", w.tracker.NextExpected(), "confirmedThrough", w.mark, "open", now.Sub(w.gapSince).String())
			}
		case now.Sub(w.gapSince) >= w.s.o.GapTimeout:
			w.note(w.tracker.Skip(), LostGapTimeout)
		}
	} else {
		w.gapSince = time.Time{}
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
			w.log.Info("WARNING: events before a terminal message never arrived; delivering it", "type", b.kind,
				"lastProcessed", w.tracker.LastProcessed(), "expectedUpTo", b.anchor)
			b.anchor = w.tracker.LastProcessed()
		}
	}
	w.pump()
	w.mirror()
}

func (w *stream) idle() bool {
	if len(w.inbox) != 0 || len(w.ready) != 0 || len(w.barriers) != 0 || w.tracker.Buffered() != 0 ||
		w.tracker.InFlight() != 0 || (w.lastTicket != nil && !w.lastTicket.Done()) {
		return false
	}
	quiet := w.s.clk.Since(w.lastActive)
	if quiet >= idleTimeout {
		return true
	}
	// A session that has ended expects nothing more: its worker goes soon
	// (a late copy starts a new one, which finds the record over).
	rec, ok := w.s.store.Session(w.id)
	return quiet >= endedLinger && ok && rec.over()
}

// tryExit removes the worker unless a message arrived meanwhile.
func (w *stream) tryExit() bool {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if len(w.inbox) > 0 {
		return false
	}
	if w.s.streams[w.id] == w {
		delete(w.s.streams, w.id)
	}
	w.leave()
	return true
}
