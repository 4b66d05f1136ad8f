package transport_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/transport"
)

// Unacked deliveries go back to the queue when the consumer stops and come
// again with Redelivered=true; prefetch bounds what is delivered unacked.
func TestConsumerManualAckAndRedelivery(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.events", amqp.ExchangeTopic, "hcp.evt.alpha", "alpha.#", amqp.Table{"x-queue-type": "quorum"})
	e.publishRaw("hcp.events", "alpha.s.event", "e", 5)
	m := newMetrics()
	c := e.dial("manual-ack", m, func(o *transport.Options) { o.DrainTimeout = 200 * time.Millisecond })

	held := make(chan amqp.Delivery, 10)
	stop := consume(t, c, "hcp.evt.alpha", 2, func(_ context.Context, d amqp.Delivery) { held <- d })
	first := []amqp.Delivery{recv(t, held, 10*time.Second, "delivery 1"), recv(t, held, 10*time.Second, "delivery 2")}
	// With prefetch 2 and nothing acked, the broker keeps the other three.
	if got := e.ready("hcp.evt.alpha"); got != 3 {
		t.Errorf("%d messages ready with 2 unacked under prefetch 2, want 3", got)
	}
	if len(held) != 0 {
		t.Errorf("%d deliveries beyond the prefetch window", len(held))
	}
	for _, d := range first {
		if d.Redelivered {
			t.Errorf("first delivery of %s marked redelivered", d.MessageId)
		}
	}
	// Stop without acking: the drain times out and the channel closes.
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Consume returned %v, want context.Canceled", err)
	}
	if err := first[0].Ack(false); !errors.Is(err, transport.ErrStaleDelivery) {
		t.Errorf("ack after the consumer stopped: %v, want ErrStaleDelivery", err)
	}

	got := make(chan amqp.Delivery, 10)
	consume(t, c, "hcp.evt.alpha", 2, func(_ context.Context, d amqp.Delivery) {
		if err := d.Ack(false); err != nil {
			t.Errorf("Ack: %v", err)
		}
		got <- d
	})
	seen := map[string]bool{}
	for i := 0; i < 5; i++ {
		d := recv(t, got, 10*time.Second, fmt.Sprintf("redelivery round, message %d", i))
		if seen[d.MessageId] {
			t.Errorf("%s delivered twice in the second round", d.MessageId)
		}
		seen[d.MessageId] = true
		wasHeld := d.MessageId == first[0].MessageId || d.MessageId == first[1].MessageId
		if d.Redelivered != wasHeld {
			t.Errorf("%s: Redelivered=%v, want %v", d.MessageId, d.Redelivered, wasHeld)
		}
	}
	// FIFO: the requeued messages come first.
	if got := m.redeliveryCount(); got != 2 {
		t.Errorf("redeliveries metric = %v, want 2", got)
	}
	eventually(t, 5*time.Second, "the queue to empty", func() bool { return e.ready("hcp.evt.alpha") == 0 })
}

// Conn.Close cancels the subscription and waits for the handler to settle
// what it holds; acks sent during the drain count.
func TestCloseDrainsInFlightDeliveries(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.commands", amqp.ExchangeDirect, "hcp.cmd.lab", "lab", amqp.Table{"x-queue-type": "quorum"})
	e.publishRaw("hcp.commands", "lab", "c", 3)
	c := e.dial("drain", nil)
	pub, err := transport.NewPublisher(c, transport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan amqp.Delivery, 10)
	ctxs := make(chan context.Context, 10)
	consumeErr := make(chan error, 1)
	go func() {
		consumeErr <- c.Consume(context.Background(), "hcp.cmd.lab", 3, func(ctx context.Context, d amqp.Delivery) {
			ctxs <- ctx
			held <- d
		})
	}()
	var ds []amqp.Delivery
	for i := 0; i < 3; i++ {
		ds = append(ds, recv(t, held, 10*time.Second, "a delivery"))
	}
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		closed <- c.Close(ctx)
	}()
	// Close is waiting for us; the handler ctx is still live.
	hctx := <-ctxs
	if hctx.Err() != nil {
		t.Errorf("handler ctx cancelled during the drain: %v", hctx.Err())
	}
	for _, d := range ds {
		if err := d.Ack(false); err != nil {
			t.Errorf("ack during the drain: %v", err)
		}
	}
	if err := recv(t, closed, 15*time.Second, "Close"); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := recv(t, consumeErr, 5*time.Second, "Consume to return"); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Consume after Close: %v, want ErrClosed", err)
	}
	if got := e.ready("hcp.cmd.lab"); got != 0 {
		t.Errorf("%d messages back in the queue after acking all of them during the drain", got)
	}
	ctx := context.Background()
	if _, err := pub.PublishAsync(ctx, "hcp.commands", "lab", persistent("late", "{}")); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("PublishAsync after Close: %v, want ErrClosed", err)
	}
	if _, err := transport.NewPublisher(c, transport.PublisherOptions{}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("NewPublisher after Close: %v, want ErrClosed", err)
	}
	if err := c.Consume(ctx, "hcp.cmd.lab", 1, func(context.Context, amqp.Delivery) {}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Consume after Close: %v, want ErrClosed", err)
	}
	if err := c.Close(ctx); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
}

