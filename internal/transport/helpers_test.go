package transport_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/internal/transport/transporttest"
)

// env is one test's broker, vhost and raw admin channel.
type env struct {
	t      *testing.T
	broker *transporttest.Broker
	vhost  string
	url    string
	admin  *amqp.Channel
}

func newEnv(t *testing.T) *env {
	t.Helper()
	b := transporttest.RabbitMQ(t)
	vhost := b.NewVhost(t)
	e := &env{t: t, broker: b, vhost: vhost, url: b.URL(vhost)}
	conn, err := amqp.Dial(e.url)
	if err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	e.admin, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// adminCh returns a working raw channel (a failed passive declare closes it).
func (e *env) adminCh() *amqp.Channel {
	e.t.Helper()
	if e.admin.IsClosed() {
		conn, err := amqp.Dial(e.url)
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() { _ = conn.Close() })
		if e.admin, err = conn.Channel(); err != nil {
			e.t.Fatal(err)
		}
	}
	return e.admin
}

// declare creates exchange (kind), queue (with args) and a binding.
func (e *env) declare(exchange, kind, queue, bindingKey string, args amqp.Table) {
	e.t.Helper()
	ch := e.adminCh()
	if exchange != "" {
		if err := ch.ExchangeDeclare(exchange, kind, true, false, false, false, nil); err != nil {
			e.t.Fatalf("declaring exchange %s: %v", exchange, err)
		}
	}
	if queue != "" {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
			e.t.Fatalf("declaring queue %s: %v", queue, err)
		}
		if exchange != "" {
			if err := ch.QueueBind(queue, bindingKey, exchange, false, nil); err != nil {
				e.t.Fatalf("binding %s: %v", queue, err)
			}
		}
	}
}

// ready returns the number of ready messages in queue (exact, from a
// passive declare; the management API lags).
func (e *env) ready(queue string) int {
	e.t.Helper()
	q, err := e.adminCh().QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		e.t.Fatalf("passive declare %s: %v", queue, err)
	}
	return q.Messages
}

// publishRaw publishes persistent messages with ids prefix-0…n-1.
func (e *env) publishRaw(exchange, key, prefix string, n int) {
	e.t.Helper()
	ch := e.adminCh()
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), exchange, key, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: prefix + strconv.Itoa(i), Body: []byte(prefix + strconv.Itoa(i)),
		})
		if err != nil {
			e.t.Fatal(err)
		}
		if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
			e.t.Fatalf("raw publish %d: ok=%v err=%v", i, ok, err)
		}
	}
}

// testLogger logs through t until the test's cleanups are over.
func testLogger(t *testing.T) logr.Logger {
	var done atomic.Bool
	t.Cleanup(func() { done.Store(true) }) // registered first: runs last
	return funcr.New(func(prefix, args string) {
		if !done.Load() {
			t.Log(prefix, args)
		}
	}, funcr.Options{Verbosity: 1})
}

// recorder is a transport.Metrics that keeps what it is told, for
// assertions.
type recorder struct {
	mu          sync.Mutex
	connected   map[string]bool
	reconnects  map[string]int
	confirms    map[string]int
	redelivered int
}

func newMetrics() *recorder {
	return &recorder{connected: map[string]bool{}, reconnects: map[string]int{}, confirms: map[string]int{}}
}

func (r *recorder) SetConnected(role string, up bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.connected[role] = up
}

func (r *recorder) Reconnected(role string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reconnects[role]++
}

func (r *recorder) Confirmed(result string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.confirms[result]++
}

func (r *recorder) Redelivered() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.redelivered++
}

// isConnected is the last state reported for role.
func (r *recorder) isConnected(role string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connected[role]
}

// reconnectCount is how many recoveries were reported for role.
func (r *recorder) reconnectCount(role string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reconnects[role]
}

// confirmCount is how many confirms had result.
func (r *recorder) confirmCount(result string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.confirms[result]
}

// redeliveryCount is how many redelivered deliveries were reported.
func (r *recorder) redeliveryCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.redelivered
}

// dial opens a Conn with fast backoff and closes it when the test ends.
func (e *env) dial(name string, m *recorder, mod ...func(*transport.Options)) *transport.Conn {
	e.t.Helper()
	return e.dialURL(e.url, name, m, mod...)
}

func (e *env) dialURL(url, name string, m *recorder, mod ...func(*transport.Options)) *transport.Conn {
	e.t.Helper()
	opts := transport.Options{
		URL:            url,
		ConnectionName: name,
		Logger:         testLogger(e.t).WithName(name),
		BackoffMin:     50 * time.Millisecond,
		BackoffMax:     500 * time.Millisecond,
		DrainTimeout:   2 * time.Second,
	}
	if m != nil { // a nil *recorder is not a nil transport.Metrics
		opts.Metrics = m
	}
	for _, f := range mod {
		f(&opts)
	}
	c, err := transport.Dial(context.Background(), opts)
	if err != nil {
		e.t.Fatalf("Dial: %v", err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil && !errors.Is(err, transport.ErrClosed) {
			e.t.Errorf("Close: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		e.t.Fatalf("WaitReady: %v", err)
	}
	return c
}

// consume runs c.Consume in the background; the returned stop cancels it
// and waits for it to return, giving its error.
func consume(t *testing.T, c *transport.Conn, queue string, prefetch int, h transport.Handler) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Consume(ctx, queue, prefetch, h) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(30 * time.Second):
				err = errors.New("Consume did not return within 30s")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// eventually polls cond every 20ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recv receives from ch within d.
func recv[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
		var zero T
		return zero
	}
}
