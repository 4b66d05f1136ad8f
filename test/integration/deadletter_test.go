package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// checkDeadLetters: an event the caller rejects without requeue (as its
// sidecar does with an event its app refused maxAttempts times) and a
// command the callee rejects (a command it cannot process) land in their
// dead-letter queues, each routed there by its own queue's arguments (no
// binding), with x-death naming the queue it came from.
func checkDeadLetters(t *testing.T, broker *testbed.Broker, vhost string, actors map[string]*actor) {
	t.Helper()
	callee, alpha := actors["callee lab"], actors["caller alpha"]
	// A consumer, not basic.get: the event queue is single-active-consumer,
	// which quorum queues serve to consumers only.
	reject := func(who *actor, queue, id string) {
		t.Helper()
		ch, err := who.conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		ds, err := ch.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			t.Fatalf("%s: consume %s: %v", who.name, queue, err)
		}
		timeout := time.After(opTimeout)
		for {
			select {
			case d := <-ds:
				// What the permission matrix left goes too: only this
				// test's message is looked for below.
				if err := d.Nack(false, false); err != nil {
					t.Fatal(err)
				}
				if d.MessageId == id {
					return
				}
			case <-timeout:
				t.Fatalf("%s: message %s never arrived in %s", who.name, id, queue)
			}
		}
	}
	publish := func(who *actor, exchange, key, id string) {
		t.Helper()
		ch, err := who.conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, amqp.Publishing{MessageId: id, Body: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("%s: publish to %s %s not confirmed: %v", who.name, exchange, key, err)
		}
	}
	const event, command = "dead-event", "dead-command"
	publish(callee, "hcp.events", "alpha.6a1f0c2e-5b7d-4e8a-9c3f-1d2e3f4a5b6c.event", event)
	reject(alpha, "hcp.evt.alpha", event)
	publish(alpha, "hcp.commands", "lab", command)
	reject(callee, "hcp.cmd.lab", command)
	admin, err := amqp.Dial(broker.AMQPURI(broker.Username, broker.Password, vhost))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ch, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	from := map[string]string{"hcp.dlq.evt.alpha": "hcp.evt.alpha", "hcp.dlq.cmd.lab": "hcp.cmd.lab"}
	for queue, want := range map[string]string{"hcp.dlq.evt.alpha": event, "hcp.dlq.cmd.lab": command} {
		testbed.Eventually(t, readyTimeout, "the dead letter in "+queue, func(context.Context) error {
			d, ok, err := ch.Get(queue, true)
			switch {
			case err != nil:
				return err
			case !ok:
				return fmt.Errorf("%s is empty", queue)
			case d.MessageId != want:
				return fmt.Errorf("%s: %s, not %s", queue, d.MessageId, want)
			}
			deaths, _ := d.Headers["x-death"].([]any)
			if len(deaths) == 0 {
				return fmt.Errorf("%s: no x-death header on %s", queue, want)
			}
			if death, _ := deaths[0].(amqp.Table); death["queue"] != from[queue] {
				return fmt.Errorf("%s: %s dead-lettered from %v, want %s", queue, want, death["queue"], from[queue])
			}
			return nil
		})
	}
}