// A handler holding a delivery across a reconnect gets ErrStaleDelivery
// from Ack (logged, harmless: the channel it would have hit is gone) and the
// message comes again, redelivered, on the new channel.
func TestStaleAckAfterReconnect(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.events", amqp.ExchangeTopic, "hcp.evt.alpha", "alpha.#", amqp.Table{"x-queue-type": "quorum"})
	e.publishRaw("hcp.events", "alpha.s.event", "s", 1)
	m := newMetrics()
	c := e.dial("stale", m)

	type got struct {
		ctx context.Context
		d   amqp.Delivery
	}
	deliveries := make(chan got, 10)
	consume(t, c, "hcp.evt.alpha", 10, func(ctx context.Context, d amqp.Delivery) { deliveries <- got{ctx, d} })
	old := recv(t, deliveries, 10*time.Second, "the first delivery")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if n, err := e.broker.CloseConnections(ctx, e.vhost, "stale"); err != nil || n != 1 {
		t.Fatalf("closing the connection through the management API: n=%d err=%v", n, err)
	}
	again := recv(t, deliveries, 30*time.Second, "the redelivery after reconnecting")
	if !again.d.Redelivered || again.d.MessageId != old.d.MessageId {
		t.Fatalf("after the reconnect got %s redelivered=%v, want %s redelivered", again.d.MessageId, again.d.Redelivered, old.d.MessageId)
	}
	if old.ctx.Err() == nil {
		t.Error("the stale delivery's handler ctx is still live")
	}
	err := old.d.Ack(false)
	if !errors.Is(err, transport.ErrStaleDelivery) || !errors.Is(err, amqp.ErrClosed) {
		t.Fatalf("ack of the stale delivery: %v, want ErrStaleDelivery wrapping amqp.ErrClosed", err)
	}
	if err := again.d.Ack(false); err != nil {
		t.Fatalf("ack of the redelivery: %v", err)
	}
	eventually(t, 5*time.Second, "the queue to empty", func() bool { return e.ready("hcp.evt.alpha") == 0 })
	if got := m.reconnectCount("amqp"); got != 1 {
		t.Errorf("reconnects = %v, want 1", got)
	}
	if got := m.redeliveryCount(); got != 1 {
		t.Errorf("redeliveries = %v, want 1", got)
	}
	// The new channel is healthy: the next message is delivered and acked.
	e.publishRaw("hcp.events", "alpha.s.event", "t", 1)
	next := recv(t, deliveries, 10*time.Second, "a delivery after the stale ack")
	if err := next.d.Ack(false); err != nil {
		t.Errorf("ack after the stale ack: %v", err)
	}
}

