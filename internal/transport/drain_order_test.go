package transport_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/transport"
)

// TestDrainWithoutCancelKeepsOrder: a consumer stopped while it holds
// unacked deliveries and more are in transit. With DrainWithoutCancel the
// next consumer of the quorum queue gets every unacked message back first,
// in queue order. With basic.cancel (the default drain) RabbitMQ may put
// the messages in transit at the back of the queue; that order is logged,
// not asserted (it is the broker's behaviour, which varies by version).
func TestDrainWithoutCancelKeepsOrder(t *testing.T) {
	for _, withoutCancel := range []bool{true, false} {
		t.Run(fmt.Sprintf("DrainWithoutCancel=%v", withoutCancel), func(t *testing.T) {
			e := newEnv(t)
			e.declare("hcp.events", amqp.ExchangeTopic, "hcp.evt.alpha", "alpha.#", amqp.Table{"x-queue-type": "quorum"})
			const n = 40
			e.publishRaw("hcp.events", "alpha.s.event", "", n)
			c := e.dial("drain-order", nil, func(o *transport.Options) {
				o.DrainWithoutCancel = withoutCancel
				o.DrainTimeout = 300 * time.Millisecond
			})
			got := make(chan amqp.Delivery, n)
			stop := consume(t, c, "hcp.evt.alpha", 5, func(_ context.Context, d amqp.Delivery) {
				// Ack the first few so that more are in transit, hold the
				// rest (an ordered consumer waiting on something).
				if i, _ := strconv.Atoi(string(d.Body)); i < 3 {
					_ = d.Ack(false)
				}
				got <- d
			})
			for range 5 {
				recv(t, got, 10*time.Second, "a delivery")
			}
			if err := stop(); err != nil && err != context.Canceled {
				t.Logf("Consume: %v", err)
			}

			// What the next consumer sees.
			ch := e.adminCh()
			if err := ch.Qos(n, 0, false); err != nil {
				t.Fatal(err)
			}
			ds, err := ch.Consume("hcp.evt.alpha", "next", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			var order []int
			for len(order) < n-3 {
				d := recv(t, ds, 10*time.Second, "a message for the next consumer")
				i, _ := strconv.Atoi(string(d.Body))
				order = append(order, i)
				_ = d.Ack(false)
			}
			_ = ch.Cancel("next", false)
			t.Logf("DrainWithoutCancel=%v: next consumer got %v", withoutCancel, order)
			if withoutCancel && !slices.IsSorted(order) {
				t.Errorf("order broken across the drain: %v", order)
			}
		})
	}
}
