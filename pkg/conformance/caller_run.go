package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// RunCaller checks the caller cfg names: the kit plays the callee
// cfg.CalleeID (as the callee user cfg.AMQPURL authenticates), makes the
// caller submit and abort tasks through cfg.Driver, answers and streams
// events as a callee would, with an event published out of order and
// another twice, closes the caller's connection mid-stream, and checks
// every command it gets and what the caller processed. One row per check
// of the profile, in CallerChecks order; it does not stop at a failure.
func RunCaller(ctx context.Context, cfg CallerConfig) Report {
	started := time.Now()
	s := &crun{}
	rep := s.run(ctx, cfg)
	rep.Kit, rep.Peer, rep.Self, rep.Broker = "caller", cfg.CallerID, cfg.CalleeID, s.broker
	rep.Started, rep.Duration = started.UTC(), time.Since(started)
	return rep
}

// crun is one caller-kit run's state shared by the steps.
type crun struct {
	k      *ckit
	r      *recorder
	d      CallerDriver
	broker BrokerInfo
}

func (s *crun) run(ctx context.Context, cfg CallerConfig) Report {
	rc, err := cfg.resolve()
	r := newRecorderFor(callerChecks, cfg.Profile)
	s.r = r
	if err != nil {
		r.failRest("invalid configuration: %v", err)
		return r.report()
	}
	r.profile = rc.Profile
	s.k, s.d = &ckit{cfg: rc}, rc.Driver
	if err := s.k.connect(); err != nil {
		r.failRest("not run: %v", err)
		return r.report()
	}
	defer s.k.close()
	for _, step := range []struct {
		name string
		f    func(context.Context)
	}{
		{"topology", s.topology},
		{"the caller's consumer", s.consumer},
		{"a task accepted, events reordered and duplicated", s.ordered},
		{"a task rejected", s.rejected},
		{"a task left unanswered", s.unanswered},
		{"abort", s.abort},
		{"the caller's connection closed mid-stream", s.reconnect},
		{"the caller's queue drained", s.drained},
		{"broker message size", s.messageSize},
	} {
		if ctx.Err() != nil {
			break
		}
		s.k.logf("%s", step.name)
		start := time.Now()
		step.f(ctx)
		s.k.logf("%s: done in %s", step.name, time.Since(start).Round(time.Millisecond))
	}
	s.k.close()
	s.commandChecks()
	if ctx.Err() != nil {
		r.failRest("not run: %v", ctx.Err())
	}
	return r.report()
}

func (s *crun) topology(context.Context) {
	k, r, cfg := s.k, s.r, s.k.cfg
	passive := func(f func(ch *amqp.Channel) error) error {
		k.mu.Lock()
		conn := k.conn
		k.mu.Unlock()
		if conn == nil {
			return fmt.Errorf("not connected")
		}
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		return f(ch)
	}
	for _, x := range []struct{ id, name, kind string }{
		{TopCommandsExchange, topology.CommandsExchange, topology.CommandsExchangeType},
		{TopEventsExchange, topology.EventsExchange, topology.EventsExchangeType},
	} {
		if err := passive(func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(x.name, x.kind, true, false, false, false, nil)
		}); err != nil {
			r.fail(x.id, "passive declare of %s in vhost %q: %v", x.name, cfg.Vhost, err)
		} else {
			r.pass(x.id, "%s exists in vhost %q", x.name, cfg.Vhost)
		}
	}
	var q amqp.Queue
	err := passive(func(ch *amqp.Channel) (err error) {
		q, err = ch.QueueDeclarePassive(cfg.evtQueue, true, false, false, false, nil)
		return err
	})
	switch {
	case err != nil:
		r.fail(CTopEventQueue, "passive declare of %s: %v", cfg.evtQueue, err)
	case q.Consumers < 1:
		r.fail(CTopEventQueue, "%s exists but has no consumer: the caller is not consuming it", cfg.evtQueue)
	default:
		r.pass(CTopEventQueue, "%s exists, %d consumer(s)", cfg.evtQueue, q.Consumers)
	}
}

