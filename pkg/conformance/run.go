package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// recorder collects the results by check id. A failure sticks: a later
// pass does not hide it.
type recorder struct {
	res map[string]Row
}

func newRecorder() *recorder { return &recorder{res: map[string]Row{}} }

func (r *recorder) set(id string, res Result, format string, args ...any) {
	if old, ok := r.res[id]; ok && old.Result == Fail {
		return
	}
	r.res[id] = Row{Result: res, Detail: fmt.Sprintf(format, args...)}
}

func (r *recorder) pass(id, format string, args ...any) { r.set(id, Pass, format, args...) }
func (r *recorder) fail(id, format string, args ...any) { r.set(id, Fail, format, args...) }
func (r *recorder) skip(id, format string, args ...any) { r.set(id, Skip, format, args...) }

// failRest fails every check without a result yet.
func (r *recorder) failRest(format string, args ...any) {
	for _, c := range checks {
		if _, ok := r.res[c.ID]; !ok {
			r.fail(c.ID, format, args...)
		}
	}
}

func (r *recorder) report() Report {
	rep := Report{Rows: make([]Row, 0, len(checks))}
	for _, c := range checks {
		row, ok := r.res[c.ID]
		if !ok {
			row = Row{Result: Fail, Detail: "not evaluated"}
		}
		row.ID, row.Ref, row.Statement = c.ID, c.Ref, c.Statement
		rep.Rows = append(rep.Rows, row)
	}
	return rep
}

// Run checks the callee cfg names, as the caller cfg.AMQPURL
// authenticates, and returns one row per check (Checks order). It does
// not return early on a failure: a check that cannot run fails with the
// reason. Bad configuration fails every check (Config.Validate tells
// beforehand).
func Run(ctx context.Context, cfg Config) Report {
	r := newRecorder()
	rc, err := cfg.resolve()
	if err != nil {
		r.failRest("invalid configuration: %v", err)
		return r.report()
	}
	k := newKit(rc)
	if err := k.connect(); err != nil {
		r.failRest("not run: %v", err)
		return r.report()
	}
	defer k.disconnect()
	s := &run{k: k, r: r}
	for _, step := range []struct {
		name string
		f    func(context.Context)
	}{
		{"topology", s.topology},
		{"management API", s.management},
		{"rejections", s.rejections},
		{"a task, republished", s.completeAndDuplicate},
		{"malformed commands", s.malformed},
		{"abort", s.abort},
		{"caller reconnect", s.continuity},
	} {
		if ctx.Err() != nil {
			break
		}
		if err := k.ensure(); err != nil {
			k.logf("%s: reconnect failed: %v", step.name, err)
		}
		k.logf("%s", step.name)
		start := time.Now()
		step.f(ctx)
		k.logf("%s: done in %s", step.name, time.Since(start).Round(time.Millisecond))
	}
	// Let the last acknowledgements and returns land.
	k.disconnect()
	s.messages()
	s.sessions()
	if ctx.Err() != nil {
		r.failRest("not run: %v", ctx.Err())
	}
	return r.report()
}

// run is one run's state shared by the steps.
type run struct {
	k *kit
	r *recorder
	// started are the sessions the kit's tasks opened, in order.
	started []string
}

func (s *run) topology(context.Context) {
	k, r, cfg := s.k, s.r, s.k.cfg
	for _, x := range []struct{ id, name, kind string }{
		{TopCommandsExchange, topology.CommandsExchange, topology.CommandsExchangeType},
		{TopEventsExchange, topology.EventsExchange, topology.EventsExchangeType},
	} {
		err := k.passive(func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(x.name, x.kind, true, false, false, false, nil)
		})
		if err != nil {
			r.fail(x.id, "passive declare of %s in vhost %q: %v", x.name, cfg.Vhost, err)
		} else {
			r.pass(x.id, "%s exists in vhost %q", x.name, cfg.Vhost)
		}
	}
	var q amqp.Queue
	err := k.passive(func(ch *amqp.Channel) (err error) {
		q, err = ch.QueueDeclarePassive(cfg.cmdQueue, true, false, false, false, nil)
		return err
	})
	switch {
	case err != nil:
		r.fail(TopCommandQueue, "passive declare of %s: %v", cfg.cmdQueue, err)
	case q.Consumers < 1:
		r.fail(TopCommandQueue, "%s exists but has no consumer: the callee is not consuming it", cfg.cmdQueue)
	default:
		r.pass(TopCommandQueue, "%s exists, %d consumer(s), %d message(s) ready", cfg.cmdQueue, q.Consumers, q.Messages)
	}
	err = k.passive(func(ch *amqp.Channel) (err error) {
		q, err = ch.QueueDeclarePassive(cfg.evtQueue, true, false, false, false, nil)
		return err
	})
	if err != nil {
		r.fail(TopEventQueue, "passive declare of %s: %v", cfg.evtQueue, err)
	} else {
		r.pass(TopEventQueue, "%s exists (the kit consumes it)", cfg.evtQueue)
	}
}

