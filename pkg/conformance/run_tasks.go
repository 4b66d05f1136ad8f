package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	amqp "github.com/rabbitmq/amqp091-go"
)

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
	var claim amqp.Publishing
	if r.on(RejIdentity) {
		claim, err = k.newSubmit(cfg.Capability, cfg.Inputs, "hcp-conformance: caller_id names another caller", impostor)
		if err == nil {
			err = k.publish(ctx, claim)
		}
		if err != nil {
			r.fail(RejIdentity, "%v", err)
		}
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
	// The payload's schema (a reason code) is MSG-13's, of the
	// hcp-operator profile: the spec only says task_rejected.
	var rj task.TaskRejected
	_ = json.Unmarshal(m.Env.Payload, &rj)
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
		r.fail(DupToken, "not run: the task was not accepted")
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
	} else if !strings.EqualFold(a2.SessionID, a.SessionID) {
		r.fail(DupAnswer, "the republished task_submit got session %s, the original session %s", a2.SessionID, a.SessionID)
		r.fail(DupToken, "another session")
	} else {
		r.pass(DupAnswer, "republished %s: task_accepted again with session %s", p.MessageId, a2.SessionID)
		if a2.SessionToken != a.SessionToken || a2.RiskLevel != a.RiskLevel {
			r.fail(DupToken, "session %s: risk %s (token equal: %t), originally risk %s", a.SessionID, a2.RiskLevel, a2.SessionToken == a.SessionToken, a.RiskLevel)
		} else {
			r.pass(DupToken, "session %s: the same token and risk %s", a.SessionID, a2.RiskLevel)
		}
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
	switch err := CheckIncreasing(evs); {
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
	if r.on(MsgUserID) {
		// Identity by the AMQP user_id is this project's design (D§3).
		anonID := envelope.NewMessageID()
		cases = append(cases, mk("a valid task_submit without user_id (unauthenticated)", submit(anonID, null, envelope.Version, string(validPayload)),
			func(p *amqp.Publishing) { p.MessageId, p.UserId = anonID, "" }))
	}

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
