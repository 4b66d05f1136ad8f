package session

import (
	"fmt"
	"slices"
	"time"
)

// Standard state_changed reasons.
const (
	// ReasonTimeout: the session exceeded its maximum duration (L2 "Session
	// Timeout").
	ReasonTimeout = "timeout"
	// ReasonRecoveredFromCheckpoint: the callee restarted and resumed from a
	// checkpoint (L2 "Recovery").
	ReasonRecoveredFromCheckpoint = "recovered_from_checkpoint"
)

// Record is one applied transition.
type Record struct {
	From, To State
	Reason   string
	At       time.Time
}

// Machine is the state of one session and the transitions that led to it.
// It is a value: Apply returns a new Machine and never modifies the
// receiver, so a Machine can be rebuilt by folding a session's state_changed
// events (a reducer over the stream) and shared without locking. Time is
// always passed in; Machine never reads the clock.
type Machine struct {
	state     State
	createdAt time.Time
	updatedAt time.Time
	history   []Record
}

// New returns a Machine in PENDING, created at now.
func New(now time.Time) Machine {
	return Machine{state: StatePending, createdAt: now, updatedAt: now}
}

// Restore returns a Machine in state s, as last changed at updatedAt, with
// no history: for rebuilding from a stored snapshot (for example an
// HCPSession status).
func Restore(s State, createdAt, updatedAt time.Time) (Machine, error) {
	if !s.Valid() {
		return Machine{}, fmt.Errorf("restore session: unknown state %q", string(s))
	}
	return Machine{state: s, createdAt: createdAt, updatedAt: updatedAt}, nil
}

// State returns the current state ("" for the zero Machine).
func (m Machine) State() State { return m.state }

// IsTerminal reports whether the current state is terminal.
func (m Machine) IsTerminal() bool { return m.state.IsTerminal() }

// CreatedAt returns the creation time.
func (m Machine) CreatedAt() time.Time { return m.createdAt }

// UpdatedAt returns the time of the last transition (the creation time
// before any).
func (m Machine) UpdatedAt() time.Time { return m.updatedAt }

// History returns a copy of the applied transitions, oldest first.
func (m Machine) History() []Record { return slices.Clone(m.history) }

// Apply returns m moved to state to at time at, or a *TransitionError (and m
// unchanged) when m.State()→to is not allowed.
func (m Machine) Apply(to State, reason string, at time.Time) (Machine, error) {
	if err := Transition(m.state, to); err != nil {
		return m, err
	}
	r := Record{From: m.state, To: to, Reason: reason, At: at}
	// Clip so that appending never writes into a backing array shared with
	// an earlier Machine value.
	m.history = append(slices.Clip(m.history), r)
	m.state = to
	m.updatedAt = at
	return m, nil
}