// Settling a delivery twice is refused locally instead of reaching the
// broker, which would close the channel (406 unknown delivery tag).
func TestDoubleAckRefused(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.commands", amqp.ExchangeDirect, "hcp.cmd.lab", "lab", nil)
	e.publishRaw("hcp.commands", "lab", "d", 2)
	c := e.dial("double-ack", nil)
	errs := make(chan error, 10)
	consume(t, c, "hcp.cmd.lab", 1, func(_ context.Context, d amqp.Delivery) {
		errs <- d.Ack(false)
		errs <- d.Nack(false, true)
	})
	for i := 0; i < 2; i++ {
		if err := recv(t, errs, 10*time.Second, "first ack"); err != nil {
			t.Fatalf("message %d, first ack: %v", i, err)
		}
		if err := recv(t, errs, 10*time.Second, "second settle"); err == nil || !strings.Contains(err.Error(), "already settled") {
			t.Fatalf("message %d, second settle: %v, want already settled", i, err)
		}
	}
	eventually(t, 5*time.Second, "the queue to empty", func() bool { return e.ready("hcp.cmd.lab") == 0 })
}

// AckAll on a real broker: deliveries acked in bursts, out of order and
// around one that is released (nacked with requeue), leave exactly that
// one in the queue: a multiple=true ack never covers a delivery that was
// not among those acked.
func TestAckAllNeverAcksAnotherDelivery(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.events", amqp.ExchangeTopic, "hcp.evt.alpha", "alpha.#", amqp.Table{"x-queue-type": "quorum"})
	e.publishRaw("hcp.events", "alpha.s.event", "e", 8)
	c := e.dial("ack-all", nil)
	held := make(chan amqp.Delivery, 10)
	stop := consume(t, c, "hcp.evt.alpha", 8, func(_ context.Context, d amqp.Delivery) { held <- d })
	ds := make([]amqp.Delivery, 8)
	for i := range ds {
		ds[i] = recv(t, held, 10*time.Second, fmt.Sprintf("delivery %d", i+1))
	}
	steps := [][]amqp.Delivery{{ds[2], ds[1], ds[4]}, {ds[0]}, {ds[6], ds[5]}}
	for i, burst := range steps {
		if err := transport.AckAll(burst); err != nil {
			t.Fatalf("burst %d: %v", i, err)
		}
	}
	if err := ds[3].Nack(false, true); err != nil { // released: must come back
		t.Fatal(err)
	}
	if err := transport.AckAll([]amqp.Delivery{ds[7]}); err != nil {
		t.Fatal(err)
	}
	if err := transport.AckAll([]amqp.Delivery{ds[7]}); err != nil {
		t.Fatalf("acking a settled delivery again: %v, want a no-op", err)
	}
	back := recv(t, held, 10*time.Second, "the released delivery")
	if back.MessageId != ds[3].MessageId || !back.Redelivered {
		t.Fatalf("redelivered %s (redelivered=%v), want %s", back.MessageId, back.Redelivered, ds[3].MessageId)
	}
	if err := transport.AckAll([]amqp.Delivery{back}); err != nil {
		t.Fatal(err)
	}
	// Closing the channel requeues whatever is still unacked: nothing is.
	_ = stop()
	if n := e.ready("hcp.evt.alpha"); n != 0 {
		t.Fatalf("%d messages back in the queue: an ack was lost", n)
	}
}

