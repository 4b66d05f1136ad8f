package session

import (
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
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
