package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Message is one delivery the kit received on its event queue.
type Message struct {
	D   amqp.Delivery
	Env *envelope.Envelope
	V   Violations
	// Gen is the connection it arrived on (1, 2, ...).
	Gen int
	// Acked: the kit acknowledged it; false while (or because) it held it.
	Acked bool
}

// taskMessageID returns the task_message_id of a task_accepted or
// task_rejected, else "".
func (m *Message) taskMessageID() string {
	if m.Env == nil || (m.Env.Type != envelope.TypeTaskAccepted && m.Env.Type != envelope.TypeTaskRejected) {
		return ""
	}
	var p struct {
		TaskMessageID string `json:"task_message_id"`
	}
	_ = json.Unmarshal(m.Env.Payload, &p)
	return p.TaskMessageID
}

// holdRule keeps deliveries of one task's session unacknowledged after
// the first keep of them, for the continuity check.
type holdRule struct {
	task    string
	session string
	keep    int
	seen    int
}

func (h *holdRule) hold(m *Message) bool {
	if h == nil || m.Env == nil {
		return false
	}
	if h.session == "" {
		if m.Env.Type == envelope.TypeTaskAccepted && strings.EqualFold(m.taskMessageID(), h.task) {
			var p task.TaskAccepted
			if json.Unmarshal(m.Env.Payload, &p) == nil {
				h.session = p.SessionID
			}
		}
		return false
	}
	if !strings.EqualFold(m.Env.Session(), h.session) {
		return false
	}
	h.seen++
	return h.seen > h.keep
}

// kit is the caller side the checks drive: one AMQP connection with a
// publishing channel (confirms, mandatory publishes) and a consumer on the
// caller's event queue (manual ack, prefetch 10) that records every
// delivery.
type kit struct {
	cfg *resolved

	mu       sync.Mutex
	conn     *amqp.Connection
	pub      *amqp.Channel
	gen      int
	msgs     []*Message
	changed  chan struct{}
	hold     *holdRule
	returned map[string]string // message_id → reply text of a basic.return
	nReturns int
	nPublish int
	consumer sync.WaitGroup
}

func newKit(cfg *resolved) *kit {
	return &kit{cfg: cfg, changed: make(chan struct{}), returned: map[string]string{}}
}

func (k *kit) logf(format string, args ...any) {
	if k.cfg.Log != nil {
		_, _ = fmt.Fprintf(k.cfg.Log, "hcp-conformance: "+format+"\n", args...)
	}
}

// connect opens a new connection (the next generation) and starts
// consuming.
func (k *kit) connect() error {
	conn, pub, err := dialWithConfirms(k.cfg.uri, k.cfg.username, "hcp-conformance "+k.cfg.CallerID)
	if err != nil {
		return err
	}
	fail := func(what string, err error) error {
		_ = conn.Close()
		return fmt.Errorf("%s: %w", what, err)
	}
	returns := pub.NotifyReturn(make(chan amqp.Return, 64))
	go func() {
		for r := range returns {
			k.mu.Lock()
			k.nReturns++
			k.returned[r.MessageId] = fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
			k.mu.Unlock()
		}
	}()
	cons, err := conn.Channel()
	if err != nil {
		return fail("open the consuming channel", err)
	}
	if err := cons.Qos(10, 0, false); err != nil {
		return fail("basic.qos", err)
	}
	deliveries, err := cons.Consume(k.cfg.evtQueue, "hcp-conformance", false, false, false, false, nil)
	if err != nil {
		return fail("consume "+k.cfg.evtQueue, err)
	}
	k.mu.Lock()
	k.conn, k.pub = conn, pub
	k.gen++
	gen := k.gen
	k.mu.Unlock()
	k.consumer.Add(1)
	go k.dispatch(gen, deliveries)
	return nil
}

// dispatch records each delivery, checks it, and acknowledges it unless
// the hold rule keeps it.
func (k *kit) dispatch(gen int, deliveries <-chan amqp.Delivery) {
	defer k.consumer.Done()
	for d := range deliveries {
		env, v := CheckMessage(d, Expect{CallerID: k.cfg.CallerID, CalleeUser: k.cfg.CalleeUser})
		m := &Message{D: d, Env: env, V: v, Gen: gen}
		k.mu.Lock()
		if !k.hold.hold(m) {
			m.Acked = d.Ack(false) == nil
		}
		k.msgs = append(k.msgs, m)
		close(k.changed)
		k.changed = make(chan struct{})
		k.mu.Unlock()
	}
}

// disconnect closes the connection: the broker requeues what the kit has
// not acknowledged.
func (k *kit) disconnect() {
	k.mu.Lock()
	conn := k.conn
	k.conn, k.pub = nil, nil
	k.mu.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
	k.consumer.Wait()
}

// ensure reconnects when the connection was lost.
func (k *kit) ensure() error {
	k.mu.Lock()
	ok := k.conn != nil && !k.conn.IsClosed()
	k.mu.Unlock()
	if ok {
		return nil
	}
	k.disconnect()
	return k.connect()
}

