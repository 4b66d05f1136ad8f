package caller

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

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

// stream is one session's worker, the one owner of the session's
// delivery: it takes the session's messages in (receive.go), orders them
// through its tracker (order.go), delivers them to the app one request at
// a time (deliver.go), records what the app took (commit.go) and acks it
// after the fsync (settle.go). Its state is its goroutine's; the few
// fields that others touch (the dispatcher, the store's committer) say so.
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
	inbox   mailbox
	tracker *session.Tracker[*item]

	// ready are events handed out by the tracker, in order, not yet
	// delivered.
	ready    []session.Entry[*item]
	barriers []*barrier
	// msgs is deliverEvents' scratch for the app messages of one request,
	// cleared after it (nothing keeps them: they are encoded at once).
	msgs []AppMessage
	// maxSeen is the highest sequence offered (or persisted).
	maxSeen       int64
	callee        string
	unverified    bool
	taskMessageID string
	capability    string
	taskLooked    bool
	gapSince      time.Time
	// gapOpened is when the current gap opened; unlike gapSince, waiting for
	// released events does not move it (see Options.MaxGapWait).
	gapOpened time.Time
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
	// acks wait for it (see commitEvents).
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
	// epoch is the session's highest owner epoch seen, epochFrom the lowest
	// sequence of that epoch seen (see fence); bodies are the digests of
	// the event bodies received first, by sequence (see sameBody).
	epoch     int64
	epochFrom int64
	bodies    map[int64]uint64
	// asleep says the worker's goroutine ended while it held nothing
	// (sleep.go); ended, that the session was over then. Both s.mu.
	asleep, ended bool
	// refused is why the session's messages are refused, if they are:
	// ReasonForeignSession (its HCPSession names another caller) or
	// ReasonUnsolicitedSession (this caller never submitted it).
	refused string
}

// log is the session's logger, made when something is logged: a logger
// kept per session holds its encoded fields (about 1.4 KiB with zap) for
// the session's life.
func (w *stream) log() logr.Logger { return w.s.log.WithValues("session", w.id) }

// newStream builds the worker of session sid; called with s.mu held. Its
// tracker is made by init, on the worker's goroutine.
func (s *Sidecar) newStream(sid string) *stream {
	w := &stream{s: s, id: sid, lastActive: s.clk.Now()}
	w.inbox.init()
	return w
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
	w.epoch, w.epochFrom = rec.OwnerEpoch, rec.EpochFrom
	if w.refused == "" && w.callee == "" {
		w.callee, w.unverified = rec.CalleeID, rec.Unverified
		w.taskMessageID, w.capability = rec.TaskMessageID, rec.Capability
	}
	w.s.mu.Lock()
	w.tracker = tr // read under s.mu by the session view
	w.s.mu.Unlock()
	return true
}

// run is the worker's loop: it takes what the dispatcher hands it, runs
// the timeouts on every tick while it holds something, and ends its
// goroutine (sleep) once it holds nothing. A sleeping worker keeps its
// state in Sidecar.streams; a delivery wakes it, and the sweeper wakes it
// when it has been idle long enough to exit (tryExit) or when the sidecar
// stops (drain).
func (w *stream) run() {
	defer w.s.workers.Done()
	if w.tracker == nil && !w.init() {
		w.s.mu.Lock()
		if w.s.streams[w.id] == w {
			delete(w.s.streams, w.id)
		}
		w.s.mu.Unlock()
		return
	}
	var tick clock.Ticker
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	if w.idle() { // woken by the sweeper
		w.reportAcked(true)
		if w.tryExit() {
			return
		}
	}
	for {
		if w.holdsNothing() && w.sleep() {
			return
		}
		if tick == nil {
			tick = w.s.clk.NewTicker(w.s.tickEvery())
		}
		select {
		case <-w.s.stopCh:
			w.drain()
			return
		case <-w.inbox.ready:
			items := w.inbox.take()
			if len(items) == 0 {
				continue
			}
			w.lastActive = w.s.clk.Now()
			// Everything that arrived is taken in together, so that with
			// AppMaxBatch the next request carries all of it. The
			// dispatcher learns of a gap after each message, before the
			// delivery: without that it hands the session every event
			// until the delivery returns, and a long gap overflows the
			// reorder buffer.
			for _, it := range items {
				w.accept(it)
				w.mirror()
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

// tickEvery is the period of the workers' timeouts (onTick) and of the
// sweeper.
func (s *Sidecar) tickEvery() time.Duration {
	return min(max(s.o.GapTimeout/4, 10*time.Millisecond), time.Second)
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
	var taken []*item
	for !w.stopping() {
		if len(taken) > 0 {
			w.process(taken[0])
			taken = taken[1:]
			continue
		}
		select {
		case <-w.inbox.ready:
			taken = w.inbox.take()
			continue
		case <-w.s.clk.After(100 * time.Millisecond):
		}
		break
	}
	// The acks of what was delivered go out before the channel closes.
	w.waitDurable()
	w.reportAcked(true)
	w.s.mu.Lock()
	if w.s.streams[w.id] == w {
		delete(w.s.streams, w.id)
	}
	w.s.mu.Unlock()
	w.leave()
	held := len(taken) + w.inbox.len() + len(w.ready) + len(w.barriers) + w.tracker.Buffered()
	if held > 0 {
		w.log().V(1).Info("Stopped with deliveries unsettled; the broker returns them to the head of the queue", "held", held)
	}
}

// process takes one message in and delivers what is ready.
func (w *stream) process(it *item) {
	w.accept(it)
	w.advance()
}

// advance delivers what is ready and publishes the position.
func (w *stream) advance() {
	w.pump()
	w.reportAcked(false)
	w.mirror()
}

// idle reports whether the worker holds nothing and has been quiet long
// enough to exit (Options.WorkerIdle, or endedLinger once the session is
// over).
func (w *stream) idle() bool {
	if w.holding() {
		return false
	}
	quiet := w.s.clk.Since(w.lastActive)
	return w.exitDue(quiet, quiet >= endedLinger && w.over())
}

// exitDue reports whether a worker that holds nothing and has been quiet
// for quiet may exit: after WorkerIdle, or after endedLinger once its
// session has ended (it expects nothing more; a late copy starts a new
// worker, which finds the record over).
func (w *stream) exitDue(quiet time.Duration, ended bool) bool {
	return quiet >= w.s.o.WorkerIdle || (ended && quiet >= endedLinger)
}

// over reports whether the session's record says it has ended.
func (w *stream) over() bool {
	rec, ok := w.s.store.Session(w.id)
	return ok && rec.over()
}

// tryExit removes the worker unless a message arrived meanwhile, and,
// unless the session is over, parks what its next worker needs to skip a
// read (park).
func (w *stream) tryExit() bool {
	over := w.over()
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if w.inbox.len() > 0 {
		return false
	}
	if w.s.streams[w.id] == w {
		delete(w.s.streams, w.id)
	}
	if !over {
		w.park()
	}
	w.leave()
	return true
}
