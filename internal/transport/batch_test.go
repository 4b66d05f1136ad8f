package transport_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/transport"
)

// publishN publishes n messages with ids prefix-0…n-1 (PublishAsync) and
// returns their confirmations.
func publishN(t *testing.T, ctx context.Context, p *transport.ConfirmPublisher, key, prefix string, n int) []transport.Confirmation {
	t.Helper()
	fs := make([]transport.Confirmation, 0, n)
	for i := range n {
		f, err := p.PublishAsync(ctx, "", key, amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: prefix + strconv.Itoa(i), Body: []byte("m")})
		if err != nil {
			t.Errorf("PublishAsync %d: %v", i, err)
			return fs
		}
		fs = append(fs, f)
	}
	return fs
}

func waitAll(t *testing.T, ctx context.Context, fs []transport.Confirmation) {
	t.Helper()
	for i, f := range fs {
		if err := f.Wait(ctx); err != nil {
			t.Fatalf("confirm %d: %v", i, err)
		}
	}
}

// TestBatchIsOneSocketWrite: amqp091-go writes each publish to the socket
// on its own; a Batch's publishes reach the broker in one write, all
// confirmed, in order.
func TestBatchIsOneSocketWrite(t *testing.T) {
	e := newEnv(t)
	e.declare("", "", "batched", "", amqp.Table{"x-queue-type": "quorum"})
	c := e.dial("batch", nil, func(o *transport.Options) { o.Heartbeat = time.Hour })
	p, err := transport.NewPublisher(c, transport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitAll(t, ctx, publishN(t, ctx, p, "batched", "warm-", 1)) // the channel is open

	before := transport.SocketWrites(c)
	one := publishN(t, ctx, p, "batched", "single-", 50)
	single := transport.SocketWrites(c) - before
	waitAll(t, ctx, one)

	before = transport.SocketWrites(c)
	var fs []transport.Confirmation
	p.Batch(func() { fs = publishN(t, ctx, p, "batched", "batch-", 50) })
	batched := transport.SocketWrites(c) - before
	waitAll(t, ctx, fs)

	t.Logf("50 publishes: %d socket writes one by one, %d in a batch", single, batched)
	if single < 50 {
		t.Errorf("50 publishes one by one made %d socket writes; amqp091-go writes each (did it change?)", single)
	}
	if batched != 1 {
		t.Errorf("a batch of 50 publishes made %d socket writes, want 1", batched)
	}
	ch := e.adminCh()
	for _, prefix := range []string{"warm-", "single-", "batch-"} {
		n := map[string]int{"warm-": 1}[prefix]
		if n == 0 {
			n = 50
		}
		for i := range n {
			d, ok, err := ch.Get("batched", true)
			if err != nil || !ok {
				t.Fatalf("get %s%d: ok=%v err=%v", prefix, i, ok, err)
			}
			if want := prefix + strconv.Itoa(i); d.MessageId != want {
				t.Fatalf("message %q where %q belongs: out of order", d.MessageId, want)
			}
		}
	}
}

// TestBatchLongerThanWindow: a batch that publishes more than the
// confirm window does not wait for confirms of messages it still holds
// back (it writes them first).
func TestBatchLongerThanWindow(t *testing.T) {
	e := newEnv(t)
	e.declare("", "", "window", "", amqp.Table{"x-queue-type": "quorum"})
	c := e.dial("batch-window", nil)
	p, err := transport.NewPublisher(c, transport.PublisherOptions{Window: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var fs []transport.Confirmation
	p.Batch(func() { fs = publishN(t, ctx, p, "window", "w-", 40) })
	waitAll(t, ctx, fs)
	if n := e.ready("window"); n != 40 {
		t.Fatalf("%d messages in the queue, want 40", n)
	}
}

// TestAckAllIsOneSocketWrite: the acks of one AckAll that cannot go in
// one frame (every other delivery of the channel is still unsettled) go
// in one socket write.
func TestAckAllIsOneSocketWrite(t *testing.T) {
	e := newEnv(t)
	e.declare("", "", "acked", "", amqp.Table{"x-queue-type": "quorum"})
	e.publishRaw("", "acked", "a-", 20)
	c := e.dial("ackall", nil, func(o *transport.Options) { o.Heartbeat = time.Hour })
	got := make(chan amqp.Delivery, 20)
	stop := consume(t, c, "acked", 20, func(_ context.Context, d amqp.Delivery) { got <- d })
	var ds []amqp.Delivery
	for range 20 {
		ds = append(ds, recv(t, got, 10*time.Second, "a delivery"))
	}
	var odd, even []amqp.Delivery
	for i, d := range ds {
		if i%2 == 0 {
			odd = append(odd, d) // tags 1, 3, 5, …
		} else {
			even = append(even, d)
		}
	}
	before := transport.SocketWrites(c)
	if err := transport.AckAll(odd); err != nil {
		t.Fatal(err)
	}
	if n := transport.SocketWrites(c) - before; n != 1 {
		t.Errorf("10 acks (one multiple, nine single) made %d socket writes, want 1", n)
	}
	if err := transport.AckAll(even); err != nil {
		t.Fatal(err)
	}
	_ = stop() // context.Canceled
	eventually(t, 10*time.Second, "the queue empty", func() bool { return e.ready("acked") == 0 })
}
