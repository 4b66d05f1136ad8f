package caller

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
)

// Sessions whose app deliveries always fail (poisoned sessions: a bad app
// reply for them, every time) must not stall another: with a prefetch of
// 10 and 30 events of each of two poisoned sessions queued ahead, the
// healthy session still reaches the app completely, in order. Each
// poisoned session keeping its own share (half the window) would fill the
// window between them. (MaxAttempts is set out of reach: here the app
// fails for a while and recovers; TestPoisonEventIsDeadLettered shows an
// event the app keeps refusing.)
func TestPoisonedSessionDoesNotStallOthers(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.MaxAttempts = 1 << 30 })
	var bad []*script
	for range 2 {
		bad = append(bad, newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, 30))
	}
	good := newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, 10)
	poisoned := map[string]bool{bad[0].sessionID: true, bad[1].sessionID: true}
	b.app.FailWhen(func(m samplecaller.Message) bool { return poisoned[m.SessionID] && m.Sequence > 2 })
	c := b.callee("lab")
	for _, s := range append(bad, good) {
		for _, m := range s.msgs {
			c.publish(m)
		}
	}
	eventually(t, 60*time.Second, "the healthy session delivered while two others are poisoned", func() error {
		return b.complete(good.sessionID, 10)
	})
	for _, s := range bad {
		if v, ok := b.app.Session(s.sessionID); !ok || v.LastSequence != 2 {
			t.Errorf("poisoned session: %+v, want it held at sequence 2 (nothing skipped, nothing out of order)", v)
		}
	}
	if n := testutil.ToFloat64(b.metrics.Released); n == 0 {
		t.Error("no delivery was released")
	}
	// The app recovers: the poisoned sessions' events, some of them
	// returned to the queue meanwhile, all arrive, once each, in order.
	b.app.FailWhen(func(samplecaller.Message) bool { return false })
	for _, s := range bad {
		eventually(t, 60*time.Second, "a poisoned session, once the app recovered", func() error {
			return b.complete(s.sessionID, 30)
		})
	}
}

// TestGapsDoNotFillTheWindow: two sessions wait for gaps (their first
// event is queued behind their later ones, and their marks say it is on
// its way, so time never skips it) while a third streams. Each of the two
// stays below its own share of the prefetch window (10), but together
// they would fill it: nothing more would arrive, neither the third
// session's events nor the two missing ones. All three must reach the app
// completely, in order, with nothing given up.
func TestGapsDoNotFillTheWindow(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.GapTimeout = 50 * time.Millisecond })
	const n = 12
	var gapped []*script
	for range 2 {
		gapped = append(gapped, newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, n))
	}
	healthy := newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, 10)
	c := b.callee("lab")
	for _, s := range gapped { // task_accepted, then events 2..n-1: 1 is missing
		c.publish(s.msgs[0])
		for _, m := range s.msgs[2:n] {
			c.publishMarked(m, 0)
		}
	}
	for _, m := range healthy.msgs {
		c.publish(m)
	}
	for _, s := range gapped { // the missing first events, then the ends
		c.publishMarked(s.msgs[1], 0)
		c.publish(s.msgs[n])
		c.publishMarked(s.msgs[n+1], 0)
	}
	for _, s := range append(gapped, healthy) {
		want := n
		if s == healthy {
			want = 10
		}
		eventually(t, 60*time.Second, "session "+s.sessionID+" delivered completely", func() error {
			return b.complete(s.sessionID, want)
		})
	}
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped)); got != 0 {
		t.Errorf("gap_skipped %.0f, want 0", got)
	}
}

// TestLongGapIsNotSkipped: a session's stream arrives as 12-16, then 11
// down to 2, then 1 (the marks say each is on its way; events returned to
// the queue come back in any order). Each of 11..2 fills the gap below the
// lowest buffered event, so the dispatcher never returns it to the queue,
// and with 12-16 they are more than the reorder buffer held
// (Prefetch-1): the gap was skipped on overflow and 1 was lost although it
// was queued. Nothing may be given up: the buffer is bounded
// by the window, and a window full of it is handed back so that 1 can come.
func TestLongGapIsNotSkipped(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.GapTimeout = 50 * time.Millisecond })
	const n = 20
	s := newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, n)
	c := b.callee("lab")
	c.publish(s.msgs[0]) // task_accepted
	for _, seq := range []int{12, 13, 14, 15, 16, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 17, 18, 19} {
		c.publishMarked(s.msgs[seq], 0) // msgs[seq] is event seq
	}
	c.publish(s.msgs[n])
	c.publishMarked(s.msgs[n+1], 0)
	eventually(t, 30*time.Second, "the session delivered completely", func() error { return b.complete(s.sessionID, n) })
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped)); got != 0 {
		t.Errorf("gap_skipped %.0f, want 0", got)
	}
}
