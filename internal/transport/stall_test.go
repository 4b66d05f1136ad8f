package transport_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/transport"
)

// raServer stops or restarts (op: stop_server, restart_server) the Raft
// member of a quorum queue on the broker's node, through rabbitmqctl: the
// queue has no leader until it restarts, as when the node that held its
// leader dies and the others have not elected one yet.
func raServer(t *testing.T, vhost, queue, op string) {
	t.Helper()
	expr := fmt.Sprintf(`{ok,Q}=rabbit_amqqueue:lookup(rabbit_misc:r(<<"%s">>,queue,<<"%s">>)), {N,_}=amqqueue:get_pid(Q), ra:%s(quorum_queues, {N, node()}).`, vhost, queue, op)
	if out, err := exec.CommandContext(t.Context(), "rabbitmqctl", "-q", "eval", expr).CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl eval ra:%s: %v\n%s", op, err, out)
	}
}

// A publishing channel whose quorum queue stops confirming (its leader
// gone, no new one known to the channel) while the channel itself stays
// up: after ConfirmStall without a single confirm the publisher gives its
// pending confirmations up as lost, so that their publishers send them
// again, on a new channel, which reaches the queue once it has a leader.
// On RabbitMQ 3.10 the old channel learns of a new leader elected on
// another node only when the dead one is back (make chaos: every broker
// node kill stalled the sessions until then).
func TestConfirmStallReopensChannel(t *testing.T) {
	const stall = time.Second
	e := newEnv(t)
	e.declare("hcp.events", amqp.ExchangeDirect, "stalled", "k", amqp.Table{"x-queue-type": "quorum"})
	c := e.dial("stall", newMetrics(), func(o *transport.Options) { o.ConfirmStall = stall })
	pub, err := transport.NewPublisher(c, transport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, "hcp.events", "k", persistent("before", "{}")); err != nil {
		t.Fatal(err)
	}
	raServer(t, e.vhost, "stalled", "stop_server")
	restarted := false
	defer func() {
		if !restarted {
			raServer(t, e.vhost, "stalled", "restart_server")
		}
	}()
	start := time.Now()
	f, err := pub.PublishAsync(ctx, "hcp.events", "k", persistent("during", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	wait, cancelWait := context.WithTimeout(ctx, 5*time.Second)
	err = f.Wait(wait)
	cancelWait()
	if !errors.Is(err, transport.ErrConnectionLost) {
		t.Fatalf("confirmation pending with the queue leaderless: %v after %s, want ErrConnectionLost after ConfirmStall (1 s) to 1.5 s", err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("given up as lost after %s: %v", time.Since(start).Round(time.Millisecond), err)
	raServer(t, e.vhost, "stalled", "restart_server")
	restarted = true
	// Published again, as the sidecars do, on the publisher's next channel.
	if err := pub.Publish(ctx, "hcp.events", "k", persistent("during", "{}")); err != nil {
		t.Fatalf("publishing again once the queue has a leader: %v", err)
	}
	if got := e.ready("stalled"); got < 2 {
		t.Fatalf("queue holds %d messages, want before and during", got)
	}
}

// A channel whose publishes are all nacked at once (here a queue that
// rejects every publish; in production a node whose quorum queue client
// still places the leader on a lost node, which RabbitMQ 3.10.8 kept
// doing for the 36 s that node was gone) makes no progress either: once
// publishes were retried for ConfirmStall with none acked, the channel is
// reopened, and after a second such channel the publisher leaves the node.
// Before, a nack counted as progress and the sidecars stayed on that node
// until the lost one came back (the relay's node-loss test, under load).
func TestNacksOnlyReopenChannel(t *testing.T) {
	const stall = time.Second
	e := newEnv(t)
	e.declare("hcp.events", amqp.ExchangeDirect, "full", "k", amqp.Table{"x-queue-type": "quorum", "x-max-length": 0, "x-overflow": "reject-publish"})
	m := newMetrics()
	c := e.dial("nacks", m, func(o *transport.Options) { o.ConfirmStall = stall })
	pub, err := transport.NewPublisher(c, transport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	// Retried as the sidecars retry a nack, until the publisher has left
	// the node (a reconnection) or 15 s.
	nacks := 0
	for m.reconnectCount("amqp") == 0 && ctx.Err() == nil {
		err := pub.Publish(ctx, "hcp.events", "k", persistent("refused", "{}"))
		if errors.Is(err, transport.ErrNacked) {
			nacks++
		}
		time.Sleep(300 * time.Millisecond)
	}
	if m.reconnectCount("amqp") == 0 {
		t.Fatalf("%d publishes nacked over 15 s and the publisher stayed on its channel and node; want the node left after two channels of %s with nothing acked", nacks, stall)
	}
	t.Logf("left the node after %d nacked publishes", nacks)
}
