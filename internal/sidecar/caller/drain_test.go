package caller

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// idleConsumer consumes nothing until its ctx ends.
type idleConsumer struct{ stopped chan struct{} }

func (c *idleConsumer) Consume(ctx context.Context, _ string, _ int, _ transport.Handler) error {
	<-ctx.Done()
	close(c.stopped)
	return ctx.Err()
}

// Subscribed: an idle consumer counts as subscribed while it runs.
func (c *idleConsumer) Subscribed(string) bool {
	select {
	case <-c.stopped:
		return false
	default:
		return true
	}
}

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, string, string, amqp.Publishing) error { return nil }

func (nopPublisher) PublishAsync(context.Context, string, string, amqp.Publishing) (transport.Confirmation, error) {
	return nil, errors.New("not used")
}

// flakyStatus is a StatusWriter whose Flush fails a number of times.
type flakyStatus struct {
	mu       sync.Mutex
	acked    map[string]int64
	failures int
	flushes  int
}

func (f *flakyStatus) Update(name string, mutate func(*v1alpha1.HCPSessionStatus)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := v1alpha1.HCPSessionStatus{CallerAckedSequence: f.acked[name]}
	mutate(&st)
	f.acked[name] = st.CallerAckedSequence
}

func (f *flakyStatus) Flush(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flushes++
	if f.failures != 0 {
		f.failures--
		return errors.New("injected: API server unavailable")
	}
	return nil
}

func newIdleSidecar(t *testing.T, st StatusWriter) (*Sidecar, *idleConsumer) {
	t.Helper()
	c := &idleConsumer{stopped: make(chan struct{})}
	cfg := &config.Config{Mode: config.ModeCaller, ID: "alpha", ObjectName: "alpha", Namespace: "default", Vhost: "v",
		Username: topology.Username(topology.RoleCaller, "v", "alpha"), HarnessURL: "http://127.0.0.1:1", Prefetch: 10}
	sc, err := New(Options{Config: cfg, Publisher: nopPublisher{}, Consumer: c, Status: st, StatusInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	return sc, c
}

func runIt(sc *Sidecar) (context.CancelFunc, chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	return cancel, done
}

func waitRun(t *testing.T, done chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}

// TestDrainLifecycle: Drain stops the consumer and makes the sidecar
// unready; Drain again is a no-op; Run keeps going until its ctx ends and
// returns nil. Drain before Run and after Run are harmless.
func TestDrainLifecycle(t *testing.T) {
	t.Run("during Run", func(t *testing.T) {
		sc, c := newIdleSidecar(t, nil)
		cancel, done := runIt(sc)
		defer cancel()
		eventually(t, 5*time.Second, "consuming", sc.Ready)
		for i := range 2 {
			if err := sc.Drain(context.Background()); err != nil {
				t.Fatalf("Drain %d: %v", i+1, err)
			}
		}
		select {
		case <-c.stopped:
		case <-time.After(5 * time.Second):
			t.Fatal("Drain did not stop the consumer")
		}
		if sc.Ready() == nil {
			t.Error("ready after Drain")
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned after Drain, before its ctx ended: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		cancel()
		waitRun(t, done)
	})
	t.Run("before Run", func(t *testing.T) {
		sc, _ := newIdleSidecar(t, nil)
		if err := sc.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		cancel, done := runIt(sc)
		select {
		case err := <-done:
			t.Fatalf("Run returned before its ctx ended: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		cancel()
		waitRun(t, done)
	})
	t.Run("after Run", func(t *testing.T) {
		sc, _ := newIdleSidecar(t, nil)
		cancel, done := runIt(sc)
		eventually(t, 5*time.Second, "consuming", sc.Ready)
		cancel()
		waitRun(t, done)
		if err := sc.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestDrainRetriesPositionWrites: a position whose write fails is retried
// with backoff until it lands; if it cannot land before Drain's ctx ends,
// Drain says so, and the consumer is stopped regardless.
func TestDrainRetriesPositionWrites(t *testing.T) {
	st := &flakyStatus{acked: map[string]int64{}, failures: 3}
	sc, _ := newIdleSidecar(t, st)
	cancel, done := runIt(sc)
	defer func() { cancel(); waitRun(t, done) }()
	eventually(t, 5*time.Second, "consuming", sc.Ready)
	sc.notePosition("s1", 42)
	if err := sc.Drain(context.Background()); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	st.mu.Lock()
	got, flushes := st.acked["s1"], st.flushes
	st.mu.Unlock()
	if got != 42 || flushes != 4 {
		t.Fatalf("callerAckedSequence %d after %d flushes, want 42 after 4", got, flushes)
	}

	st2 := &flakyStatus{acked: map[string]int64{}, failures: -1} // never lands
	sc2, c2 := newIdleSidecar(t, st2)
	sc2.o.FlushTimeout = 300 * time.Millisecond // Run's own stop retries it too
	cancel2, done2 := runIt(sc2)
	defer func() { cancel2(); waitRun(t, done2) }()
	eventually(t, 5*time.Second, "consuming", sc2.Ready)
	sc2.notePosition("s1", 7)
	ctx, ccancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer ccancel()
	if err := sc2.Drain(ctx); err == nil {
		t.Fatal("Drain succeeded although the position never landed")
	}
	select {
	case <-c2.stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the consumer was not stopped after a failed Drain")
	}
}