// Connections are closed under the publisher and the consumer twice
// mid-stream (as rabbitmqctl close_all_connections would); every message
// arrives, possibly more than once, none is lost.
func TestReconnectNoLoss(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.events", amqp.ExchangeTopic, "hcp.evt.alpha", "alpha.#", amqp.Table{"x-queue-type": "quorum"})
	pm, cm := newMetrics(), newMetrics()
	pc := e.dial("noloss-publisher", pm)
	cc := e.dial("noloss-consumer", cm)
	pub, err := transport.NewPublisher(pc, transport.PublisherOptions{Window: 32})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	cs, err := e.broker.Connections(ctx, e.vhost)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range cs {
		names[c.ConnectionName()] = true
	}
	// The management API may list a new connection late; only check names
	// of those it lists.
	for n := range names {
		if n != "noloss-publisher" && n != "noloss-consumer" {
			t.Errorf("unexpected connection_name %q", n)
		}
	}

	var mu sync.Mutex
	received := map[string]int{}
	consume(t, cc, "hcp.evt.alpha", 10, func(_ context.Context, d amqp.Delivery) {
		mu.Lock()
		received[d.MessageId]++
		mu.Unlock()
		_ = d.Ack(false) // a stale ack is harmless: the message comes again
	})
	distinct := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(received)
	}

	// Four publishers take ids from a shared counter, republishing each
	// until it is confirmed, paced so that the closes land mid-stream; they
	// stop at stopAt, fixed once the faults are over.
	var wg sync.WaitGroup
	var lost sync.Map
	var next, stopAt atomic.Int64
	stopAt.Store(math.MaxInt64)
	for range 4 {
		wg.Go(func() {
			pacer := benchutil.NewPacer(250)
			for {
				if err := pacer.Wait(ctx); err != nil {
					t.Error(err)
					return
				}
				i := next.Add(1) - 1
				if i >= stopAt.Load() {
					return
				}
				id := fmt.Sprintf("m-%06d", i)
				for {
					err := pub.Publish(ctx, "hcp.events", "alpha.s.event", persistent(id, "{}"))
					if err == nil {
						break
					}
					if !errors.Is(err, transport.ErrConnectionLost) {
						t.Errorf("publish %s: %v", id, err)
						return
					}
					lost.Store(id, true)
				}
			}
		})
	}
	// The management API lists new connections only after its statistics
	// interval, and may still list closed ones: close until both sides have
	// reconnected once more.
	for round := 1; round <= 2; round++ {
		eventually(t, 60*time.Second, "more messages consumed", func() bool { return distinct() >= round*1000 })
		for pm.reconnectCount("amqp") < round || cm.reconnectCount("amqp") < round {
			n, err := e.broker.CloseConnections(ctx, e.vhost, "")
			if err != nil {
				t.Fatalf("closing connections: %v", err)
			}
			t.Logf("round %d: closed %d connections after %d messages consumed", round, n, distinct())
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) && (pm.reconnectCount("amqp") < round || cm.reconnectCount("amqp") < round) {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	stopAt.Store(next.Load() + 1000)
	wg.Wait()
	total := int(stopAt.Load())
	eventually(t, 60*time.Second, "every message consumed", func() bool { return distinct() == total })

	mu.Lock()
	dups := 0
	for _, n := range received {
		dups += n - 1
	}
	mu.Unlock()
	nLost := 0
	lost.Range(func(any, any) bool { nLost++; return true })
	t.Logf("sent %d, received %d distinct, %d duplicate deliveries, %d publishes retried after ErrConnectionLost; reconnects: publisher %v, consumer %v",
		total, distinct(), dups, nLost, pm.reconnectCount("amqp"), cm.reconnectCount("amqp"))
	eventually(t, 10*time.Second, "the queue to empty", func() bool { return e.ready("hcp.evt.alpha") == 0 })
}

// A subscription to a queue that does not exist yet is retried until the
// queue appears.
func TestConsumeWaitsForQueue(t *testing.T) {
	e := newEnv(t)
	c := e.dial("late-queue", nil)
	got := make(chan amqp.Delivery, 1)
	consume(t, c, "hcp.cmd.late", 1, func(_ context.Context, d amqp.Delivery) {
		_ = d.Ack(false)
		got <- d
	})
	// Readiness needs the subscription, not just a running Consume.
	time.Sleep(500 * time.Millisecond)
	if c.Subscribed("hcp.cmd.late") {
		t.Error("Subscribed before the queue exists")
	}
	e.declare("hcp.commands", amqp.ExchangeDirect, "hcp.cmd.late", "late", nil)
	e.publishRaw("hcp.commands", "late", "l", 1)
	if d := recv(t, got, 20*time.Second, "a delivery from the late queue"); d.MessageId != "l0" {
		t.Errorf("got %s", d.MessageId)
	}
	if !c.Ready() {
		t.Error("failed subscriptions took the connection down")
	}
	if !c.Subscribed("hcp.cmd.late") || c.Subscribed("hcp.cmd.other") {
		t.Errorf("Subscribed = %v for the consumed queue, %v for another", c.Subscribed("hcp.cmd.late"), c.Subscribed("hcp.cmd.other"))
	}
}
