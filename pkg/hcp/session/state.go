package session

import (
	"errors"
	"fmt"
	"slices"
)

// State is an L2 session state. Values are the upper-case names used on the
// wire (session_created.state, state_changed.from_state/to_state,
// session_closed.final_state).
type State string

// The eight L2 states.
const (
	StatePending   State = "PENDING"
	StateRunning   State = "RUNNING"
	StatePaused    State = "PAUSED"
	StateAborting  State = "ABORTING"
	StateAborted   State = "ABORTED"
	StateCompleted State = "COMPLETED"
	StateFailed    State = "FAILED"
	StateRejected  State = "REJECTED"
)

// States returns the eight states in lifecycle order.
func States() []State {
	return []State{StatePending, StateRunning, StatePaused, StateAborting,
		StateAborted, StateCompleted, StateFailed, StateRejected}
}

// ParseState parses a state name (exact, case-sensitive).
func ParseState(s string) (State, error) {
	st := State(s)
	if !st.Valid() {
		return "", fmt.Errorf("unknown session state %q", s)
	}
	return st, nil
}

// Valid reports whether s is one of the eight states.
func (s State) Valid() bool { return slices.Contains(States(), s) }

// IsTerminal reports whether s is REJECTED, ABORTED, COMPLETED or FAILED.
func (s State) IsTerminal() bool {
	switch s {
	case StateRejected, StateAborted, StateCompleted, StateFailed:
		return true
	}
	return false
}

// Edge is one permitted transition and the specification's trigger for it.
type Edge struct {
	From, To State
	Trigger  string
}

// transitions is the L2 "Valid State Transitions" table, verbatim.
var transitions = []Edge{
	{StatePending, StateRunning, "L3 safety check passed"},
	{StatePending, StateRejected, "L3 safety check failed"},
	{StateRunning, StatePaused, "Callee pauses execution"},
	{StateRunning, StateAborting, "Caller sends abort"},
	{StateRunning, StateCompleted, "Task finishes successfully"},
	{StateRunning, StateFailed, "Unrecoverable error"},
	{StatePaused, StateRunning, "Callee resumes execution"},
	{StatePaused, StateAborting, "Caller sends abort while paused"},
	{StateAborting, StateAborted, "Callee finishes cleanup"},
}

// Transitions returns a copy of the transition table, in the
// specification's order. Any pair not listed is invalid; in particular there
// is no PAUSED→FAILED and no edge out of a terminal state (see the package
// documentation for how callers handle those cases).
func Transitions() []Edge { return slices.Clone(transitions) }

// CanTransition reports whether from→to is in the table.
func CanTransition(from, to State) bool {
	for _, e := range transitions {
		if e.From == from && e.To == to {
			return true
		}
	}
	return false
}

// ErrInvalidTransition is matched (errors.Is) by every *TransitionError.
var ErrInvalidTransition = errors.New("invalid session state transition")

// TransitionError reports a transition that is not in the table.
type TransitionError struct {
	From, To State
}

func (e *TransitionError) Error() string {
	msg := fmt.Sprintf("invalid session state transition %s -> %s", quoteState(e.From), quoteState(e.To))
	switch {
	case !e.From.Valid():
		return msg + ": unknown state " + quoteState(e.From)
	case !e.To.Valid():
		return msg + ": unknown state " + quoteState(e.To)
	case e.From.IsTerminal():
		return msg + ": " + string(e.From) + " is terminal; terminal states never reopen"
	case e.From == e.To:
		return msg + ": already " + string(e.From)
	}
	var allowed []string
	for _, edge := range transitions {
		if edge.From == e.From {
			allowed = append(allowed, string(edge.To))
		}
	}
	return fmt.Sprintf("%s: from %s only %v are allowed", msg, e.From, allowed)
}

// Is makes a *TransitionError match ErrInvalidTransition.
func (e *TransitionError) Is(target error) bool { return target == ErrInvalidTransition }

func quoteState(s State) string {
	if s.Valid() {
		return string(s)
	}
	return fmt.Sprintf("%q", string(s))
}

// Transition returns nil when from→to is in the table and a
// *TransitionError otherwise.
func Transition(from, to State) error {
	if CanTransition(from, to) {
		return nil
	}
	return &TransitionError{From: from, To: to}
}
