package caller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hcp-io/hcp-operator/internal/transport"
)

// Run consumes the event queue and republishes pending submits until ctx
// ends, then shuts down (see stop): deliveries stop being handed to the
// session workers, the app requests in progress finish and are persisted and
// acked, deliveries already received are still delivered for up to
// DrainTimeout, every session's callerAckedSequence is written (retried for
// up to FlushTimeout), and only then does the consumer's channel close, so
// whatever is left (behind a gap, failed by the app, not yet handed over)
// returns to the head of the queue, in order, for the next consumer, which
// can then rely on the HCPSession's position. After Drain, Run no longer
// consumes but keeps republishing submits until ctx ends. The store is
// closed last. Run may be called once.
func (s *Sidecar) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("caller sidecar: Run called twice")
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The consumer outlives ctx until the positions are written.
	consumeCtx, stopConsume := context.WithCancel(context.WithoutCancel(ctx))
	defer stopConsume()
	s.mu.Lock()
	s.runCtx = runCtx
	s.stopConsume = stopConsume
	drained := s.stopping // Drain before Run: nothing to consume
	s.mu.Unlock()
	s.log.Info("Starting caller sidecar", "queue", s.queue, "prefetch", s.cfg.Prefetch, "stateDir", s.cfg.StateDir,
		"tasks", len(s.store.Tasks()), "sessions", len(s.store.Sessions()))

	var bg sync.WaitGroup
	bg.Go(func() { s.retryLoop(runCtx) })
	bg.Go(func() { s.housekeeping(runCtx) })
	bg.Go(func() { s.sweep(runCtx) })
	// A graceful stop: the same sequence as Drain, bounded by FlushTimeout.
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-runCtx.Done():
		case <-consumeCtx.Done():
			// Drained, or the consumer failed: Run still ends with ctx.
			<-runCtx.Done()
		}
		fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), s.o.FlushTimeout)
		defer fcancel()
		if err := s.stop(fctx); err != nil {
			s.log.Error(err, "Stopped without recording every session's position in its HCPSession; a new pod may deliver some events again")
		}
	}()

	var err error
	if drained {
		stopConsume()
	} else {
		s.consuming.Store(true)
		err = s.o.Consumer.Consume(consumeCtx, s.queue, s.cfg.Prefetch, s.handle)
		s.consuming.Store(false)
	}
	if consumeCtx.Err() == nil {
		// The consumer ended by itself (a failure): stop now and return it.
		cancel()
	} else if errors.Is(err, context.Canceled) || errors.Is(err, transport.ErrClosed) {
		err = nil
	}
	<-stopped
	cancel()
	bg.Wait()
	s.workers.Wait()
	s.endStream()
	if s.ownStore {
		if cerr := s.store.Close(); cerr != nil {
			s.log.Error(cerr, "Failed to close the state store")
		}
	}
	s.log.Info("Stopped caller sidecar")
	if err != nil && ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

// Drain prepares the pod's deletion (the preStop hook calls it before the
// app gets SIGTERM): the sidecar stops handing deliveries to its session
// workers, which finish what they hold (up to DrainTimeout: the app request
// in progress and the deliveries already received), fsync the store and ack
// what was delivered; then every session's position is written to its
// HCPSession's status.callerAckedSequence (retried with backoff until it
// lands or ctx ends), and only then is the consumer stopped, without
// basic.cancel: its channel closes and the broker hands what is unsettled,
// at the head of the queue and in order, to the next consumer, which
// resumes each session from that exact position. Drain returns an error if
// a position could not be written before ctx ended (the consumer is stopped
// regardless). It is idempotent; Run keeps republishing submits until its
// own ctx ends and then returns as usual.
func (s *Sidecar) Drain(ctx context.Context) error {
	s.log.Info("Draining: no more deliveries to the app; recording every session's position")
	start := s.clk.Now()
	err := s.stop(ctx)
	if err != nil {
		return fmt.Errorf("caller sidecar drain: %w", err)
	}
	s.log.Info("Drained", "took", s.clk.Since(start).Round(time.Millisecond).String())
	return nil
}

// stop is the shutdown sequence of Drain and of Run's graceful end; each
// step is idempotent.
func (s *Sidecar) stop(ctx context.Context) error {
	s.mu.Lock()
	if !s.stopping {
		s.stopping = true
		close(s.stopCh)
		s.wakeAllLocked()
	}
	stopConsume := s.stopConsume
	s.mu.Unlock()
	// Once stopping is set no worker is added, so Wait is safe.
	workersDone := make(chan struct{})
	go func() {
		s.workers.Wait()
		close(workersDone)
	}()
	var err error
	select {
	case <-workersDone:
		err = s.flushPositions(ctx)
	case <-ctx.Done():
		err = fmt.Errorf("session workers did not finish: %w", ctx.Err())
	}
	// The channel closes (and a standby consumer takes over) only now.
	if stopConsume != nil {
		stopConsume()
	}
	return err
}

// housekeeping forgets old finished tasks and sessions and keeps the
// sessions gauge current.
func (s *Sidecar) housekeeping(ctx context.Context) {
	t := s.clk.NewTicker(30 * time.Second)
	defer t.Stop()
	s.sessionGauge()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			s.prune()
			s.sessionGauge()
		}
	}
}

func (s *Sidecar) prune() {
	cutoff := s.clk.Now().Add(-s.o.Retention)
	for _, t := range s.store.Tasks() {
		done := (t.State.answered() && t.Delivered) || t.State == TaskUnanswered || t.State == TaskExpired || t.Adopted
		last := t.AnsweredAt
		if last.IsZero() {
			last = t.LastAttemptAt
		}
		if last.IsZero() {
			last = t.SubmittedAt
		}
		if done && last.Before(cutoff) {
			if err := s.store.DeleteTask(t.MessageID); err != nil {
				s.log.Error(err, "Failed to forget an old task", "task", t.MessageID)
			}
			s.mu.Lock()
			delete(s.answered, t.MessageID)
			s.mu.Unlock()
		}
	}
	for _, r := range s.store.Sessions() {
		if r.over() && r.UpdatedAt.Before(cutoff) {
			s.mu.Lock()
			_, active := s.streams[r.SessionID]
			delete(s.lookups, r.SessionID)
			if !active {
				delete(s.positions, r.SessionID)
			}
			s.mu.Unlock()
			if active {
				continue
			}
			if err := s.store.DeleteSession(r.SessionID); err != nil {
				s.log.Error(err, "Failed to forget an old session", "session", r.SessionID)
			}
		}
	}
}

func (s *Sidecar) sessionGauge() {
	counts := map[string]float64{}
	for _, r := range s.store.Sessions() {
		st := r.State
		if st == "" {
			st = "UNKNOWN"
		}
		counts[st]++
	}
	s.m.Sessions.Reset()
	for st, n := range counts {
		s.m.Sessions.WithLabelValues(st).Set(n)
	}
}
