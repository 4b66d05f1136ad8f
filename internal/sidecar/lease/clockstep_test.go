package lease

import (
	"context"
	"sync"
	"testing"
	"time"
	"unsafe"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// A wall clock stepped by 30 s, either way, on the owner or on the
// replica watching its Lease (NTP correcting a drifted clock, an operator
// setting the time, a VM restored from a snapshot) never lets two owners
// act at once, and does not fence a live owner early: the owner's fence
// and the observer's expiry are measured on each process's monotonic
// clock, which a step does not move.
//
// The fake clocks of k8s.io/utils have one reading, so a step there is
// time passing. Here each process's clock returns what time.Now() returns,
// a wall reading and a monotonic one, and a step moves the wall reading
// alone (see wallStepped); an implementation that compares wall clock
// readings (UnixNano, the renewTime its holder wrote) fails.
func TestClockStepNeverOverlapsOwners(t *testing.T) {
	const (
		duration = 60 * time.Second
		margin   = 10 * time.Second
	)
	for _, tc := range []struct {
		name string
		// wall steps of the owner's clock before and after its last
		// renewal, and of the observer's clock after it saw the renewal.
		ownerBefore, ownerAfter, observer time.Duration
	}{
		{"owner stepped forward before its last renewal", 30 * time.Second, 0, 0},
		{"owner stepped back before its last renewal", -30 * time.Second, 0, 0},
		{"owner stepped forward after its last renewal", 0, 30 * time.Second, 0},
		{"owner stepped back after its last renewal", 0, -30 * time.Second, 0},
		{"observer stepped forward", 0, 0, 30 * time.Second},
		{"observer stepped back", 0, 0, -30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			if err := coordinationv1.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			c := fake.NewClientBuilder().WithScheme(scheme).Build()
			ownerClk, obsClk := newMonoClock(t), newMonoClock(t)
			k := New(Options{Client: c, Namespace: "ns", Pod: "old", Holder: "old/1", Duration: duration, Margin: margin, Clock: ownerClk})
			o := NewObserver(obsClk)
			ctx := context.Background()
			alive := func() bool {
				t.Helper()
				a, known, err := o.Alive(ctx, c, "ns", "old")
				if err != nil || !known {
					t.Fatalf("Alive: known %v, %v", known, err)
				}
				return a
			}
			// The owner renews (a step before it puts the step in the
			// renewTime it writes), the observer sees the renewal, the
			// owner is cut off (no more renewals), and real time runs on.
			if err := k.Acquire(ctx); err != nil {
				t.Fatal(err)
			}
			alive()
			ownerClk.step(5 * time.Second)
			obsClk.step(5 * time.Second)
			ownerClk.stepWall(tc.ownerBefore)
			if err := k.renew(ctx); err != nil {
				t.Fatal(err)
			}
			alive()
			ownerClk.stepWall(tc.ownerAfter)
			obsClk.stepWall(tc.observer)
			for elapsed := time.Duration(0); elapsed <= duration+10*time.Second; elapsed += 500 * time.Millisecond {
				valid, a := k.Valid(), alive()
				if valid && !a {
					t.Fatalf("%s after its last renewal the owner still acts, but the observer sees its Lease expired: two owners", elapsed)
				}
				if elapsed < duration-margin && !valid {
					t.Fatalf("%s after its last renewal the owner fenced itself; it may act for %s", elapsed, duration-margin)
				}
				if elapsed >= duration-margin && valid {
					t.Fatalf("%s after its last renewal the owner still acts; it fences itself after %s", elapsed, duration-margin)
				}
				if elapsed > duration && a {
					t.Fatalf("%s after the last renewal the Lease still counts as alive", elapsed)
				}
				ownerClk.step(500 * time.Millisecond)
				obsClk.step(500 * time.Millisecond)
			}
		})
	}
}

// monoClock is a process's clock as time.Now() is: readings carry a wall
// and a monotonic reading. step moves both (time passes), stepWall only
// the wall reading (the system clock was set). Tickers are a fake clock's
// (the test does not use them).
type monoClock struct {
	*clocktesting.FakeClock
	mu      sync.Mutex
	base    time.Time // a reading of time.Now(), with its monotonic part
	elapsed time.Duration
	wall    time.Duration
	t       *testing.T
}

func newMonoClock(t *testing.T) *monoClock {
	base := time.Now()
	return &monoClock{FakeClock: clocktesting.NewFakeClock(base), base: base, t: t}
}

func (c *monoClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return wallStepped(c.t, c.base.Add(c.elapsed), c.wall)
}

func (c *monoClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *monoClock) step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.elapsed += d
}

func (c *monoClock) stepWall(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall += d
}

// wallStepped returns t, a reading with a monotonic part, with its wall
// reading moved by d (whole seconds) and its monotonic reading unchanged:
// what time.Now() returns after the system clock was stepped by d. Go has
// no API for it, so this writes time.Time's wall field, whose layout (since
// Go 1.9, with the monotonic bit set: 33 bits of seconds since 1885 above
// 30 bits of nanoseconds) is checked on every call: a change fails the
// test instead of faking a step.
func wallStepped(tb testing.TB, t time.Time, d time.Duration) time.Time {
	tb.Helper()
	if d%time.Second != 0 {
		tb.Fatalf("wallStepped: %s is not whole seconds", d)
	}
	type timeLayout struct {
		wall uint64
		ext  int64
		loc  unsafe.Pointer
	}
	const hasMonotonic, nsecShift = 1 << 63, 30
	out := t
	p := (*timeLayout)(unsafe.Pointer(&out))
	if unsafe.Sizeof(out) != unsafe.Sizeof(timeLayout{}) || p.wall&hasMonotonic == 0 {
		tb.Fatal("wallStepped: time.Time does not have the layout this test knows, or the reading has no monotonic part")
	}
	secs := int64(d / time.Second)
	if secs >= 0 {
		p.wall += uint64(secs) << nsecShift
	} else {
		p.wall -= uint64(-secs) << nsecShift
	}
	if out.UnixNano()-t.UnixNano() != int64(d) || out.Sub(t) != 0 {
		tb.Fatalf("wallStepped: moved the wall reading by %s and the monotonic one by %s, want %s and 0",
			time.Duration(out.UnixNano()-t.UnixNano()), out.Sub(t), d)
	}
	return out
}
