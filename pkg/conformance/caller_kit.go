package conformance

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Command is one delivery the caller kit received on its command queue.
type Command struct {
	D   amqp.Delivery
	Env *envelope.Envelope
	V   Violations
}

// CommandExpect is what every command must show beyond the fixed L1
// rules.
type CommandExpect struct {
	// CalleeID is the kit's callee id: the routing key.
	CalleeID string
	// CallerID is the caller under test (task_submit's caller_id,
	// profile hcp-operator).
	CallerID string
	// CallerUser is the caller's broker username; "" accepts any
	// non-empty user_id.
	CallerUser string
}

// CheckCommand checks one delivery from the kit's command queue against
// the per-command rules (the CMD-* checks but CMD-10, which needs all
// commands) and returns the envelope as SpecDecode reads it (nil when the
// body is no L1 envelope) with the violations of every profile. It never
// panics.
func CheckCommand(d amqp.Delivery, exp CommandExpect) (*envelope.Envelope, Violations) {
	v := Violations{}
	if d.ContentType != envelope.ContentType {
		v.add(CmdContentType, "content_type %q", d.ContentType)
	}
	if !strings.EqualFold(d.ContentEncoding, envelope.ContentEncoding) {
		v.add(CmdContentEncoding, "content_encoding %q", d.ContentEncoding)
	}
	if d.DeliveryMode != amqp.Persistent {
		v.add(CmdDeliveryMode, "delivery_mode %d", d.DeliveryMode)
	}
	if d.UserId == "" {
		v.add(CmdUserID, "no user_id")
	} else if exp.CallerUser != "" && d.UserId != exp.CallerUser {
		v.add(CmdUserID, "user_id %q, want %q", d.UserId, exp.CallerUser)
	}
	if d.MessageId == "" {
		v.add(CmdMessageID, "no message_id property")
	}
	if d.Exchange != topology.CommandsExchange || d.RoutingKey != exp.CalleeID {
		v.add(CmdRouting, "published to exchange %q with routing key %q, want %s with %q", d.Exchange, d.RoutingKey, topology.CommandsExchange, exp.CalleeID)
	}
	env, err := SpecDecode(d.Body)
	if err != nil {
		var se *SpecError
		if errors.As(err, &se) && se.Field == fieldSessionID {
			v.add(CmdSessionID, "%v", err)
		} else {
			v.add(CmdEnvelope, "%v", err)
		}
		return nil, v
	}
	if _, serr := envelope.Decode(d.Body); serr != nil {
		v.add(CmdStrictEnvelope, "%v", serr)
	}
	if !env.Type.IsCommand() {
		v.add(CmdTypes, "type %q on the command channel", env.Type)
	}
	if d.MessageId != "" && !strings.EqualFold(d.MessageId, env.MessageID) {
		v.add(CmdMessageID, "property %q, envelope %q", d.MessageId, env.MessageID)
	}
	if !strings.EqualFold(d.CorrelationId, env.Session()) {
		v.add(CmdMirrored, "correlation_id %q, envelope session_id %q", d.CorrelationId, env.Session())
	}
	if d.Type != string(env.Type) {
		v.add(CmdMirrored, "type property %q, envelope type %q", d.Type, env.Type)
	}
	switch env.Type {
	case envelope.TypeTaskSubmit:
		var ts task.TaskSubmit
		if err := json.Unmarshal(env.Payload, &ts); err != nil {
			v.add(CmdPayloadSchema, "task_submit %s: %v", env.MessageID, err)
		} else if err := ts.Validate(); err != nil {
			v.add(CmdPayloadSchema, "task_submit %s: %v", env.MessageID, err)
		} else if exp.CallerID != "" && ts.CallerID != exp.CallerID {
			v.add(CmdPayloadSchema, "task_submit %s: caller_id %q, want the caller's own %q", env.MessageID, ts.CallerID, exp.CallerID)
		}
	case envelope.TypeAbort:
		var a task.Abort
		if err := json.Unmarshal(env.Payload, &a); err != nil {
			v.add(CmdPayloadSchema, "abort %s: %v", env.MessageID, err)
		} else if err := a.Validate(); err != nil {
			v.add(CmdPayloadSchema, "abort %s: %v", env.MessageID, err)
		}
	}
	return env, v
}

// ckit is the callee side the caller kit plays: one connection with a
// publishing channel (confirms) to hcp.events and a consumer on its
// command queue (manual ack) that records every command.
type ckit struct {
	cfg *callerResolved

	mu       sync.Mutex
	conn     *amqp.Connection
	pub      *amqp.Channel
	cmds     []*Command
	changed  chan struct{}
	consumer sync.WaitGroup
}

