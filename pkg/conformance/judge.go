package conformance

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// messages evaluates the per-message checks over everything received,
// and the routing of the kit's commands.
func (s *run) messages() {
	k, r := s.k, s.r
	msgs := k.snapshot()
	ids := []string{MsgEnvelope, MsgSessionID, MsgContentType, MsgContentEncoding, MsgDeliveryMode, MsgMessageID, MsgMirrored, MsgUserID, MsgRoutingKey, MsgPayload, MsgStrictEnvelope, MsgPayloadSchema}
	for _, id := range ids {
		var bad []string
		for _, m := range msgs {
			if why, ok := m.V[id]; ok {
				bad = append(bad, fmt.Sprintf("%s %s: %s", m.D.Type, m.D.MessageId, why))
			}
		}
		switch {
		case len(msgs) == 0:
			r.fail(id, "no message received")
		case len(bad) > 0:
			r.fail(id, "%d of %d messages: %s", len(bad), len(msgs), strings.Join(first(bad), "; "))
		default:
			detail := fmt.Sprintf("all %d messages", len(msgs))
			if id == MsgUserID && k.cfg.CalleeUser != "" {
				detail += " from user " + k.cfg.CalleeUser
			}
			r.pass(id, "%s", detail)
		}
	}

	bodies := map[string]string{}
	var dups []string
	redeliveries := 0
	for _, m := range msgs {
		if m.Env == nil {
			continue
		}
		id := strings.ToLower(m.Env.MessageID)
		if b, ok := bodies[id]; !ok {
			bodies[id] = string(m.D.Body)
		} else if b != string(m.D.Body) {
			dups = append(dups, m.Env.MessageID)
		} else {
			redeliveries++
		}
	}
	if len(dups) > 0 {
		r.fail(MsgUniqueID, "message_id reused for different messages: %s", strings.Join(first(dups), ", "))
	} else {
		r.pass(MsgUniqueID, "%d distinct message ids (%d repeats with the same body, i.e. redeliveries)", len(bodies), redeliveries)
	}

	k.mu.Lock()
	nPub, nRet := k.nPublish, k.nReturns
	rets := make([]string, 0, len(k.returned))
	for id, why := range k.returned {
		rets = append(rets, id+": "+why)
	}
	k.mu.Unlock()
	sort.Strings(rets)
	switch {
	case nPub == 0:
		r.fail(TopCommandRouting, "nothing published")
	case nRet > 0:
		r.fail(TopCommandRouting, "%d of %d mandatory publishes to %s with key %s returned unroutable: %s", nRet, nPub, topology.CommandsExchange, k.cfg.commandKey, strings.Join(first(rets), "; "))
	default:
		r.pass(TopCommandRouting, "%d mandatory publishes to %s with key %s, none returned", nPub, topology.CommandsExchange, k.cfg.commandKey)
	}
}

// sessions evaluates sequence, transitions and closing over every
// session the kit's tasks opened.
func (s *run) sessions() {
	r := s.r
	msgs := s.k.snapshot()
	if len(s.started) == 0 {
		for _, id := range []string{SesSequence, SesTransitions, SesClosed, SesNoGap} {
			r.fail(id, "no session was opened")
		}
		return
	}
	var seqBad, gapBad, trBad, clBad []string
	total := 0
	finals := map[session.State]int{}
	for _, sid := range uniq(s.started) {
		evs := events(msgs, sid)
		total += len(evs)
		if err := CheckIncreasing(evs); err != nil {
			seqBad = append(seqBad, sid+": "+err.Error())
		} else if len(evs) == 0 {
			seqBad = append(seqBad, sid+": no events")
		}
		if err := CheckSequence(evs); err != nil {
			gapBad = append(gapBad, sid+": "+err.Error())
		}
		w, err := CheckTransitions(evs)
		if err != nil {
			trBad = append(trBad, sid+": "+err.Error())
		}
		if !w.Closed {
			clBad = append(clBad, sid+": no session_closed")
			continue
		}
		finals[w.FinalState]++
		if err := terminalMessage(ofSession(msgs, sid), w.FinalState); err != nil {
			clBad = append(clBad, sid+": "+err.Error())
		}
	}
	n := len(uniq(s.started))
	if len(seqBad) > 0 {
		r.fail(SesSequence, "%s", strings.Join(first(seqBad), "; "))
	} else {
		r.pass(SesSequence, "%d sessions, %d events, strictly increasing in each", n, total)
	}
	if len(gapBad) > 0 {
		r.fail(SesNoGap, "%s", strings.Join(first(gapBad), "; "))
	} else {
		r.pass(SesNoGap, "%d sessions, each 1..n", n)
	}
	if len(trBad) > 0 {
		r.fail(SesTransitions, "%s", strings.Join(first(trBad), "; "))
	} else {
		r.pass(SesTransitions, "%d sessions replayed through the L2 state machine without an invalid transition", n)
	}
	if len(clBad) > 0 {
		r.fail(SesClosed, "%s", strings.Join(first(clBad), "; "))
	} else {
		r.pass(SesClosed, "%d sessions closed: %v", n, finals)
	}
}

// terminalMessage checks the L1 message that goes with a final state:
// task_completed for COMPLETED, task_failed for FAILED, before
// session_closed; neither for ABORTED.
func terminalMessage(msgs []*Message, final session.State) error {
	idx := map[envelope.MessageType]int{}
	closedAt := -1
	for i, m := range msgs {
		if _, ok := idx[m.Env.Type]; !ok {
			idx[m.Env.Type] = i
		}
		if m.Env.Type == envelope.TypeEvent && closedAt < 0 {
			if ev, err := EventOf(m.Env); err == nil && ev.Type == session.EventSessionClosed {
				closedAt = i
			}
		}
	}
	want := map[session.State]envelope.MessageType{session.StateCompleted: envelope.TypeTaskCompleted, session.StateFailed: envelope.TypeTaskFailed}[final]
	for _, t := range []envelope.MessageType{envelope.TypeTaskCompleted, envelope.TypeTaskFailed} {
		i, ok := idx[t]
		switch {
		case t == want && !ok:
			return fmt.Errorf("final state %s without %s", final, t)
		case t == want && i > closedAt:
			return fmt.Errorf("%s after session_closed", t)
		case t != want && ok:
			return fmt.Errorf("%s in a session that ended %s", t, final)
		}
	}
	return nil
}

func first(s []string) []string {
	const n = 3
	if len(s) <= n {
		return s
	}
	return append(s[:n:n], fmt.Sprintf("and %d more", len(s)-n))
}

func uniq(s []string) []string {
	var out []string
	for _, x := range s {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}
