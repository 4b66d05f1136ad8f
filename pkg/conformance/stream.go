package conformance

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// Event is one L2 event of a session, as the caller received it (after
// deduplication by message_id).
type Event struct {
	MessageID string
	Sequence  int64
	Type      session.EventType
	Data      json.RawMessage
}

// EventOf returns the L2 event an envelope of type event carries.
func EventOf(env *envelope.Envelope) (Event, error) {
	if env == nil || env.Type != envelope.TypeEvent {
		return Event{}, fmt.Errorf("not an event")
	}
	var p session.EventPayload
	if err := json.Unmarshal(env.Payload, &p); err != nil {
		return Event{}, err
	}
	return Event{MessageID: env.MessageID, Sequence: p.Sequence, Type: p.EventType, Data: p.Data}, nil
}

// CheckIncreasing checks one session's events in arrival order by L2:112
// alone: every sequence number above the one before it (no repeat, no
// step back; a gap is allowed, L2:174).
func CheckIncreasing(events []Event) error {
	for i := 1; i < len(events); i++ {
		prev, ev := events[i-1], events[i]
		switch {
		case ev.Sequence == prev.Sequence:
			return fmt.Errorf("sequence %d twice (message ids %s and %s)", ev.Sequence, prev.MessageID, ev.MessageID)
		case ev.Sequence < prev.Sequence:
			return fmt.Errorf("sequence %d after %d: not increasing", ev.Sequence, prev.Sequence)
		}
	}
	return nil
}

// CheckConsecutive checks a stream that must have no gap (L1:169 "no
// lost events, no gaps") by L2:126's definition of one: sequence N+2
// without N+1. Each sequence is the one before it plus one; where the
// stream starts is not checked.
func CheckConsecutive(events []Event) error {
	if err := CheckIncreasing(events); err != nil {
		return err
	}
	for i := 1; i < len(events); i++ {
		if prev, ev := events[i-1], events[i]; ev.Sequence != prev.Sequence+1 {
			return fmt.Errorf("gap: sequence %d after %d (%d..%d missing)", ev.Sequence, prev.Sequence, prev.Sequence+1, ev.Sequence-1)
		}
	}
	return nil
}

// CheckSequence checks one session's events in arrival order by this
// project's stricter guarantee: sequence numbers 1, 2, 3, ... with no gap,
// no repeat and no step back. A repeat under another message_id is an
// event delivered twice that deduplication by message_id would not catch.
func CheckSequence(events []Event) error {
	var want int64 = 1
	seen := map[int64]string{}
	for _, ev := range events {
		if id, dup := seen[ev.Sequence]; dup {
			return fmt.Errorf("sequence %d twice (message ids %s and %s)", ev.Sequence, id, ev.MessageID)
		}
		seen[ev.Sequence] = ev.MessageID
		switch {
		case ev.Sequence > want:
			return fmt.Errorf("gap: sequence %d after %d (%d..%d missing)", ev.Sequence, want-1, want, ev.Sequence-1)
		case ev.Sequence < want:
			return fmt.Errorf("sequence %d after %d: not increasing", ev.Sequence, want-1)
		}
		want++
	}
	return nil
}

// Walk is what CheckTransitions saw of a session.
type Walk struct {
	// State is the state the events led to.
	State session.State
	// Closed: a session_closed event was seen; FinalState is its final_state.
	Closed     bool
	FinalState session.State
	// States lists the states in order, starting with PENDING.
	States []session.State
}

// CheckTransitions folds a session's events (in order) through the L2
// state machine of package session, starting in PENDING:
// session_created must name the current state (or one a valid transition
// reaches), every state_changed must start from the current state and be
// a valid transition, session_closed must name the current state, which
// must be terminal, and no event may follow it.
func CheckTransitions(events []Event) (Walk, error) {
	var at time.Time // the machine needs a time; the kit has no use for it
	m := session.New(at)
	w := Walk{State: m.State(), States: []session.State{m.State()}}
	apply := func(to session.State, what string) error {
		next, err := m.Apply(to, what, at)
		if err != nil {
			return err
		}
		m = next
		w.State = to
		w.States = append(w.States, to)
		return nil
	}
	for _, ev := range events {
		if w.Closed {
			return w, fmt.Errorf("event %d (%s) after session_closed", ev.Sequence, ev.Type)
		}
		switch ev.Type {
		case session.EventSessionCreated:
			var d session.SessionCreatedData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return w, fmt.Errorf("event %d session_created: %v", ev.Sequence, err)
			}
			if d.State != m.State() {
				if err := apply(d.State, "session_created"); err != nil {
					return w, fmt.Errorf("event %d session_created in %s: %w", ev.Sequence, d.State, err)
				}
			}
		case session.EventStateChanged:
			var d session.StateChangedData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return w, fmt.Errorf("event %d state_changed: %v", ev.Sequence, err)
			}
			if d.FromState != m.State() {
				return w, fmt.Errorf("event %d state_changed from %s, but the session is %s", ev.Sequence, d.FromState, m.State())
			}
			if err := apply(d.ToState, d.Reason); err != nil {
				return w, fmt.Errorf("event %d: %w", ev.Sequence, err)
			}
		case session.EventSessionClosed:
			var d session.SessionClosedData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return w, fmt.Errorf("event %d session_closed: %v", ev.Sequence, err)
			}
			w.Closed, w.FinalState = true, d.FinalState
			if d.FinalState != m.State() {
				return w, fmt.Errorf("event %d session_closed with final_state %s, but the session is %s", ev.Sequence, d.FinalState, m.State())
			}
			if !m.IsTerminal() {
				return w, fmt.Errorf("event %d session_closed in %s, which is not terminal", ev.Sequence, m.State())
			}
		}
	}
	return w, nil
}
