package caller

import "context"

// A session's worker keeps a goroutine only while it holds something: a
// delivery, an event waiting for its turn or for the app, a record not yet
// fsynced, a position not yet reported, an event released to the queue.
// Then it sleeps: its goroutine (a stack of a few KiB) and its ticker end,
// and its state stays in Sidecar.streams. A delivery wakes it (dispatch);
// the sweeper wakes it once it has been quiet long enough to exit, and
// stop wakes every sleeper to drain. A thousand live sessions that send
// nothing hold no goroutine and no timer.

// holdsNothing reports whether the worker has nothing to deliver, settle
// or report, and no timeout to run.
func (w *stream) holdsNothing() bool {
	return !w.holding() && w.acked.Load() <= w.reported && !w.awaitsReleased()
}

// holding reports whether the worker holds deliveries, events or a record
// not yet fsynced.
func (w *stream) holding() bool {
	return w.inbox.len() != 0 || len(w.ready) != 0 || len(w.barriers) != 0 || w.tracker.Buffered() != 0 ||
		w.tracker.InFlight() != 0 || (w.lastTicket != nil && !w.lastTicket.Done())
}

// awaitsReleased reports whether events released to the queue are still
// expected back.
func (w *stream) awaitsReleased() bool {
	w.relMu.Lock()
	defer w.relMu.Unlock()
	return len(w.released) != 0
}

// sleep ends the worker's goroutine unless a delivery arrived meanwhile or
// the sidecar is stopping; s.mu orders it with dispatch's wake-up. It
// notes whether the session is over, for the sweeper.
func (w *stream) sleep() bool {
	ended := w.over()
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if w.inbox.len() != 0 || w.s.stopping {
		return false
	}
	w.asleep, w.ended = true, ended
	return true
}

// wakeLocked starts a sleeping worker's goroutine again (s.mu held).
func (s *Sidecar) wakeLocked(w *stream) {
	w.asleep = false
	s.workers.Add(1)
	go w.run()
}

// sweep wakes, every tickEvery, the sleeping workers due to exit.
func (s *Sidecar) sweep(ctx context.Context) {
	t := s.clk.NewTicker(s.tickEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		now := s.clk.Now()
		s.mu.Lock()
		if !s.stopping {
			for _, w := range s.streams {
				if w.asleep && w.exitDue(now.Sub(w.lastActive), w.ended) {
					s.wakeLocked(w)
				}
			}
		}
		s.mu.Unlock()
	}
}

// wakeAllLocked wakes every sleeping worker, to drain (s.mu held, stopping
// set).
func (s *Sidecar) wakeAllLocked() {
	for _, w := range s.streams {
		if w.asleep {
			s.wakeLocked(w)
		}
	}
}