// answer waits for the n-th answer to a task and returns the answers.
func (s *run) answer(ctx context.Context, p amqp.Publishing, n int) ([]*Message, error) {
	err := s.k.wait(ctx, fmt.Sprintf("answer %d to task_submit %s", n, p.MessageId), func(msgs []*Message) bool {
		return len(answers(msgs, p.MessageId)) >= n
	})
	return answers(s.k.snapshot(), p.MessageId), err
}

// accepted decodes an answer that must be task_accepted.
func accepted(m *Message) (task.TaskAccepted, error) {
	var a task.TaskAccepted
	if m.Env.Type != envelope.TypeTaskAccepted {
		var rj task.TaskRejected
		_ = json.Unmarshal(m.Env.Payload, &rj)
		return a, fmt.Errorf("answered %s (%s: %s)", m.Env.Type, rj.ReasonCode, rj.Message)
	}
	if err := json.Unmarshal(m.Env.Payload, &a); err != nil {
		return a, err
	}
	return a, a.Validate()
}

// start submits a task and waits until it is accepted.
func (s *run) start(ctx context.Context, p amqp.Publishing) (task.TaskAccepted, error) {
	if err := s.k.publish(ctx, p); err != nil {
		return task.TaskAccepted{}, err
	}
	ans, err := s.answer(ctx, p, 1)
	if err != nil {
		return task.TaskAccepted{}, err
	}
	a, err := accepted(ans[0])
	if err == nil {
		s.started = append(s.started, a.SessionID)
	}
	return a, err
}

// waitClosed waits for a session's session_closed.
func (s *run) waitClosed(ctx context.Context, sid string) error {
	return s.k.wait(ctx, "session_closed of "+sid, func(msgs []*Message) bool { return closed(msgs, sid) })
}

func (s *run) rejections(ctx context.Context) {
	k, r, cfg := s.k, s.r, s.k.cfg
	unknown, err := k.submit(ctx, cfg.UnknownCapability, json.RawMessage(`{}`), "hcp-conformance: a capability the callee does not offer")
	if err != nil {
		r.fail(RejUnknown, "%v", err)
	}
	impostor := "hcp-conformance-impostor"
	if impostor == cfg.CallerID {
		impostor += "-2"
	}
	claim, err := k.newSubmit(cfg.Capability, cfg.Inputs, "hcp-conformance: caller_id names another caller", impostor)
	if err == nil {
		err = k.publish(ctx, claim)
	}
	if err != nil {
		r.fail(RejIdentity, "%v", err)
	}
	if unknown.MessageId != "" {
		s.checkRejected(ctx, RejUnknown, unknown, "capability "+cfg.UnknownCapability)
	}
	if claim.MessageId != "" {
		s.checkRejected(ctx, RejIdentity, claim, fmt.Sprintf("caller_id %q sent by %q", impostor, cfg.username))
	}
}

func (s *run) checkRejected(ctx context.Context, id string, p amqp.Publishing, what string) {
	ans, err := s.answer(ctx, p, 1)
	if err != nil {
		s.r.fail(id, "%s: no answer on %s: %v", what, s.k.cfg.evtQueue, err)
		return
	}
	m := ans[0]
	if m.Env.Type != envelope.TypeTaskRejected {
		if a, err := accepted(m); err == nil {
			s.started = append(s.started, a.SessionID)
		}
		s.r.fail(id, "%s: answered %s, want task_rejected", what, m.Env.Type)
		return
	}
	var rj task.TaskRejected
	if err := json.Unmarshal(m.Env.Payload, &rj); err != nil {
		s.r.fail(id, "%s: task_rejected payload: %v", what, err)
		return
	}
	if err := rj.Validate(); err != nil {
		s.r.fail(id, "%s: task_rejected: %v", what, err)
		return
	}
	s.r.pass(id, "%s: task_rejected %s (%q) on %s with routing key %s", what, rj.ReasonCode, rj.Message, s.k.cfg.evtQueue, m.D.RoutingKey)
}

