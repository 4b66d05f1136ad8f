package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// abort: a long task aborted while RUNNING.
func (s *run) abort(ctx context.Context) {
	k, r, cfg := s.k, s.r, s.k.cfg
	notRun := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		for _, id := range []string{AbtAborting, AbtAborted, AbtClosed} {
			r.fail(id, "%s", msg)
		}
	}
	p, err := k.newSubmit(cfg.AbortCapability, cfg.AbortInputs, "hcp-conformance: a long task to abort", "")
	if err != nil {
		notRun("%v", err)
		return
	}
	a, err := s.start(ctx, p)
	if err != nil {
		notRun("the long task (%s) was not accepted: %v", cfg.AbortCapability, err)
		return
	}
	sid := a.SessionID
	err = k.wait(ctx, "session "+sid+" RUNNING with progress", func(msgs []*Message) bool {
		evs := events(msgs, sid)
		w, _ := CheckTransitions(evs)
		return w.Closed || (w.State == session.StateRunning && evs[len(evs)-1].Type != session.EventStateChanged)
	})
	if err != nil {
		notRun("%v", err)
		return
	}
	if closed(k.snapshot(), sid) {
		notRun("the long task ended before the abort: give --abort-inputs that run for several seconds")
		return
	}
	sent := time.Now()
	if err := k.abort(ctx, sid, a.SessionToken); err != nil {
		notRun("publish abort: %v", err)
		return
	}
	if err := s.waitClosed(ctx, sid); err != nil {
		notRun("after the abort: %v", err)
		return
	}
	took := time.Since(sent).Round(time.Millisecond)
	msgs := k.snapshot()
	w, werr := CheckTransitions(events(msgs, sid))
	i := slices.Index(w.States, session.StateAborting)
	switch {
	case i < 0:
		r.fail(AbtAborting, "session %s went %v: no ABORTING (%v)", sid, w.States, werr)
	default:
		r.pass(AbtAborting, "session %s: %s → ABORTING after the abort", sid, w.States[i-1])
	}
	switch {
	case i < 0 || i+1 >= len(w.States) || w.States[i+1] != session.StateAborted:
		r.fail(AbtAborted, "session %s went %v, want ABORTING → ABORTED (%v)", sid, w.States, werr)
	default:
		r.pass(AbtAborted, "session %s: ABORTING → ABORTED %s after the abort was published", sid, took)
	}
	completed := 0
	for _, m := range ofSession(msgs, sid) {
		if m.Env.Type == envelope.TypeTaskCompleted {
			completed++
		}
	}
	switch {
	case !w.Closed || w.FinalState != session.StateAborted:
		r.fail(AbtClosed, "session %s: session_closed final_state %q", sid, w.FinalState)
	case completed > 0:
		r.fail(AbtClosed, "session %s: task_completed after the abort", sid)
	default:
		r.pass(AbtClosed, "session %s: session_closed ABORTED, no task_completed; states %v", sid, w.States)
	}
}

// continuity: the kit disconnects mid-stream holding some events
// unacknowledged, stays away, reconnects and checks the stream.
func (s *run) continuity(ctx context.Context) {
	k, r, cfg := s.k, s.r, s.k.cfg
	notRun := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		for _, id := range []string{ConRetained, ConRedelivery, ConNoGap} {
			r.fail(id, "%s", msg)
		}
	}
	p, err := k.newSubmit(cfg.AbortCapability, cfg.AbortInputs, "hcp-conformance: a stream across a caller reconnect", "")
	if err != nil {
		notRun("%v", err)
		return
	}
	const keep = 3
	k.mu.Lock()
	k.hold = &holdRule{task: p.MessageId, keep: keep}
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		k.hold = nil
		k.mu.Unlock()
	}
	a, err := s.start(ctx, p)
	if err != nil {
		release()
		notRun("the long task (%s) was not accepted: %v", cfg.AbortCapability, err)
		return
	}
	sid := a.SessionID
	k.mu.Lock()
	gen1 := k.gen
	k.mu.Unlock()
	err = k.wait(ctx, fmt.Sprintf("%d events of session %s", keep+2, sid), func(msgs []*Message) bool {
		return len(ofSession(msgs, sid)) >= keep+2 || closed(msgs, sid)
	})
	if err != nil {
		release()
		notRun("%v", err)
		return
	}
	k.disconnect()
	release()
	before := ofSession(k.snapshot(), sid)
	k.logf("disconnected after %d messages of session %s; reconnecting in %s", len(before), sid, cfg.Disconnect)
	time.Sleep(cfg.Disconnect)
	if err := k.connect(); err != nil {
		notRun("reconnect: %v", err)
		return
	}
	seenBefore := map[string]bool{}
	for _, m := range before {
		seenBefore[m.Env.MessageID] = true
	}
	if err := k.wait(ctx, "new events after the reconnect", func(msgs []*Message) bool {
		return nFreshOf(msgs, sid, gen1, seenBefore) >= 2 || closed(msgs, sid)
	}); err != nil {
		notRun("%v", err)
		return
	}
	if !closed(k.snapshot(), sid) {
		if err := k.abort(ctx, sid, a.SessionToken); err != nil {
			notRun("publish abort to end the stream: %v", err)
			return
		}
	}
	if err := s.waitClosed(ctx, sid); err != nil {
		notRun("%v", err)
		return
	}
	time.Sleep(500 * time.Millisecond)
	judgeContinuity(r, cfg.Disconnect, sid, gen1, len(before), nFreshOf(k.snapshot(), sid, gen1, seenBefore), k.snapshot())
}

