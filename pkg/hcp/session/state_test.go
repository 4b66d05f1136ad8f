package session

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// specTable is the L2 "Valid State Transitions" table, written out
// independently of the implementation.
var specTable = map[[2]State]bool{
	{StatePending, StateRunning}:   true,
	{StatePending, StateRejected}:  true,
	{StateRunning, StatePaused}:    true,
	{StateRunning, StateAborting}:  true,
	{StateRunning, StateCompleted}: true,
	{StateRunning, StateFailed}:    true,
	{StatePaused, StateRunning}:    true,
	{StatePaused, StateAborting}:   true,
	{StateAborting, StateAborted}:  true,
}

func TestStates(t *testing.T) {
	want := []string{"PENDING", "RUNNING", "PAUSED", "ABORTING", "ABORTED", "COMPLETED", "FAILED", "REJECTED"}
	got := States()
	if len(got) != len(want) {
		t.Fatalf("States() = %v", got)
	}
	terminal := map[State]bool{StateAborted: true, StateCompleted: true, StateFailed: true, StateRejected: true}
	for i, s := range got {
		if string(s) != want[i] {
			t.Errorf("States()[%d] = %s, want %s", i, s, want[i])
		}
		p, err := ParseState(want[i])
		if err != nil || p != s {
			t.Errorf("ParseState(%q) = %q, %v", want[i], p, err)
		}
		if s.IsTerminal() != terminal[s] {
			t.Errorf("%s.IsTerminal() = %v", s, s.IsTerminal())
		}
	}
	for _, bad := range []string{"", "running", "Running", "DONE", "CANCELLED"} {
		if _, err := ParseState(bad); err == nil {
			t.Errorf("ParseState(%q) succeeded", bad)
		}
		if State(bad).IsTerminal() {
			t.Errorf("%q is terminal", bad)
		}
	}
}

// TestAllTransitions checks all 8x8 pairs (plus unknown states) against the
// specification's table.
func TestAllTransitions(t *testing.T) {
	all := append(States(), State(""), State("DONE"))
	n := 0
	for _, from := range all {
		for _, to := range all {
			t.Run(fmt.Sprintf("%s->%s", from, to), func(t *testing.T) {
				want := specTable[[2]State{from, to}]
				if got := CanTransition(from, to); got != want {
					t.Fatalf("CanTransition = %v, want %v", got, want)
				}
				err := Transition(from, to)
				if want {
					if err != nil {
						t.Fatalf("Transition: %v", err)
					}
					return
				}
				if err == nil {
					t.Fatal("Transition succeeded")
				}
				if !errors.Is(err, ErrInvalidTransition) {
					t.Errorf("%v does not match ErrInvalidTransition", err)
				}
				var te *TransitionError
				if !errors.As(err, &te) || te.From != from || te.To != to {
					t.Fatalf("error %#v does not carry from/to", err)
				}
				msg := err.Error()
				if !strings.Contains(msg, string(from)) || !strings.Contains(msg, string(to)) {
					t.Errorf("message %q does not name both states", msg)
				}
				if from.IsTerminal() && to.Valid() && !strings.Contains(msg, "terminal states never reopen") {
					t.Errorf("message %q does not say terminal states never reopen", msg)
				}
				if !from.Valid() || !to.Valid() {
					if !strings.Contains(msg, "unknown state") {
						t.Errorf("message %q does not say unknown state", msg)
					}
				}
			})
			n++
		}
	}
	if n != 100 {
		t.Fatalf("checked %d pairs", n)
	}
}

func TestTerminalNeverReopens(t *testing.T) {
	for _, from := range States() {
		if !from.IsTerminal() {
			continue
		}
		for _, to := range States() {
			if CanTransition(from, to) {
				t.Errorf("terminal %s -> %s allowed", from, to)
			}
		}
	}
}

func TestTransitionsTable(t *testing.T) {
	edges := Transitions()
	if len(edges) != len(specTable) {
		t.Fatalf("Transitions() has %d edges, spec has %d", len(edges), len(specTable))
	}
	for _, e := range edges {
		if !specTable[[2]State{e.From, e.To}] {
			t.Errorf("edge %s -> %s not in the spec", e.From, e.To)
		}
		if e.Trigger == "" {
			t.Errorf("edge %s -> %s has no trigger", e.From, e.To)
		}
	}
	edges[0].To = StateFailed // must not leak into the package table
	if CanTransition(StatePending, StateFailed) {
		t.Fatal("Transitions() returned the internal table")
	}
	// The design points the package documentation describes: no edge exists.
	for _, p := range [][2]State{{StatePaused, StateFailed}, {StateAborting, StateFailed}, {StatePending, StateAborting}, {StateAborting, StateCompleted}} {
		if CanTransition(p[0], p[1]) {
			t.Errorf("%s -> %s must not exist", p[0], p[1])
		}
	}
}

func TestTransitionErrorMessages(t *testing.T) {
	for _, tc := range []struct {
		from, to State
		want     string
	}{
		{StateCompleted, StateRunning, "invalid session state transition COMPLETED -> RUNNING: COMPLETED is terminal; terminal states never reopen"},
		{StateRunning, StateRunning, "invalid session state transition RUNNING -> RUNNING: already RUNNING"},
		{StatePending, StateCompleted, "invalid session state transition PENDING -> COMPLETED: from PENDING only [RUNNING REJECTED] are allowed"},
		{"x", StateRunning, `invalid session state transition "x" -> RUNNING: unknown state "x"`},
	} {
		if got := Transition(tc.from, tc.to).Error(); got != tc.want {
			t.Errorf("Transition(%s, %s) = %q, want %q", tc.from, tc.to, got, tc.want)
		}
	}
}

func TestMachine(t *testing.T) {
	t0 := time.Date(2025, 1, 15, 8, 0, 0, 0, time.UTC)
	m := New(t0)
	if m.State() != StatePending || !m.CreatedAt().Equal(t0) || !m.UpdatedAt().Equal(t0) || len(m.History()) != 0 {
		t.Fatalf("New = %+v", m)
	}
	steps := []struct {
		to     State
		reason string
	}{
		{StateRunning, "approved"}, {StatePaused, "checkpoint"}, {StateRunning, "resumed"},
		{StatePaused, ""}, {StateRunning, ReasonTimeout}, {StateFailed, ReasonTimeout},
	}
	var err error
	for i, s := range steps {
		at := t0.Add(time.Duration(i+1) * time.Minute)
		if m, err = m.Apply(s.to, s.reason, at); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if m.State() != s.to || !m.UpdatedAt().Equal(at) {
			t.Fatalf("step %d: state %s updated %v", i, m.State(), m.UpdatedAt())
		}
	}
	if !m.IsTerminal() {
		t.Fatal("FAILED not terminal")
	}
	h := m.History()
	if len(h) != len(steps) || h[0].From != StatePending || h[5].To != StateFailed || h[5].Reason != ReasonTimeout {
		t.Fatalf("history = %+v", h)
	}
	before := m
	if _, err := m.Apply(StateRunning, "reopen", t0.Add(time.Hour)); !errors.Is(err, ErrInvalidTransition) {
		t.Fatalf("reopen: %v", err)
	}
	if m.State() != before.State() || len(m.History()) != len(h) {
		t.Fatal("failed Apply changed the machine")
	}
	h[0].Reason = "mutated"
	if m.History()[0].Reason == "mutated" {
		t.Fatal("History() exposes internal storage")
	}
}

func TestMachineIsAValue(t *testing.T) {
	t0 := time.Unix(0, 0).UTC()
	base, _ := New(t0).Apply(StateRunning, "", t0)
	// Two branches from one value must not see each other's history.
	a, err := base.Apply(StateCompleted, "a", t0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := base.Apply(StateAborting, "b", t0)
	if err != nil {
		t.Fatal(err)
	}
	if base.State() != StateRunning || len(base.History()) != 1 {
		t.Fatalf("base changed: %+v", base)
	}
	if a.History()[1].Reason != "a" || b.History()[1].Reason != "b" {
		t.Fatalf("branches share history: %+v / %+v", a.History(), b.History())
	}
}

func TestRestore(t *testing.T) {
	t0 := time.Unix(100, 0).UTC()
	m, err := Restore(StatePaused, t0, t0.Add(time.Second))
	if err != nil || m.State() != StatePaused || !m.UpdatedAt().Equal(t0.Add(time.Second)) {
		t.Fatalf("Restore = %+v, %v", m, err)
	}
	if _, err = m.Apply(StateAborting, "abort", t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore("BOGUS", t0, t0); err == nil {
		t.Fatal("Restore of unknown state succeeded")
	}
	var zero Machine
	if _, err := zero.Apply(StateRunning, "", t0); err == nil {
		t.Fatal("zero Machine accepted a transition")
	}
}
