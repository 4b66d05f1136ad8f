package callee

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Run checks the topology, recovers the sessions a previous incarnation
// left behind, consumes commands until ctx ends, then shuts down
// gracefully: it stops consuming, finishes the deliveries in hand, lets
// running sessions go on for Timeouts.ShutdownDrain, fails the rest
// (callee_shutdown), waits for their last events to be confirmed and
// flushes their status.
func (s *Sidecar) Run(ctx context.Context) error {
	defer s.stopLife()
	log := s.log.WithValues("callee", s.id, "pod", s.pod)
	queue := topology.CommandQueue(s.id)

	if err := s.checkTopology(ctx); err != nil {
		return err
	}
	if cl, err := s.callee(ctx); err == nil {
		s.st.SetInterval(policy.CalleeDuration(cl.Spec.Sessions.StatusUpdateInterval, status.DefaultInterval))
		if b := cl.Spec.Sessions.StatusWritesPerSecond; b != nil {
			s.st.SetBudget(float64(*b))
		}
	} else {
		log.Error(err, "Failed to read the Callee; using default session settings for now")
	}
	if err := s.watchAborts(ctx); err != nil {
		return err
	}
	defer func() { _ = s.wal.Release() }()
	s.readopt(ctx)
	s.recover(ctx)
	go s.sweepLoop(ctx)
	go s.harnessWatchdog(ctx)
	go s.revalidateLoop(ctx)
	go s.fenceWatch(ctx)

	consumeCtx, stopConsume := context.WithCancel(context.WithoutCancel(ctx))
	s.mu.Lock()
	s.stopConsume = stopConsume
	s.mu.Unlock()
	consumeDone := make(chan error, 1)
	go func() {
		s.consuming.set(true, nil)
		err := s.cons.Consume(consumeCtx, queue, s.cfg.Prefetch, s.handle)
		s.consuming.set(false, err)
		consumeDone <- err
	}()
	log.Info("Consuming commands", "queue", queue, "prefetch", s.cfg.Prefetch)

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-consumeDone:
		if s.draining() {
			// Drained (the pod is being deleted): stay up, serving the
			// local API, until told to stop.
			consumeDone <- nil
			<-ctx.Done()
			break
		}
		// Consume only returns early when the transport was closed.
		runErr = fmt.Errorf("consuming %s: %w", queue, err)
		consumeDone <- err
	}
	log.Info("Shutting down: no new tasks; handing sessions over")
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.t.ShutdownDrain)
	_ = s.Drain(dctx)
	cancel()
	if err := <-consumeDone; err != nil && runErr == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, transport.ErrClosed) {
		log.Error(err, "The consumer ended with an error")
	}
	if !waitTimeout(&s.inflight, s.t.ShutdownDrain) {
		log.Info("Commands still in hand after the drain time; they return to the queue")
	}
	s.drainSessions(log)
	// Unblocks whatever still waits on the broker; the deliveries it holds
	// are requeued by the broker.
	s.stopLife()
	waitTimeout(&s.inflight, 5*time.Second)
	return runErr
}

// waitTimeout waits for wg at most d; false when it timed out.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func (s *Sidecar) checkTopology(ctx context.Context) error {
	err := s.conn.CheckTopology(ctx,
		map[string]string{topology.CommandsExchange: topology.CommandsExchangeType, topology.EventsExchange: topology.EventsExchangeType},
		[]string{topology.CommandQueue(s.id)})
	if err != nil {
		return fmt.Errorf("callee %q: the HCP topology is incomplete (the operator declares it; the sidecar may not): %w", s.id, err)
	}
	return nil
}

// drainSessions waits up to ShutdownDrain for the running sessions to end,
// fails the rest, and waits (10 s at most) for their last confirms.
func (s *Sidecar) drainSessions(log logr.Logger) {
	deadline := s.clk.NewTimer(s.t.ShutdownDrain)
	defer deadline.Stop()
	tick := s.clk.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for s.activeCount() > 0 {
		select {
		case <-deadline.C():
			for _, ss := range s.active() {
				log.Info("Failing a session still running at shutdown", "session", ss.id)
				ss.terminate(codeCalleeShutdown, "the callee sidecar shut down before the task finished", true)
			}
		case <-tick.C():
			continue
		}
		break
	}
	done := make(chan struct{})
	go func() { s.sessionsWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		log.Info("Gave up waiting for the confirms of the last events")
	}
}

func (s *Sidecar) active() []*sess {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*sess
	for _, ss := range s.sessions {
		if !ss.ended() {
			out = append(out, ss)
		}
	}
	return out
}

func (s *Sidecar) activeCount() int { return len(s.active()) }

// flag is the consumer's state, for Ready.
type flag struct {
	mu  sync.Mutex
	on  bool
	err error
}

func (f *flag) set(on bool, err error) {
	f.mu.Lock()
	f.on, f.err = on, err
	f.mu.Unlock()
}

func (f *flag) get() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.on, f.err
}
