package checker

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func msg(seq int64, epoch int64, typ string) Message {
	m := Message{Session: "s1", Seq: seq, Epoch: epoch, Type: typ, Digest: fmt.Sprintf("b%d", seq), Publisher: "pod-a", At: at(float64(seq))}
	if seq == 0 {
		m.Digest, m.At = typ, at(14)
	}
	if typ == "task_completed" {
		m.Final = "COMPLETED"
	}
	return m
}

// clean is a session that was taken over after step 3 (its checkpoint
// after step 2): the old owner published 1..4, the new owner continues
// after the reserved ceiling (10) with the recovery transition, step 3
// runs again once, and the task completes.
func clean() History {
	pub := []Message{msg(1, 1, "event"), msg(2, 1, "event"), msg(3, 1, "checkpoint_created"), msg(4, 1, "event")}
	rec := msg(11, 2, "state_changed")
	rec.Reason, rec.Publisher = RecoveryReason, "pod-b"
	closed := msg(13, 2, "session_closed")
	closed.Final, closed.Closes = "COMPLETED", true
	pub = append(pub, rec, msg(12, 2, "event"), msg(0, 2, "task_completed"), closed)
	for i := 4; i < len(pub); i++ {
		pub[i].Publisher = "pod-b"
	}
	return History{
		Published: pub,
		Delivered: pub,
		Steps: []Step{
			{"s1", 1, "pod-a", at(0), at(1)}, {"s1", 2, "pod-a", at(1), at(2)}, {"s1", 3, "pod-a", at(3), at(4)},
			{"s1", 3, "pod-b", at(11), at(12)}, {"s1", 4, "pod-b", at(12), at(13)},
		},
		Recoveries: []Recovery{{"s1", 2, at(10.5)}},
		Terminal:   map[string]map[string]string{"app": {"s1": "COMPLETED"}, "hcpsession": {"s1": "COMPLETED"}},
		Completed:  map[string]int{"s1": 4},
	}
}

func TestCleanHistoryPasses(t *testing.T) {
	if v := Check(clean()); len(v) != 0 {
		t.Fatalf("a clean takeover is judged to violate the model: %v", v)
	}
}