// passive runs f on a channel of its own: a failed passive declare closes
// the channel.
func (k *kit) passive(f func(ch *amqp.Channel) error) error {
	k.mu.Lock()
	conn := k.conn
	k.mu.Unlock()
	if conn == nil {
		return errors.New("not connected")
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	return f(ch)
}

// publish sends a command to the callee (mandatory, confirmed).
func (k *kit) publish(ctx context.Context, p amqp.Publishing) error {
	k.mu.Lock()
	ch := k.pub
	k.nPublish++
	k.mu.Unlock()
	if ch == nil {
		return errors.New("not connected")
	}
	ctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, topology.CommandsExchange, k.cfg.commandKey, true, false, p)
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("publish confirm: %w", err)
	}
	if !ok {
		return errors.New("the broker refused the publish (basic.nack)")
	}
	return nil
}

// newSubmit builds a task_submit from this caller (claimedCaller "" means
// the kit's own id).
func (k *kit) newSubmit(capability string, inputs json.RawMessage, intent, claimedCaller string) (amqp.Publishing, error) {
	if claimedCaller == "" {
		claimedCaller = k.cfg.CallerID
	}
	ts := task.TaskSubmit{
		CallerID: claimedCaller, CalleeID: k.cfg.CalleeID, Capability: capability,
		Intent: intent, Inputs: inputs,
		Constraints: task.Constraints{DataClassification: task.DataClass(k.cfg.DataClassification)},
	}
	env, err := envelope.New(envelope.TypeTaskSubmit, "", ts)
	if err != nil {
		return amqp.Publishing{}, err
	}
	return envelope.EncodePublishing(env, k.cfg.username)
}

// submit publishes a task_submit and returns it.
func (k *kit) submit(ctx context.Context, capability string, inputs json.RawMessage, intent string) (amqp.Publishing, error) {
	p, err := k.newSubmit(capability, inputs, intent, "")
	if err != nil {
		return p, err
	}
	return p, k.publish(ctx, p)
}

// abort publishes an abort for a session with its token.
func (k *kit) abort(ctx context.Context, sessionID, token string) error {
	env, err := envelope.New(envelope.TypeAbort, sessionID, task.Abort{SessionToken: token, Reason: "hcp-conformance abort check"})
	if err != nil {
		return err
	}
	p, err := envelope.EncodePublishing(env, k.cfg.username)
	if err != nil {
		return err
	}
	return k.publish(ctx, p)
}

// snapshot returns the messages so far.
func (k *kit) snapshot() []*Message {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*Message(nil), k.msgs...)
}

// wait waits until cond holds over the messages received so far, for at
// most the configured timeout.
func (k *kit) wait(ctx context.Context, what string, cond func([]*Message) bool) error {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	for {
		k.mu.Lock()
		msgs := append([]*Message(nil), k.msgs...)
		ch := k.changed
		k.mu.Unlock()
		if cond(msgs) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("timed out after %s waiting for %s", k.cfg.Timeout, what)
		}
	}
}

// answers are the task_accepted/task_rejected messages for a task, in
// arrival order.
func answers(msgs []*Message, taskMessageID string) []*Message {
	var out []*Message
	for _, m := range msgs {
		if id := m.taskMessageID(); id != "" && strings.EqualFold(id, taskMessageID) {
			out = append(out, m)
		}
	}
	return out
}

// ofSession are the messages of one session, in arrival order.
func ofSession(msgs []*Message, sessionID string) []*Message {
	var out []*Message
	for _, m := range msgs {
		if m.Env != nil && m.Env.Type != envelope.TypeTaskAccepted && m.Env.Type != envelope.TypeTaskRejected &&
			strings.EqualFold(m.Env.Session(), sessionID) {
			out = append(out, m)
		}
	}
	return out
}

// events returns a session's events deduplicated by message_id, in
// arrival order.
func events(msgs []*Message, sessionID string) []Event {
	seen := map[string]bool{}
	var out []Event
	for _, m := range ofSession(msgs, sessionID) {
		if m.Env.Type != envelope.TypeEvent || seen[strings.ToLower(m.Env.MessageID)] {
			continue
		}
		seen[strings.ToLower(m.Env.MessageID)] = true
		if ev, err := EventOf(m.Env); err == nil {
			out = append(out, ev)
		}
	}
	return out
}

// closed reports whether a session_closed arrived for the session.
func closed(msgs []*Message, sessionID string) bool {
	for _, ev := range events(msgs, sessionID) {
		if ev.Type == "session_closed" {
			return true
		}
	}
	return false
}

// dialWithConfirms connects as username, naming the connection name, and
// opens a publishing channel in confirm mode: how both kits start a
// connection generation.
func dialWithConfirms(uri amqp.URI, username, name string) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.DialConfig(uri.String(), amqp.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Properties: amqp.Table{"connection_name": name},
		Dial:       amqp.DefaultDial(15 * time.Second),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s as %q: %w", uri.Host, username, err)
	}
	pub, err := conn.Channel()
	if err == nil {
		if err = pub.Confirm(false); err != nil {
			err = fmt.Errorf("enable publisher confirms: %w", err)
		}
	} else {
		err = fmt.Errorf("open the publishing channel: %w", err)
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, pub, nil
}
