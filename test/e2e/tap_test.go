//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
	"github.com/hcp-io/hcp-operator/test/checker"
)

// tap records every message published to the run's hcp.events exchange.
// Its queue is a durable quorum queue, and its consumer reconnects: a
// broker restart (a chaos fault) neither loses what was routed to it nor
// ends the recording.
type tap struct {
	mu   sync.Mutex
	msgs []checker.Message
	bad  []string
	// reconnects counts the consumer's new connections after the first.
	reconnects int
}

// startTap binds a queue of its own user to hcp.events with "#" and
// records until t ends.
func (s *suite) startTap(t *testing.T) *tap {
	t.Helper()
	user, pass := "hcp-tap-"+s.id, testbed.RandomName("")
	mgmt := func(_ *http.Response, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("tap: %v", err)
		}
	}
	mgmt(s.broker.API.PutUser(user, rabbithole.UserSettings{Password: pass, Tags: rabbithole.UserTags{}}))
	t.Cleanup(func() { _ = s.broker.DeleteUsers(user) })
	mgmt(s.broker.API.UpdatePermissionsIn(s.vhost, user, rabbithole.Permissions{
		Configure: `^hcp-tap\.`, Write: `^hcp-tap\.`, Read: `^(hcp-tap\..*|` + topology.EventsExchange + `)$`,
	}))
	q := "hcp-tap." + s.id
	// On the three-node cluster the tap moves to the next node when its
	// node goes.
	uris := []string{s.broker.AMQPURI(user, pass, s.vhost)}
	for _, n := range s.cfg.rmqNodes[min(1, len(s.cfg.rmqNodes)):] {
		b := *s.broker
		b.AMQPURL = n
		uris = append(uris, b.AMQPURI(user, pass, s.vhost))
	}
	attempt := 0
	tp := &tap{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// The first subscription must work: the run's wire is recorded from
	// its start.
	conn, deliveries, err := subscribeTap(uris[0], q)
	if err != nil {
		cancel()
		t.Fatalf("tap: %v", err)
	}
	go func() {
		defer close(done)
		for {
			tp.record(deliveries)
			_ = conn.Close()
			for {
				if ctx.Err() != nil {
					return
				}
				attempt++
				if conn, deliveries, err = subscribeTap(uris[attempt%len(uris)], q); err == nil {
					break
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
			tp.mu.Lock()
			tp.reconnects++
			tp.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = conn.Close()
		<-done
		_, _ = s.broker.API.DeleteQueue(s.vhost, q)
	})
	return tp
}

// subscribeTap connects, declares the tap's queue (durable, quorum),
// binds it and consumes it with manual acks.
func subscribeTap(uri, q string) (*amqp.Connection, <-chan amqp.Delivery, error) {
	conn, err := amqp.Dial(uri)
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*amqp.Connection, <-chan amqp.Delivery, error) {
		_ = conn.Close()
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fail(err)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return fail(err)
	}
	if err := ch.QueueBind(q, "#", topology.EventsExchange, false, nil); err != nil {
		return fail(err)
	}
	if err := ch.Qos(500, 0, false); err != nil {
		return fail(err)
	}
	deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		return fail(err)
	}
	return conn, deliveries, nil
}

// record reads deliveries until the channel closes, acking each once it
// is recorded (a copy redelivered after a lost ack is recorded again: the
// checker compares bodies, so a repeat on the wire is harmless).
func (tp *tap) record(deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		m, err := checker.FromWire(d.Body, d.Headers, d.UserId, time.Now())
		tp.mu.Lock()
		if err != nil {
			tp.bad = append(tp.bad, err.Error())
		} else {
			tp.msgs = append(tp.msgs, m)
		}
		tp.mu.Unlock()
		_ = d.Ack(false)
	}
}
