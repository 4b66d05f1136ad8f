package checker

import (
	"fmt"
	"sort"
	"time"
)

// kindTerminal names the violations of how a session ends.
const (
	kindTerminal = "terminal"
	kindGap      = "gap"
)

// Check returns every violation of the model in h, in a stable order.
func Check(h History) []Violation {
	out := contradictions(h.Published)
	out = append(out, appStreams(h.Published, h.Delivered)...)
	out = append(out, overlaps(h.Steps)...)
	out = append(out, stepRuns(h)...)
	out = append(out, terminals(h)...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Session != out[j].Session {
			return out[i].Session < out[j].Session
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}

type key struct {
	session string
	seq     int64
}

// contradictions: two bodies published under one (session, sequence).
func contradictions(pub []Message) []Violation {
	first := map[key]Message{}
	var out []Violation
	for _, m := range pub {
		if m.Seq == 0 {
			continue // unsequenced (task_accepted, the terminal message): judged by terminals
		}
		k := key{m.Session, m.Seq}
		f, seen := first[k]
		if !seen {
			first[k] = m
			continue
		}
		if f.Digest != m.Digest {
			out = append(out, Violation{"contradiction", m.Session, fmt.Sprintf(
				"sequence %d published with two bodies: %s (epoch %d, by %s at %s) and %s (epoch %d, by %s at %s)",
				m.Seq, f.Digest, f.Epoch, f.Publisher, stamp(f.At), m.Digest, m.Epoch, m.Publisher, stamp(m.At))})
			first[k] = Message{Session: f.Session, Seq: f.Seq, Digest: "\x00reported"}
		}
	}
	return out
}

// appStreams checks each session's stream as the app received it against
// what was published.
func appStreams(pub, got []Message) []Violation {
	published := map[key][]Message{}
	for _, m := range pub {
		published[key{m.Session, m.Seq}] = append(published[key{m.Session, m.Seq}], m)
	}
	type state struct {
		last     int64
		started  bool
		epoch    int64
		finished bool
		seen     map[string]bool // digests of unsequenced messages delivered
		// gap is a gap not yet excused: only state transitions may
		// follow it until one announces the recovery (a new owner first
		// pauses the session, RUNNING → PAUSED, then resumes it from its
		// checkpoint, PAUSED → RUNNING recovered_from_checkpoint).
		gap string
	}
	streams := map[string]*state{}
	var out []Violation
	for _, m := range got {
		st := streams[m.Session]
		if st == nil {
			st = &state{seen: map[string]bool{}}
			streams[m.Session] = st
		}
		if st.gap != "" && m.Reason != RecoveryReason && (m.Type != typeStateChanged || m.Seq == 0) {
			out = append(out, Violation{kindGap, m.Session, fmt.Sprintf("%s, and %s came before any recovery was announced", st.gap, describe(m))})
			st.gap = ""
		}
		if m.Reason == RecoveryReason {
			st.gap = ""
		}
		if m.Seq == 0 {
			out = append(out, unsequenced(st.seen, published[key{m.Session, 0}], m, st.finished)...)
			st.finished = st.finished || m.Closes
			continue
		}
		switch {
		case st.started && m.Seq == st.last:
			out = append(out, Violation{"duplicate", m.Session, fmt.Sprintf("sequence %d delivered twice (at %s)", m.Seq, stamp(m.At))})
			continue
		case st.started && m.Seq < st.last:
			out = append(out, Violation{"reorder", m.Session, fmt.Sprintf("sequence %d delivered after %d (at %s)", m.Seq, st.last, stamp(m.At))})
			continue
		case st.finished:
			out = append(out, Violation{kindTerminal, m.Session, fmt.Sprintf("sequence %d (%s) delivered after the session closed", m.Seq, m.Type)})
		}
		expected := int64(1)
		if st.started {
			expected = st.last + 1
		}
		if m.Seq > expected && m.Reason != RecoveryReason {
			gap := fmt.Sprintf("sequences %d..%d never delivered", expected, m.Seq-1)
			if m.Type == typeStateChanged {
				st.gap = gap // excused if the transitions that follow announce a recovery
			} else {
				out = append(out, Violation{kindGap, m.Session, fmt.Sprintf("%s, and %s announces no recovery", gap, describe(m))})
			}
		}
		match, ok := matching(published[key{m.Session, m.Seq}], m.Digest)
		switch {
		case !ok:
			out = append(out, Violation{"phantom", m.Session, fmt.Sprintf("sequence %d delivered with body %s, which nobody published", m.Seq, m.Digest)})
		case match.Epoch < st.epoch:
			out = append(out, Violation{"stale-epoch", m.Session, fmt.Sprintf("sequence %d from owner epoch %d delivered after epoch %d", m.Seq, match.Epoch, st.epoch)})
		default:
			st.epoch = max(st.epoch, match.Epoch)
		}
		st.started, st.last = true, m.Seq
		if m.Closes {
			st.finished = true
		}
	}
	for id, st := range streams {
		if st.gap != "" {
			out = append(out, Violation{kindGap, id, st.gap + ", and no recovery was announced after it"})
		}
	}
	return out
}

// typeStateChanged is the L2 event type of a state transition.
const typeStateChanged = "state_changed"

func describe(m Message) string {
	if m.Seq == 0 {
		return m.Type
	}
	return fmt.Sprintf("%d (%s)", m.Seq, m.Type)
}

// unsequenced judges a message without a sequence (task_accepted, the
// terminal message): published, delivered once, nothing after the end.
func unsequenced(seen map[string]bool, published []Message, m Message, finished bool) []Violation {
	var out []Violation
	if _, ok := matching(published, m.Digest); !ok {
		out = append(out, Violation{"phantom", m.Session, fmt.Sprintf("%s delivered with body %s, which nobody published", m.Type, m.Digest)})
	}
	if seen[m.Digest] {
		out = append(out, Violation{"duplicate", m.Session, fmt.Sprintf("%s delivered twice (at %s)", m.Type, stamp(m.At))})
	} else if finished {
		out = append(out, Violation{kindTerminal, m.Session, fmt.Sprintf("%s delivered after the session closed", m.Type)})
	}
	seen[m.Digest] = true
	return out
}

func matching(candidates []Message, digest string) (Message, bool) {
	for _, c := range candidates {
		if c.Digest == digest {
			return c, true
		}
	}
	return Message{}, false
}

// overlaps: two pods executing steps of one session at the same instant.
func overlaps(steps []Step) []Violation {
	bySession := map[string][]Step{}
	for _, s := range steps {
		bySession[s.Session] = append(bySession[s.Session], s)
	}
	var out []Violation
	for session, ss := range bySession {
		sort.Slice(ss, func(i, j int) bool { return ss[i].Start.Before(ss[j].Start) })
		// The latest-ending execution so far of each pod other than the
		// current one is what the next start must not precede.
		var open []Step
		for _, s := range ss {
			kept := open[:0]
			for _, o := range open {
				if o.End.After(s.Start) {
					kept = append(kept, o)
				}
			}
			open = kept
			for _, o := range open {
				if o.Pod != s.Pod {
					out = append(out, Violation{"overlap", session, fmt.Sprintf(
						"step %d on %s (%s–%s) overlaps step %d on %s (%s–%s)",
						o.Step, o.Pod, stamp(o.Start), stamp(o.End), s.Step, s.Pod, stamp(s.Start), stamp(s.End))})
				}
			}
			open = append(open, s)
		}
	}
	return out
}

// stepRuns: every step of a completed task ran, and a step ran again only
// after a recovery from a checkpoint before it, once per such recovery.
func stepRuns(h History) []Violation {
	runs := map[string]map[int][]time.Time{}
	for _, s := range h.Steps {
		if runs[s.Session] == nil {
			runs[s.Session] = map[int][]time.Time{}
		}
		runs[s.Session][s.Step] = append(runs[s.Session][s.Step], s.Start)
	}
	var out []Violation
	for session, n := range h.Completed {
		for k := 1; k <= n; k++ {
			if len(runs[session][k]) == 0 {
				out = append(out, Violation{"lost-step", session, fmt.Sprintf("step %d of %d never ran, yet the task completed", k, n)})
			}
		}
	}
	for session, byStep := range runs {
		for k, starts := range byStep {
			allowed := 1
			for _, r := range h.Recoveries {
				// A recovery re-runs step k once if k is after its
				// checkpoint and had started before the recovery.
				if r.Session == session && r.AfterStep < k && startedBefore(starts, r.At) {
					allowed++
				}
			}
			if len(starts) > allowed {
				out = append(out, Violation{"extra-run", session, fmt.Sprintf("step %d ran %d times; the recoveries allow %d", k, len(starts), allowed)})
			}
		}
	}
	return out
}

func startedBefore(starts []time.Time, at time.Time) bool {
	for _, s := range starts {
		if s.Before(at) {
			return true
		}
	}
	return false
}

// terminals: every session ends once, in one state, the same for every
// observer.
func terminals(h History) []Violation {
	var out []Violation
	wire := map[string]map[string]bool{}
	for _, m := range h.Published {
		if m.Final == "" {
			continue
		}
		if wire[m.Session] == nil {
			wire[m.Session] = map[string]bool{}
		}
		wire[m.Session][m.Final] = true
	}
	sessions := map[string]bool{}
	for s := range wire {
		sessions[s] = true
	}
	for _, views := range h.Terminal {
		for s := range views {
			sessions[s] = true
		}
	}
	for s := range sessions {
		if len(wire[s]) > 1 {
			out = append(out, Violation{kindTerminal, s, fmt.Sprintf("published with several terminal states: %v", keys(wire[s]))})
		}
		want := ""
		for st := range wire[s] {
			want = st
		}
		for observer, views := range h.Terminal {
			if got := views[s]; got != want {
				out = append(out, Violation{kindTerminal, s, fmt.Sprintf("%s sees %q, the wire %q", observer, got, want)})
			}
		}
	}
	return out
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }
