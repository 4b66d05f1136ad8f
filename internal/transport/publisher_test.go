package transport_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/internal/transport/transporttest"
)

func persistent(id string, body string) amqp.Publishing {
	return amqp.Publishing{
		ContentType: "application/json", ContentEncoding: "utf-8", DeliveryMode: amqp.Persistent,
		MessageId: id, Body: []byte(body),
	}
}

func TestPublishConfirmAndConsume(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.events", amqp.ExchangeTopic, "hcp.evt.alpha", "alpha.#", amqp.Table{"x-queue-type": "quorum"})
	m := newMetrics()
	c := e.dial("roundtrip", m)
	pub, err := transport.NewPublisher(c, transport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	msg := persistent("m-1", `{"hello":"world"}`)
	msg.UserId = c.Username()
	msg.Type = "event"
	if err := pub.Publish(ctx, "hcp.events", "alpha.s1.event", msg); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if got := m.confirmCount("ack"); got != 1 {
		t.Errorf("confirms{ack} = %v, want 1", got)
	}
	if got := e.ready("hcp.evt.alpha"); got != 1 {
		t.Fatalf("queue holds %d ready messages after a confirmed publish, want 1", got)
	}

	got := make(chan amqp.Delivery, 1)
	stop := consume(t, c, "hcp.evt.alpha", 10, func(_ context.Context, d amqp.Delivery) {
		if err := d.Ack(false); err != nil {
			t.Errorf("Ack: %v", err)
		}
		got <- d
	})
	d := recv(t, got, 10*time.Second, "the delivery")
	if string(d.Body) != `{"hello":"world"}` || d.MessageId != "m-1" || d.UserId != "guest" || d.Type != "event" ||
		d.DeliveryMode != amqp.Persistent || d.Redelivered || d.RoutingKey != "alpha.s1.event" {
		t.Errorf("unexpected delivery: id=%q user=%q type=%q mode=%d redelivered=%v key=%q body=%s", d.MessageId, d.UserId, d.Type, d.DeliveryMode, d.Redelivered, d.RoutingKey, d.Body)
	}
	if _, ok := d.Headers[transport.CorrelationHeader]; ok {
		t.Errorf("a message with a unique message_id got the %s header", transport.CorrelationHeader)
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Consume returned %v after its ctx was cancelled, want context.Canceled", err)
	}
	eventually(t, 5*time.Second, "the acked message to leave the queue", func() bool { return e.ready("hcp.evt.alpha") == 0 })
}

// Returned and confirmed messages interleave on one channel, with duplicate
// and missing message ids: each confirmation must get its own outcome.
func TestUnroutableIsAnErrorPerMessage(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.events", amqp.ExchangeTopic, "hcp.evt.alpha", "alpha.#", nil)
	m := newMetrics()
	c := e.dial("unroutable", m)
	pub, err := transport.NewPublisher(c, transport.PublisherOptions{Window: 64})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Single publish first: the plain case.
	err = pub.Publish(ctx, "hcp.events", "nobody.s1.event", persistent("lonely", "{}"))
	if !errors.Is(err, transport.ErrUnroutable) {
		t.Fatalf("Publish to an unbound key: %v, want ErrUnroutable", err)
	}
	if !strings.Contains(err.Error(), "NO_ROUTE") || !strings.Contains(err.Error(), "nobody.s1.event") {
		t.Errorf("error should name the reply and routing key: %v", err)
	}

	type outcome struct {
		routable bool
		f        transport.Confirmation
	}
	const workers, perWorker = 4, 100
	var mu sync.Mutex
	var all []outcome
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := 0; i < perWorker; i++ {
				routable := (i+w)%3 != 0
				key := "nobody.s.event"
				if routable {
					key = "alpha.s.event"
				}
				var id string
				switch i % 4 {
				case 0:
					id = "" // no message_id: correlated by header
				case 1:
					id = "shared" // the same id in flight many times, routable or not
				default:
					id = fmt.Sprintf("w%d-%d", w, i)
				}
				f, err := pub.PublishAsync(ctx, "hcp.events", key, persistent(id, "{}"))
				if err != nil {
					t.Errorf("PublishAsync: %v", err)
					return
				}
				mu.Lock()
				all = append(all, outcome{routable, f})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	wantReturned := 0
	for i, o := range all {
		err := o.f.Wait(ctx)
		switch {
		case o.routable && err != nil:
			t.Errorf("message %d (routable): %v", i, err)
		case !o.routable && !errors.Is(err, transport.ErrUnroutable):
			t.Errorf("message %d (unroutable): %v, want ErrUnroutable", i, err)
		}
		if !o.routable {
			wantReturned++
		}
	}
	if got := m.confirmCount("returned"); got != wantReturned+1 {
		t.Errorf("confirms{returned} = %v, want %d", got, wantReturned+1)
	}
	if got, want := e.ready("hcp.evt.alpha"), len(all)-wantReturned; got != want {
		t.Errorf("queue holds %d messages, want %d (the routable ones)", got, want)
	}
}

func TestNackedWhenQueueRejectsPublish(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.commands", amqp.ExchangeDirect, "hcp.cmd.lab", "lab", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	m := newMetrics()
	c := e.dial("nack", m)
	pub, err := transport.NewPublisher(c, transport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, "hcp.commands", "lab", persistent("first", "{}")); err != nil {
		t.Fatalf("first publish: %v", err)
	}
	err = pub.Publish(ctx, "hcp.commands", "lab", persistent("second", "{}"))
	if !errors.Is(err, transport.ErrNacked) {
		t.Fatalf("publish to a full reject-publish queue: %v, want ErrNacked", err)
	}
	if got := m.confirmCount("nack"); got != 1 {
		t.Errorf("confirms{nack} = %v, want 1", got)
	}
	// The channel survives a nack.
	if _, err := e.adminCh().QueuePurge("hcp.cmd.lab", false); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, "hcp.commands", "lab", persistent("third", "{}")); err != nil {
		t.Fatalf("publish after purge: %v", err)
	}
}

// A proxy holds back the broker's confirms: the window fills, the next
// publish blocks until its ctx ends, and releasing the confirms frees it.
func TestWindowBoundsInFlight(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.commands", amqp.ExchangeDirect, "hcp.cmd.lab", "lab", nil)
	proxy := transporttest.NewProxy(t, e.broker.AMQPAddr)
	c := e.dialURL(e.broker.URLVia(proxy.Addr(), e.vhost), "window", nil)
	const window = 3
	pub, err := transport.NewPublisher(c, transport.PublisherOptions{Window: window})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, "hcp.commands", "lab", persistent("warm-up", "{}")); err != nil {
		t.Fatal(err)
	}

	proxy.Pause()
	var fs []transport.Confirmation
	for i := 0; i < window; i++ {
		f, err := pub.PublishAsync(ctx, "hcp.commands", "lab", persistent(fmt.Sprintf("m%d", i), "{}"))
		if err != nil {
			t.Fatalf("PublishAsync %d within the window: %v", i, err)
		}
		fs = append(fs, f)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pub.PublishAsync(short, "hcp.commands", "lab", persistent("over", "{}"))
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "window full") {
		t.Fatalf("PublishAsync beyond the window: %v, want a window-full deadline error", err)
	}
	for i, f := range fs {
		wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		if err := f.Wait(wctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("confirmation %d resolved while the proxy held the confirms: %v", i, err)
		}
		wcancel()
	}

	proxy.Resume()
	for i, f := range fs {
		if err := f.Wait(ctx); err != nil {
			t.Errorf("confirmation %d: %v", i, err)
		}
	}
	if err := pub.Publish(ctx, "hcp.commands", "lab", persistent("after", "{}")); err != nil {
		t.Fatalf("publish after the window drained: %v", err)
	}
	if got := e.ready("hcp.cmd.lab"); got != window+2 {
		t.Errorf("queue holds %d messages, want %d", got, window+2)
	}
}

// Cutting the network fails pending confirmations with ErrConnectionLost;
// while the broker is unreachable publishing waits (bounded by ctx) and it
// resumes once the connection is back.
func TestPublishAcrossConnectionLoss(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.commands", amqp.ExchangeDirect, "hcp.cmd.lab", "lab", nil)
	proxy := transporttest.NewProxy(t, e.broker.AMQPAddr)
	m := newMetrics()
	c := e.dialURL(e.broker.URLVia(proxy.Addr(), e.vhost), "loss", m)
	pub, err := transport.NewPublisher(c, transport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, "hcp.commands", "lab", persistent("before", "{}")); err != nil {
		t.Fatal(err)
	}
	if !m.isConnected("amqp") {
		t.Error("reported disconnected while publishing, want connected")
	}

	proxy.Pause()
	var pending []transport.Confirmation
	for i := 0; i < 5; i++ {
		f, err := pub.PublishAsync(ctx, "hcp.commands", "lab", persistent(fmt.Sprintf("p%d", i), "{}"))
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, f)
	}
	proxy.Down(true)
	proxy.Cut()
	proxy.Resume()
	for i, f := range pending {
		if err := f.Wait(ctx); !errors.Is(err, transport.ErrConnectionLost) {
			t.Errorf("pending confirmation %d after a cut: %v, want ErrConnectionLost", i, err)
		}
	}
	if got := m.confirmCount("lost"); got != 5 {
		t.Errorf("confirms{lost} = %v, want 5", got)
	}
	eventually(t, 5*time.Second, "Ready() to turn false", func() bool { return !c.Ready() })
	if m.isConnected("amqp") {
		t.Error("reported connected while down, want disconnected")
	}

	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pub.PublishAsync(short, "hcp.commands", "lab", persistent("while-down", "{}"))
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PublishAsync while disconnected: %v, want DeadlineExceeded", err)
	}
	short, cancelShort = context.WithTimeout(ctx, 300*time.Millisecond)
	err = c.WaitReady(short)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "last error") {
		t.Errorf("WaitReady while down: %v, want a deadline error naming the last failure", err)
	}

	done := make(chan error, 1)
	go func() { done <- pub.Publish(ctx, "hcp.commands", "lab", persistent("after", "{}")) }()
	proxy.Down(false)
	if err := recv(t, done, 20*time.Second, "the publish after reconnecting"); err != nil {
		t.Fatalf("Publish after reconnecting: %v", err)
	}
	if !c.Ready() {
		t.Error("Ready() is false after a successful publish")
	}
	if got := m.reconnectCount("amqp"); got != 1 {
		t.Errorf("reconnects = %v, want 1", got)
	}
	// before + after; the five lost ones may or may not have arrived.
	if got := e.ready("hcp.cmd.lab"); got < 2 || got > 7 {
		t.Errorf("queue holds %d messages, want 2…7", got)
	}
}

// A publish the broker refuses at channel level (user_id not the
// authenticated user) closes the channel: its confirmation fails with the
// broker's reason and the publisher carries on with a new channel.
func TestChannelErrorRecovers(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.commands", amqp.ExchangeDirect, "hcp.cmd.lab", "lab", nil)
	c := e.dial("spoof", nil)
	pub, err := transport.NewPublisher(c, transport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	spoofed := persistent("spoofed", "{}")
	spoofed.UserId = "somebody-else"
	err = pub.Publish(ctx, "hcp.commands", "lab", spoofed)
	if !errors.Is(err, transport.ErrConnectionLost) || !strings.Contains(err.Error(), "PRECONDITION_FAILED") {
		t.Fatalf("publish with a foreign user_id: %v, want ErrConnectionLost with PRECONDITION_FAILED", err)
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		t.Errorf("the broker's 406 is not reachable with errors.As: %v", err)
	}
	err = pub.Publish(ctx, "no-such-exchange", "lab", persistent("lost", "{}"))
	if !errors.Is(err, transport.ErrConnectionLost) || !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Fatalf("publish to a missing exchange: %v, want ErrConnectionLost wrapping a 404", err)
	}
	ok := persistent("honest", "{}")
	ok.UserId = c.Username()
	if err := pub.Publish(ctx, "hcp.commands", "lab", ok); err != nil {
		t.Fatalf("publish after the channel error: %v", err)
	}
	if !c.Ready() {
		t.Error("a channel error took the connection down")
	}
}

// Shutdown is bounded when the broker stops answering (a network
// partition: the TCP connection stays up, nothing comes back): Close gives
// up on the unconfirmed publish and the unacked delivery at its context's
// deadline, and on the connection.close handshake after CloseDeadline.
func TestCloseBoundedWhenBrokerUnreachable(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.commands", amqp.ExchangeDirect, "hcp.cmd.lab", "lab", amqp.Table{"x-queue-type": "quorum"})
	e.publishRaw("hcp.commands", "lab", "held", 1)
	proxy := transporttest.NewProxy(t, e.broker.AMQPAddr)
	opts := transport.Options{URL: e.broker.URLVia(proxy.Addr(), e.vhost), ConnectionName: "partitioned", Logger: testLogger(t), Metrics: newMetrics()}
	c, err := transport.Dial(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	pub, err := transport.NewPublisher(c, transport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan amqp.Delivery, 1)
	go func() {
		_ = c.Consume(ctx, "hcp.cmd.lab", 1, func(_ context.Context, d amqp.Delivery) { got <- d }) // never acked
	}()
	recv(t, got, 10*time.Second, "the delivery held unacked")

	proxy.Pause()
	if _, err := pub.PublishAsync(ctx, "hcp.commands", "lab", persistent("unconfirmed", "{}")); err != nil {
		t.Fatal(err)
	}
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelClose()
	start := time.Now()
	err = c.Close(closeCtx)
	took := time.Since(start)
	if err == nil {
		t.Error("Close reported success although work was left unsettled")
	}
	// 2 s of context plus the 5 s connection.close deadline, with slack.
	if took > 10*time.Second {
		t.Fatalf("Close took %s with the broker unreachable", took)
	}
	t.Logf("Close returned after %s: %v", took.Round(time.Millisecond), err)
}