// submit makes the caller submit a task for scenario and waits for its
// task_submit.
func (s *crun) submit(ctx context.Context, scenario string) (*Command, error) {
	nonce := envelope.NewMessageID()[:8]
	intent := "hcp-conformance " + scenario + " " + nonce
	inputs, _ := json.Marshal(map[string]string{"scenario": scenario})
	if err := s.d.Submit(ctx, DriverTask{CalleeID: s.k.cfg.CalleeID, Capability: s.k.cfg.Capability, Intent: intent,
		Inputs: inputs, DataClassification: s.k.cfg.DataClassification}); err != nil {
		s.r.fail(SubPublished, "the driver could not make the caller submit (%s): %v", scenario, err)
		return nil, fmt.Errorf("submit: %w", err)
	}
	c, err := s.k.waitCommand(ctx, "the task_submit of the "+scenario+" task", func(cmds []*Command) *Command {
		for _, c := range cmds {
			if c.Env != nil && c.Env.Type == envelope.TypeTaskSubmit && strings.Contains(intentOf(c.Env), nonce) {
				return c
			}
		}
		return nil
	})
	if err != nil {
		s.r.fail(SubPublished, "%s: the caller was asked to submit a task to %s: %v", scenario, s.k.cfg.CalleeID, err)
		return nil, err
	}
	s.r.pass(SubPublished, "each task the caller was asked to submit arrived as a task_submit on %s (the last: %s)", s.k.cfg.cmdQueue, c.Env.MessageID)
	return c, nil
}

func intentOf(env *envelope.Envelope) string {
	var p struct {
		Intent string `json:"intent"`
	}
	_ = json.Unmarshal(env.Payload, &p)
	return p.Intent
}

// accept answers a task_submit with task_accepted; the session id is
// derived as this project's callee derives it (any UUID v4 would do).
func (s *crun) accept(ctx context.Context, c *Command) (sid, token string, err error) {
	sid = s.sessionID(c)
	token = fakeToken(sid)
	err = s.k.send(ctx, sid, envelope.TypeTaskAccepted, task.TaskAccepted{TaskMessageID: c.Env.MessageID, SessionID: sid,
		SessionToken: token, RiskLevel: task.R1, ExpiresAt: task.NewTimestamp(time.Now().Add(time.Hour))})
	return sid, token, err
}

// sessionID is the session id the kit gives a task: derived as this
// project's callee derives it (topology.SessionID), which a caller of this
// project predicts; any UUID v4 is valid by L2:14.
func (s *crun) sessionID(c *Command) string {
	return topology.SessionID(s.k.cfg.CalleeID, s.k.cfg.CallerID, c.Env.MessageID)
}

// events publishes a session's events by sequence, in the order given.
func (s *crun) events(ctx context.Context, sid string, evs map[int64]session.EventData, order ...int64) error {
	for _, seq := range order {
		key, p, err := s.k.event(sid, seq, evs[seq])
		if err == nil {
			err = s.k.publish(ctx, key, p)
		}
		if err != nil {
			return fmt.Errorf("event %d: %w", seq, err)
		}
	}
	return nil
}

// waitProcessed waits until cond holds over what the caller processed.
func (s *crun) waitProcessed(ctx context.Context, what string, cond func([]Processed) bool) error {
	deadline := time.Now().Add(s.k.cfg.Timeout)
	for {
		if cond(s.d.Processed()) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for the caller to process %s", s.k.cfg.Timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *crun) messageSize(ctx context.Context) {
	s.k.mu.Lock()
	conn := s.k.conn
	s.k.mu.Unlock()
	info, res, detail := probeMessageSize(ctx, conn, topology.EventsExchange, s.k.cfg.MaxMessageSize, s.k.cfg.Timeout)
	s.broker = info
	s.r.set(BrkMessageSize, res, "%s", detail)
}
