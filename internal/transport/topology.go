package transport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TopologyError lists the exchanges and queues CheckTopology could not find
// (or was not allowed to see). Problems holds one error per object, each
// wrapping the broker's *amqp.Error.
type TopologyError struct {
	Vhost    string
	Problems []error
}

func (e *TopologyError) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		msgs[i] = p.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e *TopologyError) Unwrap() []error { return e.Problems }

// CheckTopology checks with passive declares that the exchanges (name →
// kind) and queues exist in the connection's vhost, without creating
// anything (sidecar users have no configure permission). Each declare uses
// a throw-away channel, because a failed passive declare closes its channel.
// It waits for the connection within ctx and reports every missing object
// at once in a *TopologyError. A passive declare checks existence only: the
// broker does not compare the exchange kind, which appears in messages for
// the reader.
func (c *Conn) CheckTopology(ctx context.Context, exchanges map[string]string, queues []string) error {
	conn, err := c.connection(ctx)
	if err != nil {
		return err
	}
	vhost := c.uri.Vhost
	var problems []error
	names := make([]string, 0, len(exchanges))
	for n := range exchanges {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		kind := exchanges[name]
		err := passive(conn, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(name, kind, true, false, false, false, nil)
		})
		if err != nil {
			problems = append(problems, topologyProblem(fmt.Sprintf("exchange %s (%s)", name, kind), "exchanges.rabbitmq.com", exchangeOwner(), vhost, c.uri.Username, err))
		}
	}
	for _, name := range queues {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := passive(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			return err
		})
		if err != nil {
			problems = append(problems, topologyProblem("queue "+name, "queues.rabbitmq.com", queueOwner(name), vhost, c.uri.Username, err))
		}
	}
	if len(problems) > 0 {
		return &TopologyError{Vhost: vhost, Problems: problems}
	}
	return nil
}

func passive(conn *amqp.Connection, declare func(*amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	err = declare(ch)
	// After a failed declare the broker has closed the channel already.
	_ = ch.Close()
	return err
}

func exchangeOwner() string { return "the Callee's and Caller's topology" }

// queueOwner names the HCP object whose topology should hold an L1 queue.
func queueOwner(queue string) string {
	switch {
	case strings.HasPrefix(queue, "hcp.cmd."):
		return fmt.Sprintf("the topology of Callee %q", strings.TrimPrefix(queue, "hcp.cmd."))
	case strings.HasPrefix(queue, "hcp.evt."):
		return fmt.Sprintf("the topology of Caller %q", strings.TrimPrefix(queue, "hcp.evt."))
	default:
		return "the topology"
	}
}

func topologyProblem(what, resource, owner, vhost, user string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.NotFound:
			return fmt.Errorf("%s not found in vhost %s: is %s Ready? kubectl get %s -A: %w", what, vhost, owner, resource, err)
		case amqp.AccessRefused:
			return fmt.Errorf("%s in vhost %s: access refused to user %s: check its permissions (kubectl get permissions.rabbitmq.com -A): %w", what, vhost, user, err)
		}
	}
	return fmt.Errorf("checking %s in vhost %s: %w", what, vhost, err)
}
