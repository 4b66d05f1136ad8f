package session

import (
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSequencerMonotonic(t *testing.T) {
	s := NewSequencer(0)
	for want := int64(1); want <= 1000; want++ {
		got, err := s.Next()
		if err != nil || got != want {
			t.Fatalf("Next() = %d, %v; want %d", got, err, want)
		}
	}
	if s.Last() != 1000 {
		t.Fatalf("Last() = %d", s.Last())
	}
	if got, _ := NewSequencer(41).Next(); got != 42 {
		t.Fatalf("resumed Next() = %d", got)
	}
	if got, _ := NewSequencer(-7).Next(); got != 1 {
		t.Fatalf("negative start Next() = %d", got)
	}
}

func TestSequencerConcurrent(t *testing.T) {
	s := NewSequencer(0)
	const workers, each = 8, 1000
	got := make([][]int64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				n, err := s.Next()
				if err != nil {
					t.Error(err)
					return
				}
				got[w] = append(got[w], n)
			}
		}()
	}
	wg.Wait()
	var all []int64
	for _, g := range got {
		if !slices.IsSorted(g) {
			t.Fatal("a goroutine saw decreasing numbers")
		}
		all = append(all, g...)
	}
	slices.Sort(all)
	for i, n := range all {
		if n != int64(i+1) {
			t.Fatalf("numbers not 1..%d without gaps or repeats: position %d is %d", workers*each, i, n)
		}
	}
}

func TestSequencerExhausted(t *testing.T) {
	s := NewSequencer(math.MaxInt64 - 1)
	if n, err := s.Next(); err != nil || n != math.MaxInt64 {
		t.Fatalf("Next() = %d, %v", n, err)
	}
	if _, err := s.Next(); !errors.Is(err, ErrSequenceExhausted) {
		t.Fatalf("Next() after max = %v", err)
	}
}

func TestReservingSequencer(t *testing.T) {
	var persisted []int64
	reserve := func(c int64) error { persisted = append(persisted, c); return nil }
	s := NewReservingSequencer(0, 10, reserve)
	for want := int64(1); want <= 25; want++ {
		if got, err := s.Next(); err != nil || got != want {
			t.Fatalf("Next() = %d, %v", got, err)
		}
	}
	if !slices.Equal(persisted, []int64{10, 20, 30}) {
		t.Fatalf("reserved %v", persisted)
	}
	// Crash after 25; the last persisted ceiling is 30. The restarted
	// sequencer never reuses 1..30.
	s2 := NewReservingSequencer(persisted[len(persisted)-1], 10, reserve)
	if got, _ := s2.Next(); got != 31 {
		t.Fatalf("resumed at %d, want 31", got)
	}
	if persisted[len(persisted)-1] != 40 {
		t.Fatalf("resume did not reserve first: %v", persisted)
	}
}

func TestReservingSequencerFailure(t *testing.T) {
	boom := errors.New("apiserver down")
	fail := true
	s := NewReservingSequencer(0, 0, func(int64) error {
		if fail {
			return boom
		}
		return nil
	})
	if _, err := s.Next(); !errors.Is(err, boom) {
		t.Fatalf("Next() = %v", err)
	}
	if s.Last() != 0 {
		t.Fatal("a number was handed out without a reservation")
	}
	fail = false
	if n, err := s.Next(); err != nil || n != 1 {
		t.Fatalf("retry Next() = %d, %v", n, err)
	}
	// block < 1 counts as 1: every number is reserved.
	if n, _ := s.Next(); n != 2 {
		t.Fatalf("Next() = %d", n)
	}
}

func TestReservingSequencerOverflow(t *testing.T) {
	var last int64
	s := NewReservingSequencer(math.MaxInt64-2, 100, func(c int64) error { last = c; return nil })
	if n, err := s.Next(); err != nil || n != math.MaxInt64-1 || last != math.MaxInt64 {
		t.Fatalf("Next() = %d, %v, reserved %d", n, err, last)
	}
}

// TestReserveAhead: with ReserveAhead the next block is reserved in the
// background once half the block is used, before any of its numbers is
// handed out; Next waits only when the numbers outrun the reservation; a
// failed reservation is retried by Next when it must, and nothing is
// handed out beyond a persisted ceiling.
func TestReserveAhead(t *testing.T) {
	var mu sync.Mutex
	var persisted []int64
	release := make(chan struct{})
	reserve := func(c int64) error {
		if c > 10 {
			<-release // the API server is slow
		}
		mu.Lock()
		defer mu.Unlock()
		persisted = append(persisted, c)
		return nil
	}
	s := NewReservingSequencer(0, 10, reserve)
	s.ReserveAhead()
	for want := int64(1); want <= 10; want++ {
		if got, err := s.Next(); err != nil || got != want {
			t.Fatalf("Next() = %d, %v", got, err)
		}
	}
	// 11 needs the ceiling 20, whose reservation started at 6 and is held:
	// Next waits for it.
	got := make(chan int64, 1)
	go func() { n, _ := s.Next(); got <- n }()
	select {
	case n := <-got:
		t.Fatalf("Next() = %d before the ceiling 20 was persisted", n)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if n := <-got; n != 11 {
		t.Fatalf("Next() = %d, want 11", n)
	}
	for range 9 { // to 20: the reservation of 30 started at 16
		if _, err := s.Next(); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		p := slices.Clone(persisted)
		mu.Unlock()
		if slices.Equal(p, []int64{10, 20, 30}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("persisted %v, want [10 20 30] reserved ahead by 20", p)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// A failed reservation ahead: Next reserves itself when it must, and
	// hands nothing out if that fails too.
	boom := errors.New("apiserver down")
	var fail atomic.Bool
	fail.Store(true)
	var calls atomic.Int32
	f := NewReservingSequencer(0, 4, func(c int64) error {
		calls.Add(1)
		if c > 4 && fail.Load() {
			return boom
		}
		return nil
	})
	f.ReserveAhead()
	for range 4 {
		if _, err := f.Next(); err != nil {
			t.Fatal(err)
		}
	}
	for f.aheadPending() {
		time.Sleep(time.Millisecond)
	}
	if _, err := f.Next(); !errors.Is(err, boom) || f.Last() != 4 {
		t.Fatalf("Next() past a ceiling that could not be persisted: %v, last %d", err, f.Last())
	}
	fail.Store(false)
	if n, err := f.Next(); err != nil || n != 5 {
		t.Fatalf("Next() = %d, %v once the API answers", n, err)
	}
	if c := calls.Load(); c != 4 { // 4, 8 ahead (failed), 8 (failed), 8
		t.Fatalf("%d reservations, want 4 (no retry per event after a failure ahead)", c)
	}
}

// aheadPending reports whether a reservation ahead is in flight.
func (s *Sequencer) aheadPending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inflight != nil
}
