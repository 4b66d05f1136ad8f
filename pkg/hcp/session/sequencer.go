package session

import (
	"errors"
	"fmt"
	"math"
	"sync"
)

// ErrSequenceExhausted is returned by Sequencer.Next after math.MaxInt64.
var ErrSequenceExhausted = errors.New("event sequence exhausted")

// ReserveFunc durably records that sequence numbers up to ceiling may be in
// use (for example in the HCPSession status) before any of them is handed
// out.
type ReserveFunc func(ceiling int64) error

// Sequencer hands out a session's event sequence numbers on the callee
// side: strictly increasing, starting after the value it was created with.
// It is safe for concurrent use.
//
// Resuming after a restart must never reuse a number: the caller would drop
// the new event as a duplicate of the old one, a silent loss. A sidecar that
// persists the last number lazily (status writes are coalesced) therefore
// uses NewReservingSequencer: numbers are reserved in blocks, each block
// persisted before its first number is used, and a restarted sidecar
// resumes after the persisted ceiling. The cost is a gap of at most one
// block after a restart, which the caller's Tracker reports and skips, and
// which L2 anticipates ("the event stream may have a gap").
type Sequencer struct {
	mu      sync.Mutex
	last    int64
	ceiling int64
	block   int64
	reserve ReserveFunc

	// Reserving ahead (ReserveAhead): the next block's reservation runs in
	// the background once half the current block is used.
	ahead       bool
	inflight    chan struct{} // closed when the background reservation ends
	next        int64         // the ceiling it persisted, not in use yet (0: none)
	aheadFailed bool          // it failed: Next reserves when it must
}

// NewSequencer returns a Sequencer whose first number is last+1 (1 for a new
// session; a negative last counts as 0). Use it only when last is exact,
// for example when every number is persisted before use.
func NewSequencer(last int64) *Sequencer {
	return &Sequencer{last: max(last, 0), ceiling: math.MaxInt64}
}

// NewReservingSequencer returns a Sequencer that resumes after ceiling (the
// last value reserve persisted; 0 for a new session) and persists a new
// ceiling, block numbers further on, through reserve whenever it runs out.
// A block below 1 counts as 1.
func NewReservingSequencer(ceiling, block int64, reserve ReserveFunc) *Sequencer {
	ceiling = max(ceiling, 0)
	return &Sequencer{last: ceiling, ceiling: ceiling, block: max(block, 1), reserve: reserve}
}

// ResumeSequencer continues a sequence whose last number is last, with
// numbers up to ceiling (>= last) already reserved, reserving further
// blocks like NewReservingSequencer.
func ResumeSequencer(last, ceiling, block int64, reserve ReserveFunc) *Sequencer {
	last = max(last, 0)
	return &Sequencer{last: last, ceiling: max(ceiling, last), block: max(block, 1), reserve: reserve}
}

// ReserveAhead has the next block reserved in the background once half the
// current one is used, so that Next waits for a reservation only when the
// numbers outrun it (or it failed). A restart then skips at most one and a
// half blocks.
func (s *Sequencer) ReserveAhead() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ahead = s.reserve != nil
}

// Next returns the next sequence number. It fails only when reserving a new
// block fails (nothing is handed out then; a later call retries) or the
// sequence is exhausted.
func (s *Sequencer) Next() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.last == math.MaxInt64 {
			return 0, ErrSequenceExhausted
		}
		n := s.last + 1
		switch {
		case n <= s.ceiling:
			s.last = n
			if s.ahead && s.inflight == nil && s.next == 0 && !s.aheadFailed && s.ceiling-n < s.block/2 {
				s.reserveAheadLocked()
			}
			return n, nil
		case s.inflight != nil: // the next block is being reserved
			ch := s.inflight
			s.mu.Unlock()
			<-ch
			s.mu.Lock()
		case s.next > s.ceiling:
			s.ceiling, s.next, s.aheadFailed = s.next, 0, false
		default:
			c := s.nextCeiling()
			if s.reserve != nil {
				if err := s.reserve(c); err != nil {
					return 0, fmt.Errorf("reserve event sequence up to %d: %w", c, err)
				}
			}
			s.ceiling, s.aheadFailed = c, false
		}
	}
}

// nextCeiling is the ceiling one block above the current one.
func (s *Sequencer) nextCeiling() int64 {
	c := s.ceiling + s.block
	if c < s.ceiling { // overflow
		c = math.MaxInt64
	}
	return c
}

// reserveAheadLocked reserves the next block in the background. Called
// with mu.
func (s *Sequencer) reserveAheadLocked() {
	c := s.nextCeiling()
	if c == s.ceiling {
		return
	}
	ch := make(chan struct{})
	s.inflight = ch
	go func() {
		err := s.reserve(c)
		s.mu.Lock()
		if err == nil {
			s.next = c
		} else {
			s.aheadFailed = true
		}
		s.inflight = nil
		s.mu.Unlock()
		close(ch)
	}()
}

// Last returns the last number handed out (or the starting value).
func (s *Sequencer) Last() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}