func (k *ckit) logf(format string, args ...any) {
	if k.cfg.Log != nil {
		_, _ = fmt.Fprintf(k.cfg.Log, "hcp-conformance caller: "+format+"\n", args...)
	}
}

func (k *ckit) connect() error {
	k.changed = make(chan struct{})
	conn, pub, err := dialWithConfirms(k.cfg.uri, k.cfg.username, "hcp-conformance caller kit as callee "+k.cfg.CalleeID)
	if err != nil {
		return err
	}
	fail := func(what string, err error) error {
		_ = conn.Close()
		return fmt.Errorf("%s: %w", what, err)
	}
	cons, err := conn.Channel()
	if err != nil {
		return fail("open the consuming channel", err)
	}
	if err := cons.Qos(10, 0, false); err != nil {
		return fail("basic.qos", err)
	}
	deliveries, err := cons.Consume(k.cfg.cmdQueue, "hcp-conformance", false, false, false, false, nil)
	if err != nil {
		return fail("consume "+k.cfg.cmdQueue, err)
	}
	k.mu.Lock()
	k.conn, k.pub = conn, pub
	k.mu.Unlock()
	k.consumer.Add(1)
	go k.dispatch(deliveries)
	return nil
}

func (k *ckit) dispatch(deliveries <-chan amqp.Delivery) {
	defer k.consumer.Done()
	exp := CommandExpect{CalleeID: k.cfg.CalleeID, CallerID: k.cfg.CallerID, CallerUser: k.cfg.CallerUser}
	for d := range deliveries {
		env, v := CheckCommand(d, exp)
		_ = d.Ack(false)
		k.mu.Lock()
		k.cmds = append(k.cmds, &Command{D: d, Env: env, V: v})
		close(k.changed)
		k.changed = make(chan struct{})
		k.mu.Unlock()
	}
}

func (k *ckit) close() {
	k.mu.Lock()
	conn := k.conn
	k.conn, k.pub = nil, nil
	k.mu.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
	k.consumer.Wait()
}

func (k *ckit) commands() []*Command {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*Command(nil), k.cmds...)
}

// waitCommand waits for the first command find returns.
func (k *ckit) waitCommand(ctx context.Context, what string, find func([]*Command) *Command) (*Command, error) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	for {
		k.mu.Lock()
		cmds := append([]*Command(nil), k.cmds...)
		ch := k.changed
		k.mu.Unlock()
		if c := find(cmds); c != nil {
			return c, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("timed out after %s waiting for %s", k.cfg.Timeout, what)
		}
	}
}

// publish sends one message to hcp.events (confirmed).
func (k *ckit) publish(ctx context.Context, key string, p amqp.Publishing) error {
	k.mu.Lock()
	ch := k.pub
	k.mu.Unlock()
	if ch == nil {
		return errors.New("not connected")
	}
	ctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, topology.EventsExchange, key, false, false, p)
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		return fmt.Errorf("publish to %s with %s not confirmed (%v)", topology.EventsExchange, key, err)
	}
	return nil
}

// message builds an event-channel message as this project's callee would.
func (k *ckit) message(sid string, t envelope.MessageType, payload any) (string, amqp.Publishing, error) {
	env, err := envelope.New(t, sid, payload)
	if err != nil {
		return "", amqp.Publishing{}, err
	}
	p, err := envelope.EncodePublishing(env, k.cfg.username)
	return topology.EventRoutingKey(k.cfg.CallerID, sid, t), p, err
}

// send builds and publishes an event-channel message.
func (k *ckit) send(ctx context.Context, sid string, t envelope.MessageType, payload any) error {
	key, p, err := k.message(sid, t, payload)
	if err == nil {
		err = k.publish(ctx, key, p)
	}
	return err
}

// event builds an L2 event of a session.
func (k *ckit) event(sid string, seq int64, d session.EventData) (string, amqp.Publishing, error) {
	p, err := session.NewEvent(seq, d)
	if err != nil {
		return "", amqp.Publishing{}, err
	}
	return k.message(sid, envelope.TypeEvent, p)
}

// fakeToken is an opaque session token in the compact JWS form this
// project's callers expect (three base64url segments), unsigned: the kit
// only checks that the caller hands it back.
func fakeToken(sid string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + enc([]byte(`{"sub":"`+sid+`","iss":"hcp-conformance"}`)) + "." + enc([]byte("hcp-conformance-"+sid[:8]))
}
