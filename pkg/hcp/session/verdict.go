package session

import (
	"fmt"
)

// DefaultMaxBuffer is the reorder buffer bound used when
// TrackerOptions.MaxBuffer is not set. It is below the caller's default
// consumer prefetch (10), see TrackerOptions.MaxBuffer.
const DefaultMaxBuffer = 8

// maxSkipped bounds the skipped ranges a Tracker remembers to recognise
// late arrivals.
const maxSkipped = 16

// Verdict says what a Tracker made of an offered event and what the caller
// must do with the delivery.
type Verdict int

// Verdicts of Tracker.Offer.
const (
	// None is the zero Verdict (Outcome of Skip).
	None Verdict = iota
	// Deliver: the event is next in order. It is first in Outcome.Ready,
	// followed by any buffered events it unblocked. Process them in order,
	// Commit each, then ack its delivery.
	Deliver
	// Buffered: the event is ahead of a gap. Keep the delivery unacked; the
	// event comes back in Outcome.Ready of a later call.
	Buffered
	// Duplicate: the event was already processed, or an identical sequence
	// is already buffered. Ack the delivery without processing it.
	Duplicate
	// InFlight: the application is processing this sequence right now (the
	// copy is a redelivery after a lost channel). Do not process it; nack it
	// with requeue after a short delay (it will then come back as Duplicate
	// or, if processing failed, Deliver).
	InFlight
	// Late: the event arrived after its gap was skipped. It cannot be
	// processed in order any more; ack it without processing and log a
	// warning.
	Late
	// Invalid: sequence below 1. Ack and drop (the payload failed L2
	// validation).
	Invalid
)

func (v Verdict) String() string {
	switch v {
	case None:
		return "none"
	case Deliver:
		return "deliver"
	case Buffered:
		return "buffered"
	case Duplicate:
		return "duplicate"
	case InFlight:
		return "in-flight"
	case Late:
		return "late"
	case Invalid:
		return "invalid"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Range is an inclusive range of sequence numbers.
type Range struct{ From, To int64 }

// Len returns the number of sequences in r.
func (r Range) Len() int64 { return r.To - r.From + 1 }

func (r Range) String() string {
	if r.From == r.To {
		return fmt.Sprint(r.From)
	}
	return fmt.Sprintf("%d-%d", r.From, r.To)
}

// Entry is an item with its sequence number.
type Entry[T any] struct {
	Seq  int64
	Item T
}

// Outcome is the result of Tracker.Offer and Tracker.Skip.
type Outcome[T any] struct {
	// Verdict classifies the offered event (None for Skip).
	Verdict Verdict
	// Ready are the events now deliverable, in sequence order. The tracker
	// counts them as in flight until Commit or Requeue.
	Ready []Entry[T]
	// Gap, when set, is a newly detected (or changed) range of missing
	// sequences before the buffered events. Log a warning; the events may
	// still arrive via redelivery. Each gap is reported once.
	Gap *Range
	// Skipped, when set, is a gap the tracker gave up on (the buffer
	// overflowed, or Skip was called): those events are treated as lost and
	// later copies get the Late verdict. Log a warning.
	Skipped *Range
}

// TrackerOptions configure a Tracker.
type TrackerOptions struct {
	// Store persists last_processed_sequence; nil keeps it in memory only
	// (then L1's idempotency recommendation covers redeliveries after a
	// restart).
	Store Store
	// MaxBuffer bounds the reorder buffer. When more events than this wait
	// behind a gap, the gap is skipped (L2: "log a warning and continue").
	// Buffered events stay unacked, and with the prefetch window full of
	// them the broker sends nothing more, so a gap could never fill: either
	// choose it below the consumer prefetch, or above it and hand buffered
	// events back to the queue when the window fills (Unbuffer), as the
	// hcp-sidecar does, so that no gap whose events are still queued is
	// skipped. Zero or less means DefaultMaxBuffer.
	// A caller should also call Skip when a gap has been open for too long
	// (events can be lost for good: queue TTL, drop-head overflow, a callee
	// restart).
	MaxBuffer int
}