// completeAndDuplicate: a task accepted, republished with the same
// message_id, run to its end once.
func (s *run) completeAndDuplicate(ctx context.Context) {
	k, r, cfg := s.k, s.r, s.k.cfg
	p, err := k.newSubmit(cfg.Capability, cfg.Inputs, "hcp-conformance: a task that completes, submitted twice", "")
	if err != nil {
		r.fail(SesAccepted, "%v", err)
		return
	}
	start := time.Now()
	a, err := s.start(ctx, p)
	if err != nil {
		r.fail(SesAccepted, "task_submit %s (%s): %v", p.MessageId, cfg.Capability, err)
		r.fail(DupAnswer, "not run: the task was not accepted")
		r.fail(DupOnce, "not run: the task was not accepted")
		return
	}
	r.pass(SesAccepted, "task_submit %s accepted in %s: session %s, risk %s", p.MessageId, time.Since(start).Round(time.Millisecond), a.SessionID, a.RiskLevel)

	// The same message again, byte for byte, as a caller's retry.
	if err := k.publish(ctx, p); err != nil {
		r.fail(DupAnswer, "republish: %v", err)
	} else if ans, err := s.answer(ctx, p, 2); err != nil {
		r.fail(DupAnswer, "the republished task_submit was not answered: %v", err)
	} else if a2, err := accepted(ans[1]); err != nil {
		r.fail(DupAnswer, "the republished task_submit: %v", err)
	} else if a2.SessionID != a.SessionID || a2.SessionToken != a.SessionToken || a2.RiskLevel != a.RiskLevel {
		r.fail(DupAnswer, "the republished task_submit got session %s risk %s (token equal: %t), the original session %s risk %s",
			a2.SessionID, a2.RiskLevel, a2.SessionToken == a.SessionToken, a.SessionID, a.RiskLevel)
	} else {
		r.pass(DupAnswer, "republished %s: task_accepted again with session %s, the same token and risk %s", p.MessageId, a2.SessionID, a2.RiskLevel)
	}

	if err := s.waitClosed(ctx, a.SessionID); err != nil {
		r.fail(DupOnce, "%v", err)
		return
	}
	// A second execution would show as more events; give it a moment.
	time.Sleep(time.Second)
	msgs := k.snapshot()
	evs := events(msgs, a.SessionID)
	created := 0
	for _, ev := range evs {
		if ev.Type == session.EventSessionCreated {
			created++
		}
	}
	nAns := len(answers(msgs, p.MessageId))
	switch err := CheckSequence(evs); {
	case created != 1:
		r.fail(DupOnce, "session %s: %d session_created events", a.SessionID, created)
	case err != nil:
		r.fail(DupOnce, "session %s: %v", a.SessionID, err)
	case nAns != 2:
		r.fail(DupOnce, "%d answers to 2 publishes of task_submit %s", nAns, p.MessageId)
	default:
		r.pass(DupOnce, "session %s ran once: one session_created, %d events, 2 answers to 2 publishes", a.SessionID, len(evs))
	}
}

