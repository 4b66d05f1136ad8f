package conformance

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// ofProcessed is what the caller processed of one session (its answer
// and its messages), in order.
func ofProcessed(ps []Processed, sid string) []Processed {
	var out []Processed
	for _, p := range ps {
		if strings.EqualFold(p.SessionID, sid) {
			out = append(out, p)
		}
	}
	return out
}

func hasSeq(ps []Processed, sid string, seq int64) bool {
	for _, p := range ofProcessed(ps, sid) {
		if p.Type == string(envelope.TypeEvent) && p.Sequence == seq {
			return true
		}
	}
	return false
}

func hasClosed(ps []Processed, sid string) bool {
	for _, p := range ofProcessed(ps, sid) {
		if p.EventType == string(session.EventSessionClosed) {
			return true
		}
	}
	return false
}

// stateOf reads a state field of an event's data.
func stateOf(data json.RawMessage, field string) string {
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	s, _ := m[field].(string)
	return s
}

// sequences are the sequence numbers of the events the caller processed
// of a session, in order.
func sequences(ps []Processed, sid string) []int64 {
	var out []int64
	for _, p := range ofProcessed(ps, sid) {
		if p.Type == string(envelope.TypeEvent) {
			out = append(out, p.Sequence)
		}
	}
	return out
}

// judgeOrdered evaluates ACC-1, ORD-1, ORD-2 and DDP-1 from what the
// caller processed of a session whose n events the kit published as 1, 2,
// 4, 3, 2 again (message dupID), 5..n.
func judgeOrdered(r *recorder, sid, taskID, dupID string, n int64, ps []Processed, werr error) {
	mine := ofProcessed(ps, sid)
	switch {
	case len(mine) == 0:
		r.fail(AccFirst, "session %s: nothing processed (%v)", sid, werr)
	case mine[0].Type != string(envelope.TypeTaskAccepted):
		r.fail(AccFirst, "session %s: the first message processed is %s %d, not task_accepted", sid, mine[0].Type, mine[0].Sequence)
	default:
		r.pass(AccFirst, "task %s: task_accepted processed first for session %s", taskID, sid)
	}
	seqs := sequences(ps, sid)
	inOrder := slices.IsSortedFunc(seqs, func(a, b int64) int { return int(a - b) })
	switch {
	case len(seqs) == 0:
		r.fail(OrdInOrder, "session %s: no event processed (%v)", sid, werr)
	case !inOrder:
		r.fail(OrdInOrder, "session %s: processed sequences %v: not in sequence order (the kit published 1, 2, 4, 3, 2, 5..%d)", sid, seqs, n)
	default:
		r.pass(OrdInOrder, "session %s: published 1, 2, 4, 3, 2, 5..%d; processed %v", sid, n, compact(seqs))
	}
	var missing []int64
	for i := int64(1); i <= n; i++ {
		if !slices.Contains(seqs, i) {
			missing = append(missing, i)
		}
	}
	completed := false
	for _, p := range mine {
		completed = completed || p.Type == string(envelope.TypeTaskCompleted)
	}
	i3, i4 := slices.Index(seqs, 3), slices.Index(seqs, 4)
	switch {
	case len(missing) > 0:
		r.fail(OrdReordered, "session %s: events %v never processed (processed %v; %v)", sid, missing, seqs, werr)
	case i3 > i4:
		r.fail(OrdReordered, "session %s: sequence 3, published after 4, was processed after it (processed %v): not reordered", sid, seqs)
	case !completed:
		r.fail(OrdReordered, "session %s: all %d events processed but not task_completed", sid, n)
	default:
		r.pass(OrdReordered, "session %s: sequence 3, published after 4, processed in its place; all %d events and task_completed processed", sid, n)
	}
	twice := map[int64]int{}
	byID := 0
	for _, p := range mine {
		if p.Type == string(envelope.TypeEvent) {
			twice[p.Sequence]++
		}
		if strings.EqualFold(p.MessageID, dupID) {
			byID++
		}
	}
	var dups []string
	for seq, c := range twice {
		if c > 1 {
			dups = append(dups, fmt.Sprintf("sequence %d %d times", seq, c))
		}
	}
	slices.Sort(dups)
	switch {
	case len(dups) > 0 || byID > 1:
		r.fail(DdpOnce, "session %s: %s; message %s processed %d times", sid, strings.Join(dups, ", "), dupID, byID)
	case byID == 0:
		r.fail(DdpOnce, "session %s: the event published twice (%s) was never processed", sid, dupID)
	default:
		r.pass(DdpOnce, "session %s: event 2 (message %s) published twice, processed once", sid, dupID)
	}
}

// judgeResume evaluates RCN-2: events 1..n processed once each, in order,
// across the disconnect.
func judgeResume(r *recorder, sid string, n int64, ps []Processed, werr error) {
	seqs := sequences(ps, sid)
	want := make([]int64, 0, n)
	for i := int64(1); i <= n; i++ {
		want = append(want, i)
	}
	if !slices.Equal(seqs, want) {
		r.fail(RcnResumes, "session %s: processed %v, want 1..%d once each in order (%v)", sid, seqs, n, werr)
		return
	}
	r.pass(RcnResumes, "session %s: events 1..%d processed once each in order; 4..8 were published while the caller was disconnected", sid, n)
}

// compact renders a sequence list shortly.
func compact(seqs []int64) string {
	if len(seqs) > 12 {
		return fmt.Sprintf("%v … %v", seqs[:6], seqs[len(seqs)-3:])
	}
	return fmt.Sprint(seqs)
}

// commandChecks evaluates the per-command checks over everything the kit
// received.
func (s *crun) commandChecks() {
	judgeCommands(s.r, s.k.commands())
}

func judgeCommands(r *recorder, cmds []*Command) {
	ids := []string{CmdEnvelope, CmdSessionID, CmdContentType, CmdContentEncoding, CmdDeliveryMode, CmdMessageID, CmdMirrored,
		CmdRouting, CmdTypes, CmdStrictEnvelope, CmdUserID, CmdPayloadSchema}
	for _, id := range ids {
		var bad []string
		for _, c := range cmds {
			if why, ok := c.V[id]; ok {
				bad = append(bad, fmt.Sprintf("%s %s: %s", c.D.Type, c.D.MessageId, why))
			}
		}
		switch {
		case len(cmds) == 0:
			r.fail(id, "no command received")
		case len(bad) > 0:
			r.fail(id, "%d of %d commands: %s", len(bad), len(cmds), strings.Join(first(bad), "; "))
		default:
			r.pass(id, "all %d commands", len(cmds))
		}
	}
	bodies := map[string]string{}
	var reused []string
	republished := 0
	for _, c := range cmds {
		if c.Env == nil {
			continue
		}
		id := strings.ToLower(c.Env.MessageID)
		if b, ok := bodies[id]; !ok {
			bodies[id] = string(c.D.Body)
		} else if b != string(c.D.Body) {
			reused = append(reused, c.Env.MessageID)
		} else {
			republished++
		}
	}
	switch {
	case len(cmds) == 0:
		r.fail(CmdUniqueID, "no command received")
	case len(reused) > 0:
		r.fail(CmdUniqueID, "message_id reused for different commands: %s", strings.Join(first(reused), ", "))
	default:
		r.pass(CmdUniqueID, "%d distinct message ids (%d republished with the same body)", len(bodies), republished)
	}
}