// Each case breaks one promise; the checker must name exactly that kind.
func TestEachViolationIsFound(t *testing.T) {
	// kind must be found; also lists what the same fault necessarily
	// breaks besides (a swap leaves a gap where the later event came first;
	// a zombie's message under a used sequence is also a contradiction).
	cases := map[string]struct {
		kind   string
		break_ func(h *History)
		also   []string
	}{
		"a zombie publishes another body under a used sequence": {"contradiction", func(h *History) {
			z := msg(12, 1, "event")
			z.Digest, z.Publisher = "zombie", "pod-a"
			h.Published = append(h.Published, z)
		}, nil},
		"the app misses events with no recovery announced": {"gap", func(h *History) {
			h.Delivered = append(append([]Message{}, h.Delivered[:1]...), h.Delivered[2:]...)
		}, nil},
		"a new owner pauses after a gap, then goes on with no recovery": {"gap", func(h *History) {
			pause := msg(11, 2, "state_changed")
			pause.Reason, pause.Publisher = "harness_moved", "pod-b"
			d := append([]Message{}, h.Delivered[:4]...)
			h.Delivered = append(append(d, pause), h.Delivered[5:]...)
			h.Published = append(h.Published[:4:4], h.Delivered[4:]...)
		}, nil},
		"the app gets an event twice": {"duplicate", func(h *History) {
			h.Delivered = append(append([]Message{}, h.Delivered[:2]...), h.Delivered[1:]...)
		}, nil},
		"the app gets events out of order": {"reorder", func(h *History) {
			d := append([]Message{}, h.Delivered...)
			d[1], d[2] = d[2], d[1]
			h.Delivered = d
		}, []string{"gap"}},
		"the app gets a body nobody published": {"phantom", func(h *History) {
			d := append([]Message{}, h.Delivered...)
			d[5].Digest = "forged"
			h.Delivered = d
		}, nil},
		"the app gets a zombie's message after its successor's": {"stale-epoch", func(h *History) {
			z := msg(12, 1, "event")
			z.Digest = "zombie-12"
			h.Published = append(h.Published, z)
			d := append([]Message{}, h.Delivered...)
			d[5] = z
			h.Delivered = d
		}, []string{"contradiction"}},
		"two pods execute the session at once": {"overlap", func(h *History) {
			h.Steps = append(h.Steps, Step{"s1", 5, "pod-a", at(11.5), at(12.5)})
		}, nil},
		"a step of a completed task never ran": {"lost-step", func(h *History) {
			h.Steps = h.Steps[:len(h.Steps)-1]
		}, nil},
		"a step runs twice with no recovery to explain it": {"extra-run", func(h *History) {
			h.Steps = append(h.Steps, Step{"s1", 4, "pod-b", at(13), at(14)})
		}, nil},
		"a step before the checkpoint runs again": {"extra-run", func(h *History) {
			h.Steps = append(h.Steps, Step{"s1", 2, "pod-b", at(10.6), at(10.9)})
		}, nil},
		"the HCPSession disagrees with the wire": {"terminal", func(h *History) {
			h.Terminal["hcpsession"]["s1"] = "RUNNING"
		}, nil},
		"the app gets the terminal message twice": {"duplicate", func(h *History) {
			d := append([]Message{}, h.Delivered[:7]...)
			h.Delivered = append(append(d, h.Delivered[6]), h.Delivered[7:]...)
		}, nil},
		"two terminal states are published": {"terminal", func(h *History) {
			f := msg(0, 1, "task_failed")
			f.Digest = "failed"
			f.Final = "FAILED"
			h.Published = append(h.Published, f)
		}, nil},
		"the app gets an event after the terminal message": {"terminal", func(h *History) {
			late := msg(14, 2, "event")
			h.Published = append(h.Published, late)
			h.Delivered = append(append([]Message{}, h.Delivered...), late)
		}, nil},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			h := clean()
			c.break_(&h)
			v := Check(h)
			if len(v) == 0 {
				t.Fatalf("no violation found; want %s", c.kind)
			}
			var kinds []string
			found := false
			for _, x := range v {
				kinds = append(kinds, x.Kind)
				found = found || x.Kind == c.kind
				if x.Kind != c.kind && !slices.Contains(c.also, x.Kind) {
					t.Errorf("unexpected %s", x)
				}
			}
			if !found {
				t.Errorf("no %s found", c.kind)
			}
			t.Logf("found: %s", strings.Join(kinds, ", "))
		})
	}
}

// A new owner may pause the session (RUNNING → PAUSED) right after the gap
// and announce the recovery with the next transition: excused.
func TestRecoveryAnnouncedAfterThePause(t *testing.T) {
	h := clean()
	pause := msg(11, 2, "state_changed")
	pause.Reason, pause.Publisher = "harness_moved", "pod-b"
	rec := h.Delivered[4]
	rec.Seq, rec.Digest = 12, "b12r"
	ev := h.Delivered[5]
	ev.Seq, ev.Digest = 13, "b13"
	closed := h.Delivered[7]
	closed.Seq, closed.Digest = 14, "b14"
	h.Delivered = append(h.Delivered[:4:4], pause, rec, ev, h.Delivered[6], closed)
	h.Published = h.Delivered
	if v := Check(h); len(v) != 0 {
		t.Fatalf("violations: %v", v)
	}
}

// The same execution by one pod may span several steps; only two pods at
// once is a violation.
func TestOnePodMayRunStepsBackToBack(t *testing.T) {
	h := clean()
	h.Steps = append(h.Steps, Step{"s1", 99, "pod-b", at(11.2), at(11.4)})
	for _, v := range Check(h) {
		if v.Kind == "overlap" {
			t.Fatalf("one pod's own steps judged an overlap: %s", v)
		}
	}
}
