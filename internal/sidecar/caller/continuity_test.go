package caller

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// figures are the fault-test numbers: what the callee sent, what the app
// received.
type figures struct {
	sessions, perSession int
	sent                 int // distinct messages published (accepted + events + completed)
	published            int // publishes, republished copies included
	received             int // distinct messages the app accepted
	duplicates           int // messages the app received twice without redelivered=true
	dedupedByApp         int // messages received again with redelivered=true (process death between 2xx and fsync)
	lost                 int // sent and never received
	problems             int // order violations seen by the app
	skippedBySidecar     int // duplicates the sidecar recognised and acked without delivering
	redeliveries         int // deliveries with the redelivered flag
}

func (f figures) String() string {
	return fmt.Sprintf("%d sessions × %d messages: sent %d (published %d with republished copies), received %d, duplicates %d, lost %d, order problems %d; redelivered again after a 2xx (deduplicated by the app) %d, duplicates skipped by the sidecar %d, broker redeliveries %d",
		f.sessions, f.perSession, f.sent, f.published, f.received, f.duplicates, f.lost, f.problems, f.dedupedByApp, f.skippedBySidecar, f.redeliveries)
}

// streams publishes scripts concurrently (one goroutine per session, a
// small pause between messages so faults land mid-stream) and returns when
// all are published.
type streams struct {
	b       *bed
	scripts []*script
	callees []*callee
	done    chan struct{}
}

func (b *bed) startStreams(t *testing.T, r *running, sessions, events int, pause time.Duration) *streams {
	st := &streams{b: b, done: make(chan struct{})}
	for range sessions {
		v := r.submit(t, taskReq("lab"))
		st.scripts = append(st.scripts, newScript(t, "lab", v.MessageID, events))
	}
	var wg sync.WaitGroup
	for _, s := range st.scripts {
		c := b.callee("lab")
		st.callees = append(st.callees, c)
		wg.Go(func() {
			for _, m := range s.msgs {
				c.publish(m)
				time.Sleep(pause)
			}
		})
	}
	go func() { wg.Wait(); close(st.done) }()
	return st
}

// published reports whether every script is published.
func (st *streams) published() bool {
	select {
	case <-st.done:
		return true
	default:
		return false
	}
}

// total is the number of messages of all scripts.
func (st *streams) total() int {
	n := 0
	for _, s := range st.scripts {
		n += len(s.msgs)
	}
	return n
}

// waitReceived blocks until the app has received at least n messages.
func (st *streams) waitReceived(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		if snap := st.b.app.Snapshot(); snap.Total >= n {
			return
		}
		select {
		case <-st.b.app.Changed():
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("the app did not reach %d messages", n)
		}
	}
}

