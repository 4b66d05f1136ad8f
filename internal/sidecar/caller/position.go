package caller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
)

// recordAcked records callerAckedSequence through the coalescing status
// writer, when the HCPSession is this caller's and in this namespace (or no
// client is given to check). It reports false when it could not: the
// session's worker keeps the sequence and calls again (on its next ack or
// tick, and with fresh set at the session's terminal message, at stop and
// before it exits idle), so the last value is not lost to a miss cached
// while the cache had not yet seen a new HCPSession. fresh drops a cached
// miss first. A value that could not be recorded for want of an answer from
// the API server is kept for flushPositions.
func (s *Sidecar) recordAcked(sid string, seq int64, fresh bool) bool {
	if s.o.Status == nil {
		return true
	}
	w, l := s.positionWriter(sid, fresh)
	if l.err != nil {
		s.notePosition(sid, seq)
	}
	if !l.found {
		return false
	}
	if w == nil {
		return true // in another namespace, and no writer there
	}
	w.Update(sid, func(st *v1alpha1.HCPSessionStatus) {
		if seq > st.CallerAckedSequence {
			st.CallerAckedSequence = seq
		}
	})
	s.notePosition(sid, seq)
	return true
}

// positionWriter looks session sid up (lookupSession) and returns the
// writer of its HCPSession's namespace (statusFor; nil: none there). With
// neither Client nor Reader nothing is looked up: the lookup counts as
// found, and the writer is Options.Status.
func (s *Sidecar) positionWriter(sid string, fresh bool) (StatusWriter, lookup) {
	if s.o.Client == nil && s.o.Reader == nil {
		return s.o.Status, lookup{found: true}
	}
	l := s.lookupSession(sid, fresh)
	if !l.found {
		return nil, l
	}
	return s.statusFor(l.namespace), l
}

// statusFor is the status writer of HCPSessions in namespace ns:
// Options.Status in the sidecar's own, one made by Options.StatusIn in
// another (a Callee's), nil without StatusIn.
func (s *Sidecar) statusFor(ns string) StatusWriter {
	if ns == "" || ns == s.cfg.Namespace {
		return s.o.Status
	}
	if s.o.StatusIn == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.writers[ns]
	if !ok {
		w = s.o.StatusIn(ns)
		if iv, ok := w.(interface{ SetInterval(time.Duration) }); ok && s.o.StatusInterval > 0 {
			iv.SetInterval(s.o.StatusInterval)
		}
		s.writers[ns] = w
	}
	return w
}

// writerOf is the status writer of session sid's HCPSession, by the
// namespace its last lookup found it in (the sidecar's own if none).
func (s *Sidecar) writerOf(sid string) StatusWriter {
	s.mu.Lock()
	ns := s.lookups[sid].namespace
	s.mu.Unlock()
	return s.statusFor(ns)
}

// notePosition remembers seq as a position to make sure of at stop.
func (s *Sidecar) notePosition(sid string, seq int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq > s.positions[sid] {
		s.positions[sid] = seq
	} else if _, ok := s.positions[sid]; !ok {
		s.positions[sid] = seq
	}
}

// finalPositionDelay is how long after a session's session_closed is
// durable its callerAckedSequence is written. The callee sidecar writes
// the terminal status once the broker has confirmed the messages that end
// the session, so within it that write normally lands first: a short
// session's first status write replaces the status whole, and finding the
// caller's field there it would read the object and write again.
const finalPositionDelay = 200 * time.Millisecond

// writeFinalPosition writes seq, the sequence of sid's session_closed
// (the session's last message, durable and acked), as callerAckedSequence
// finalPositionDelay from now, without waiting for the status interval:
// so a session shorter than the interval costs one write, which holds its
// last sequence. A session that ends without session_closed (a callee
// that does not send it) has its last position written after the
// interval. At a stop, flushPositions writes every position instead.
func (s *Sidecar) writeFinalPosition(sid string, seq int64) {
	s.clk.AfterFunc(finalPositionDelay, func() {
		select {
		case <-s.stopCh:
			return
		default:
		}
		if s.recordAcked(sid, seq, true) {
			s.flushStatus(sid)
		}
	})
}

// statusFlusher is implemented by *status.Writer.
type statusFlusher interface {
	Flush(ctx context.Context, name string) error
}

// flushStatus writes sid's pending status now rather than after the
// interval (a session's terminal message), without waiting for it.
func (s *Sidecar) flushStatus(sid string) {
	f, ok := s.writerOf(sid).(statusFlusher)
	if !ok {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.Flush(ctx, sid); err != nil {
			s.log.V(1).Info("Failed to flush callerAckedSequence; the status writer retries", "session", sid, "error", err.Error())
		}
	}()
}

// writePosition makes sure the HCPSession sid stores callerAckedSequence
// seq (or more): recorded through the status writer and flushed. nil also
// means that nothing can be written (no HCPSession of this caller here, or
// it is gone).
func (s *Sidecar) writePosition(ctx context.Context, sid string, seq int64) error {
	if s.o.Status == nil {
		return nil
	}
	w, l := s.positionWriter(sid, true)
	if l.err != nil {
		return l.err
	}
	if !l.found || w == nil {
		return nil
	}
	w.Update(sid, func(st *v1alpha1.HCPSessionStatus) {
		if seq > st.CallerAckedSequence {
			st.CallerAckedSequence = seq
		}
	})
	f, ok := w.(statusFlusher)
	if !ok {
		return nil
	}
	if err := f.Flush(ctx, sid); err != nil && !errors.Is(err, status.ErrNotFound) {
		return err
	}
	return nil
}

// flushPositions writes every position noted (see notePosition) and waits
// for the writes, retrying failures with exponential backoff until all
// landed or ctx ends.
func (s *Sidecar) flushPositions(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		s.mu.Lock()
		pending := make(map[string]int64, len(s.positions))
		for sid, seq := range s.positions {
			pending[sid] = seq
		}
		s.mu.Unlock()
		var (
			mu   sync.Mutex
			errs []error
			wg   sync.WaitGroup
			sem  = make(chan struct{}, 8)
		)
		for sid, seq := range pending {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				if err := s.writePosition(ctx, sid, seq); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("session %s: %w", sid, err))
					mu.Unlock()
					return
				}
				s.mu.Lock()
				if s.positions[sid] == seq {
					delete(s.positions, sid)
				}
				s.mu.Unlock()
			})
		}
		wg.Wait()
		if len(errs) == 0 {
			if len(pending) > 0 {
				s.log.Info("Recorded every session's position in its HCPSession", "sessions", len(pending), "attempts", attempt)
			}
			return nil
		}
		err := errors.Join(errs...)
		s.log.Info("Failed to record some sessions' callerAckedSequence; retrying", "failed", len(errs), "attempt", attempt,
			"retryIn", backoff.String(), "error", err.Error())
		timer := s.clk.NewTimer(backoff)
		select {
		case <-timer.C():
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("callerAckedSequence of %d sessions not recorded: %w", len(errs), err)
		}
		backoff = min(2*backoff, 5*time.Second)
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