// malformed publishes commands the callee must survive, then a valid task.
func (s *run) malformed(ctx context.Context) {
	k, r, cfg := s.k, s.r, s.k.cfg
	now := time.Now().UTC().Format(envelope.TimestampLayout)
	sid := envelope.NewMessageID()
	mk := func(name string, body string, edit func(*amqp.Publishing)) struct {
		name string
		p    amqp.Publishing
	} {
		p := amqp.Publishing{
			ContentType: envelope.ContentType, ContentEncoding: envelope.ContentEncoding, DeliveryMode: amqp.Persistent,
			MessageId: envelope.NewMessageID(), Type: string(envelope.TypeTaskSubmit), UserId: cfg.username, Body: []byte(body),
		}
		if edit != nil {
			edit(&p)
		}
		return struct {
			name string
			p    amqp.Publishing
		}{name, p}
	}
	submit := func(id, sessionJSON, version, payload string) string {
		return fmt.Sprintf(`{"hcp_version":%q,"message_id":%q,"timestamp":%q,"session_id":%s,"type":"task_submit","payload":%s}`, version, id, now, sessionJSON, payload)
	}
	validPayload, _ := json.Marshal(task.TaskSubmit{CallerID: cfg.CallerID, CalleeID: cfg.CalleeID, Capability: cfg.Capability,
		Intent: "hcp-conformance: must never run", Inputs: cfg.Inputs,
		Constraints: task.Constraints{DataClassification: task.DataClass(cfg.DataClassification)}})
	cases := make([]struct {
		name string
		p    amqp.Publishing
	}, 0, 11)
	cases = append(cases,
		mk("binary garbage", "\x00\xff\xfe not json", nil),
		mk("empty body", "", nil),
		mk("JSON that is no envelope", `{"hello":"world"}`, nil),
		mk("JSON array", `[1,2,3]`, nil),
		mk("text/plain content", "task_submit please", func(p *amqp.Publishing) { p.ContentType = "text/plain" }),
	)
	const null = "null"
	for _, c := range []struct{ name, version, session, payload string }{
		{"unsupported hcp_version 9.0", "9.0", null, string(validPayload)},
		{"task_submit with a session_id", envelope.Version, fmt.Sprintf("%q", sid), string(validPayload)},
		{"payload not an object", envelope.Version, null, `[]`},
		{"task_submit payload missing its fields", envelope.Version, null, `{"intent":"no capability"}`},
	} {
		id := envelope.NewMessageID()
		cases = append(cases, mk(c.name, submit(id, c.session, c.version, c.payload), func(p *amqp.Publishing) { p.MessageId = id }))
	}
	abortID := envelope.NewMessageID()
	cases = append(cases,
		mk("abort of an unknown session with a bogus token",
			fmt.Sprintf(`{"hcp_version":"1.0","message_id":%q,"timestamp":%q,"session_id":%q,"type":"abort","payload":{"session_token":"a.b.c"}}`, abortID, now, sid),
			func(p *amqp.Publishing) {
				p.MessageId, p.Type, p.CorrelationId = abortID, string(envelope.TypeAbort), sid
			}))
	anonID := envelope.NewMessageID()
	cases = append(cases, mk("a valid task_submit without user_id (unauthenticated)", submit(anonID, null, envelope.Version, string(validPayload)),
		func(p *amqp.Publishing) { p.MessageId, p.UserId = anonID, "" }))

	var names []string
	for _, c := range cases {
		if err := k.publish(ctx, c.p); err != nil {
			r.fail(MalSurvives, "publishing %s: %v", c.name, err)
			return
		}
		names = append(names, c.name)
	}
	p, err := k.newSubmit(cfg.Capability, cfg.Inputs, "hcp-conformance: a valid task after malformed commands", "")
	if err != nil {
		r.fail(MalSurvives, "%v", err)
		return
	}
	start := time.Now()
	a, err := s.start(ctx, p)
	if err != nil {
		r.fail(MalSurvives, "after %d malformed commands (%s), the valid task_submit %s: %v", len(cases), strings.Join(names, "; "), p.MessageId, err)
		return
	}
	took := time.Since(start).Round(time.Millisecond)
	if err := s.waitClosed(ctx, a.SessionID); err != nil {
		r.fail(MalSurvives, "the valid task after the malformed commands never closed: %v", err)
		return
	}
	msgs := k.snapshot()
	var rejected []string
	for _, c := range cases {
		for _, m := range answers(msgs, c.p.MessageId) {
			if m.Env.Type == envelope.TypeTaskAccepted {
				s.started = append(s.started, m.Env.Session())
				r.fail(MalSurvives, "%s was accepted (message %s)", c.name, c.p.MessageId)
				return
			}
			var rj task.TaskRejected
			_ = json.Unmarshal(m.Env.Payload, &rj)
			rejected = append(rejected, string(rj.ReasonCode))
		}
	}
	r.pass(MalSurvives, "%d malformed commands published (%s); %d answered task_rejected %v, none accepted; then a valid task accepted in %s and closed",
		len(cases), strings.Join(names, "; "), len(rejected), rejected, took)
}

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
	switch err := CheckSequence(evs); {
	case err != nil:
		r.fail(ConNoGap, "session %s: %v", sid, err)
	case !w.Closed:
		r.fail(ConNoGap, "session %s did not close (%v)", sid, werr)
	default:
		r.pass(ConNoGap, "session %s: %d deliveries, %d distinct events, sequences 1..%d without gap or repeat, closed %s",
			sid, len(msgs), len(evs), len(evs), w.FinalState)
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

// messages evaluates the per-message checks over everything received,
// and the routing of the kit's commands.
func (s *run) messages() {
	k, r := s.k, s.r
	msgs := k.snapshot()
	ids := []string{MsgEnvelope, MsgSessionID, MsgContentType, MsgContentEncoding, MsgDeliveryMode, MsgMessageID, MsgMirrored, MsgUserID, MsgRoutingKey, MsgPayload}
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
		for _, id := range []string{SesSequence, SesTransitions, SesClosed} {
			r.fail(id, "no session was opened")
		}
		return
	}
	var seqBad, trBad, clBad []string
	total := 0
	finals := map[session.State]int{}
	for _, sid := range uniq(s.started) {
		evs := events(msgs, sid)
		total += len(evs)
		if err := CheckSequence(evs); err != nil {
			seqBad = append(seqBad, sid+": "+err.Error())
		} else if len(evs) == 0 {
			seqBad = append(seqBad, sid+": no events")
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
		r.pass(SesSequence, "%d sessions, %d events, each session 1..n", n, total)
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