// finish waits for every session to arrive whole and returns the figures.
func (st *streams) finish(t *testing.T, events int) figures {
	t.Helper()
	select {
	case <-st.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("publishing did not finish")
	}
	var f figures
	deadline := time.Now().Add(60 * time.Second)
	for {
		f = st.figures(events)
		if f.lost == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, s := range st.scripts {
		if err := st.b.complete(s.sessionID, events); err != nil {
			t.Error(err)
		}
	}
	return f
}

func (st *streams) figures(events int) figures {
	snap := st.b.app.Snapshot()
	f := figures{sessions: len(st.scripts), perSession: events + 2, sent: st.total()}
	f.published = f.sent
	for _, c := range st.callees {
		f.published += int(c.republished.Load())
	}
	for _, s := range st.scripts {
		l, ok := snap.Sessions[s.sessionID]
		if !ok {
			continue
		}
		f.received += len(l.Messages)
		f.duplicates += l.Duplicates
		f.dedupedByApp += l.Deduplicated
		f.problems += len(l.Problems) - l.Duplicates
	}
	f.lost = f.sent - f.received
	m := st.b.metrics
	f.skippedBySidecar = int(testutil.ToFloat64(m.Duplicates.WithLabelValues("sequence")) + testutil.ToFloat64(m.Duplicates.WithLabelValues("message")))
	f.redeliveries = int(testutil.ToFloat64(m.Redeliveries))
	return f
}

func (f figures) check(t *testing.T) {
	t.Helper()
	if f.received != f.sent || f.duplicates != 0 || f.lost != 0 || f.problems != 0 || f.dedupedByApp != 0 {
		t.Errorf("stream continuity broken: %s", f)
	}
}

// TestStreamContinuityCallerKilled: the caller sidecar is killed mid-stream
// (its broker connection cut by the broker and its context cancelled at the
// same moment, so nothing drains) three times and restarted on the same
// state directory each time; the app ends up with every event of every
// concurrent session exactly once, in order.
func TestStreamContinuityCallerKilled(t *testing.T) {
	b := newBed(t, "lab")
	// A slower app than publisher: a backlog builds up and the prefetch
	// window is full of unacked deliveries when the sidecar dies.
	b.app.SetDelay(5 * time.Millisecond)
	r := b.start()
	const sessions, events = 5, 300
	st := b.startStreams(t, r, sessions, events, time.Millisecond)
	total := st.total()
	for i, frac := range []float64{0.2, 0.45, 0.7} {
		st.waitReceived(t, int(frac*float64(total)))
		before := b.app.Snapshot().Total
		r.kill(t)
		t.Logf("kill %d: sidecar killed after the app received %d of %d messages", i+1, before, total)
		r = b.start()
	}
	f := st.finish(t, events)
	t.Logf("caller sidecar killed 3 times mid-stream: %s", f)
	f.check(t)
}

// TestStreamContinuityGracefulRestarts: the caller sidecar is stopped the
// polite way (its context cancelled: the app requests in progress finish,
// what was received is delivered for a while, the rest is left to the
// broker) and restarted, three times mid-stream.
func TestStreamContinuityGracefulRestarts(t *testing.T) {
	b := newBed(t, "lab")
	b.app.SetDelay(5 * time.Millisecond)
	r := b.start()
	const sessions, events = 5, 300
	st := b.startStreams(t, r, sessions, events, time.Millisecond)
	total := st.total()
	for i, frac := range []float64{0.2, 0.45, 0.7} {
		st.waitReceived(t, int(frac*float64(total)))
		before := b.app.Snapshot().Total
		start := time.Now()
		r.stop(t)
		t.Logf("stop %d: sidecar stopped in %s after the app received %d of %d messages", i+1, time.Since(start).Round(time.Millisecond), before, total)
		r = b.start()
	}
	f := st.finish(t, events)
	t.Logf("caller sidecar stopped and restarted 3 times mid-stream: %s", f)
	f.check(t)
}

// TestStreamContinuityConnectionsClosed: every connection to the vhost (the
// caller sidecar's and the callee's) is closed by the broker three times
// mid-stream; the sidecar reconnects by itself, the callee republishes what
// was unconfirmed (duplicates in the queue), and the app ends up with every
// event exactly once, in order.
func TestStreamContinuityConnectionsClosed(t *testing.T) {
	b := newBed(t, "lab")
	// Publishing and delivery at about the same pace, so that every close
	// lands while the callee publishes and the sidecar holds deliveries.
	b.app.SetDelay(5 * time.Millisecond)
	r := b.start()
	const sessions, events = 5, 300
	st := b.startStreams(t, r, sessions, events, 8*time.Millisecond)
	total := st.total()
	for i, frac := range []float64{0.2, 0.45, 0.7} {
		st.waitReceived(t, int(frac*float64(total)))
		before := b.app.Snapshot().Total
		n, how, err := b.closeAllConnections()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("close %d: %s closed %d connections after the app received %d of %d messages (publishing done: %v)", i+1, how, n, before, total, st.published())
		// Let the clients reconnect before the next round.
		time.Sleep(500 * time.Millisecond)
	}
	f := st.finish(t, events)
	t.Logf("all broker connections closed 3 times mid-stream: %s", f)
	f.check(t)
	if err := r.sc.Ready(); err != nil {
		t.Errorf("sidecar not ready after reconnecting: %v", err)
	}
}
