package conformance

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Run checks the callee cfg names, as the caller cfg.AMQPURL
// authenticates, and returns one row per check (Checks order). It does
// not return early on a failure: a check that cannot run fails with the
// reason. Bad configuration fails every check (Config.Validate tells
// beforehand).
func Run(ctx context.Context, cfg Config) Report {
	started := time.Now()
	s := &run{}
	rep := s.run(ctx, cfg)
	rep.Kit, rep.Peer, rep.Self, rep.Broker = "callee", cfg.CalleeID, cfg.CallerID, s.broker
	rep.Started, rep.Duration = started.UTC(), time.Since(started)
	return rep
}

func (s *run) run(ctx context.Context, cfg Config) Report {
	rc, err := cfg.resolve()
	r := newRecorderFor(calleeChecks, cfg.Profile)
	s.r = r
	if err != nil {
		r.failRest("invalid configuration: %v", err)
		return r.report()
	}
	r.profile = rc.Profile
	k := newKit(rc)
	s.k = k
	if err := k.connect(); err != nil {
		r.failRest("not run: %v", err)
		return r.report()
	}
	defer k.disconnect()
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
		{"broker message size", s.messageSize},
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

// messageSize is BRK-1: the broker's max_message_size against the
// documented limit.
func (s *run) messageSize(ctx context.Context) {
	s.k.mu.Lock()
	conn := s.k.conn
	s.k.mu.Unlock()
	info, res, detail := probeMessageSize(ctx, conn, topology.CommandsExchange, s.k.cfg.MaxMessageSize, s.k.cfg.Timeout)
	s.broker = info
	s.r.set(BrkMessageSize, res, "%s", detail)
}

// run is one run's state shared by the steps.
type run struct {
	k      *kit
	r      *recorder
	broker BrokerInfo
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
