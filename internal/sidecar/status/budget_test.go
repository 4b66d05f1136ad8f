package status

import (
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// TestWriteBudget: 100 sessions streaming 10 events/s each for 10 s would
// be 1,000 progress writes at one per session-second; with a budget of 10
// writes/s (burst 20) the writer makes at most what the bucket gives for
// progress (its spare half, then the rate), every session's latest status
// still lands, and a state change in the middle of the flood goes first:
// it is written at once, not behind the progress writes.
func TestWriteBudget(t *testing.T) {
	const sessions, perSecond = 100, 10
	var objs []client.Object
	for i := range sessions {
		objs = append(objs, session(name(i)))
	}
	w, cc, clk, _ := newFixture(t, time.Second, objs...)
	w.SetBudget(perSecond)
	for i := range sessions {
		w.Seed(name(i), v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRunning}, clk.Now())
	}
	const step = 100 * time.Millisecond
	var changedAt, seenAt time.Duration
	for n := range 100 { // 10 s of fake time
		seq := int64(n + 1)
		for i := range sessions {
			w.Update(name(i), func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = seq })
		}
		if n == 50 {
			w.Update(name(7), func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionAborting })
			changedAt = time.Duration(n) * step
		}
		clk.Step(step)
		time.Sleep(3 * time.Millisecond)
		if seenAt == 0 && anyContains(cc, "ABORTING") {
			seenAt = time.Duration(n+1) * step
		}
	}
	writes := cc.count()
	// Spare tokens at the start (half the burst) plus the rate for 10 s,
	// the state change's write, and a little for steps that overlap.
	if limit := perSecond/2*2 + perSecond*10 + 1 + 5; writes > limit {
		t.Fatalf("%d status writes in 10 s for %d streaming sessions; the budget allows about %d", writes, sessions, limit)
	}
	// A state change is written at once, never after the progress
	// writes' budget or the interval.
	if limit := 2 * step; seenAt == 0 || seenAt-changedAt > limit {
		t.Fatalf("the state change made at %v was written at %v; it should go before progress (within %v)", changedAt, seenAt, limit)
	}
	// The flood ends: every session's latest status lands, within the budget.
	for range 150 {
		clk.Step(step)
		time.Sleep(2 * time.Millisecond)
	}
	for i := range sessions {
		if st := get(t, cc, name(i)); st.LastSequence != 100 {
			t.Fatalf("session %s stored sequence %d, want 100 (the latest)", name(i), st.LastSequence)
		}
	}
	t.Logf("%d status writes for %d sessions × 100 updates at %d writes/s", cc.count(), sessions, perSecond)
}

// TestProgressWritesAreSpread: ten sessions that started together make
// progress together; their progress writes, due at the same moment every
// interval, go spread through it (half the interval over the sessions
// apart, and never closer than 1/budget), not as one burst of API writes
// (at 10 sessions on 2 cores such bursts tripled the relay's p99,
// docs/performance.md), and each session's latest progress still lands
// (two writes each in 3 s at a 1 s interval).
func TestProgressWritesAreSpread(t *testing.T) {
	const sessions = 10
	var objs []client.Object
	for i := range sessions {
		objs = append(objs, session(name(i)))
	}
	w, cc, clk, _ := newFixture(t, time.Second, objs...)
	start := clk.Now()
	for i := range sessions {
		w.Seed(name(i), v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRunning}, start)
	}
	const step = 2 * time.Millisecond
	for n := range 1500 { // 3 s of fake time
		if n%50 == 0 { // every 100 ms, every session moves on
			for i := range sessions {
				w.Update(name(i), func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = int64(n + 1) })
			}
		}
		clk.Step(step)
		time.Sleep(200 * time.Microsecond)
	}
	cc.mu.Lock()
	at := slices.Clone(cc.at)
	cc.mu.Unlock()
	if len(at) < 2*sessions {
		t.Fatalf("%d progress writes in 3 s for %d sessions at a 1 s interval; want at least %d", len(at), sessions, 2*sessions)
	}
	pace := max(time.Second/DefaultWritesPerSecond, time.Second/(2*sessions))
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < pace-step {
			t.Fatalf("progress writes %d and %d went %v apart (at %v and %v after the start); want at least %v (half the 1 s interval over %d sessions)",
				i, i+1, gap, at[i-1].Sub(start), at[i].Sub(start), pace, sessions)
		}
	}
	t.Logf("%d progress writes for %d sessions in 3 s, the first at %v, the last at %v", len(at), sessions, at[0].Sub(start), at[len(at)-1].Sub(start))
}

func name(i int) string { return "s" + string(rune('a'+i/26)) + string(rune('a'+i%26)) }

func anyContains(cc *countingClient, s string) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for _, p := range cc.patches {
		if strings.Contains(p, s) {
			return true
		}
	}
	return false
}