// judgeContinuity evaluates the CON checks from what the kit received:
// nBefore messages of the session before the disconnect on connection
// gen1, nFresh new ones after it.
func judgeContinuity(r *recorder, disconnect time.Duration, sid string, gen1, nBefore, nFresh int, all []*Message) {
	msgs := ofSession(all, sid)

	var held, acked, after []*Message
	for _, m := range msgs {
		switch {
		case m.Gen == gen1 && m.Acked:
			acked = append(acked, m)
		case m.Gen == gen1:
			held = append(held, m)
		case m.Gen > gen1:
			after = append(after, m)
		}
	}
	if nFresh > 0 && len(held) > 0 {
		r.pass(ConRetained, "disconnected %s after %d messages of session %s; after the reconnect %d new messages arrived", disconnect, nBefore, sid, nFresh)
	} else {
		r.fail(ConRetained, "disconnected after %d messages (%d held); %d new messages after the reconnect: the task must still be running at the disconnect (longer --abort-inputs)", nBefore, len(held), nFresh)
	}

	redelivered := map[string]*Message{}
	for _, m := range after {
		if _, ok := redelivered[m.Env.MessageID]; !ok {
			redelivered[m.Env.MessageID] = m
		}
	}
	var problems []string
	for _, m := range held {
		if d, ok := redelivered[m.Env.MessageID]; !ok {
			problems = append(problems, "held "+m.Env.MessageID+" not redelivered")
		} else if !d.D.Redelivered {
			problems = append(problems, "held "+m.Env.MessageID+" redelivered without the redelivered flag")
		}
	}
	for _, m := range acked {
		if _, ok := redelivered[m.Env.MessageID]; ok {
			problems = append(problems, "acknowledged "+m.Env.MessageID+" delivered again")
		}
	}
	switch {
	case len(held) == 0:
		r.fail(ConRedelivery, "no message was held unacknowledged at the disconnect (the stream was too short)")
	case len(problems) > 0:
		r.fail(ConRedelivery, "%s", strings.Join(problems, "; "))
	default:
		r.pass(ConRedelivery, "%d acknowledged before the disconnect, not redelivered; %d held unacknowledged, all redelivered with redelivered=true", len(acked), len(held))
	}

	// The stream as a caller processed it: what the kit acknowledged on
	// the first connection (held messages were never processed), then
	// everything after the reconnect, deduplicated by message_id.
	processed := append(acked, after...)
	evs := events(processed, sid)
	w, werr := CheckTransitions(evs)
	switch err := CheckConsecutive(evs); {
	case err != nil:
		r.fail(ConNoGap, "session %s: %v", sid, err)
	case !w.Closed:
		r.fail(ConNoGap, "session %s did not close (%v)", sid, werr)
	default:
		r.pass(ConNoGap, "session %s: %d deliveries, %d distinct events, sequences %s without gap or repeat, closed %s",
			sid, len(msgs), len(evs), seqRange(evs), w.FinalState)
	}
}

// nFreshOf counts the messages of a session that arrived after
// connection gen1 and were not seen on it.
func nFreshOf(msgs []*Message, sid string, gen1 int, seenBefore map[string]bool) int {
	n := 0
	for _, m := range ofSession(msgs, sid) {
		if m.Gen > gen1 && !seenBefore[m.Env.MessageID] {
			n++
		}
	}
	return n
}

// seqRange renders the sequences of a stream as "first..last".
func seqRange(evs []Event) string {
	if len(evs) == 0 {
		return "(none)"
	}
	return fmt.Sprintf("%d..%d", evs[0].Sequence, evs[len(evs)-1].Sequence)
}
