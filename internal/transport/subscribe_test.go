package transport_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/internal/transport/transporttest"
)

// A node that does not answer a subscription (here: nothing comes back
// through its proxy; in a cluster, a basic.consume on a quorum queue whose
// leader the node still places on a lost node) is left after
// SubscribeTimeout: the consumer subscribes through the next node and
// deliveries flow while the first one stays silent.
func TestSubscribeTimeoutLeavesTheNode(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.commands", amqp.ExchangeDirect, "hcp.cmd.lab", "lab", nil)
	silent := transporttest.NewProxy(t, e.broker.AMQPAddr)
	next := transporttest.NewProxy(t, e.broker.AMQPAddr)
	c := e.dialURL(e.broker.URLVia("nowhere.invalid:5672", e.vhost), "subscribe", newMetrics(), func(o *transport.Options) {
		o.Addresses = []string{silent.Addr(), next.Addr()}
		o.SubscribeTimeout = time.Second
	})
	silent.Pause()
	defer silent.Resume()
	got := make(chan string, 1)
	consume(t, c, "hcp.cmd.lab", 1, func(_ context.Context, d amqp.Delivery) {
		select {
		case got <- d.MessageId:
		default:
		}
		_ = d.Ack(false)
	})
	e.publishRaw("hcp.commands", "lab", "m", 1)
	select {
	case id := <-got:
		t.Logf("delivered %s through the next node", id)
	case <-time.After(15 * time.Second):
		t.Fatal("nothing delivered within 15 s while the first node stayed silent: the consumer did not leave it")
	}
}
