package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Consume implements Consumer. It subscribes to queue on a channel of its
// own with basic.qos(prefetch) (per consumer), manual acknowledgements and a
// consumer tag unique in the connection, and calls h for each delivery, one
// at a time, from a single goroutine. h should return promptly and may
// settle the delivery later from another goroutine. After a channel or
// connection loss it resubscribes (QoS included) as soon as the connection
// is back; a failed subscription (say the queue does not exist yet) is
// retried with the Conn's backoff and logged.
//
// The ctx passed to h is not Consume's ctx: it keeps its values, but is
// cancelled when the delivery's channel is gone (the delivery can no longer
// be acknowledged) or the drain time is over.
//
// When ctx ends, Consume drains: it cancels the subscription (basic.cancel),
// still hands the deliveries already received to h, waits up to
// Options.DrainTimeout for h to settle every delivery it got, closes the
// channel (the broker requeues what is unsettled) and returns ctx.Err().
// Conn.Close drains the same way within its own ctx; Consume then returns
// ErrClosed.
func (c *Conn) Consume(ctx context.Context, queue string, prefetch int, h Handler) error {
	if prefetch < 1 || prefetch > 65535 {
		return fmt.Errorf("transport: prefetch must be in 1..65535, got %d", prefetch)
	}
	if h == nil {
		return errors.New("transport: nil handler")
	}
	k := &consumer{
		c:        c,
		queue:    queue,
		prefetch: prefetch,
		h:        h,
		stopCh:   make(chan struct{}),
		abandon:  make(chan struct{}),
		done:     make(chan struct{}),
	}
	if err := c.register(nil, k); err != nil {
		return err
	}
	k.log = c.log.WithName("consumer").WithValues("queue", queue, "consumerTag", k.tag)
	defer c.unregister(nil, k)
	defer close(k.done)
	return k.run(ctx)
}

var _ Consumer = (*Conn)(nil)

type consumer struct {
	c        *Conn
	log      logr.Logger
	queue    string
	prefetch int
	h        Handler
	tag      string

	subscribed  atomic.Bool   // basic.consume succeeded on the current channel
	stopCh      chan struct{} // Conn.Close asks for a drain
	stopOnce    sync.Once
	abandon     chan struct{} // Conn.Close's ctx ended: stop draining
	abandonOnce sync.Once
	done        chan struct{} // Consume returned
}

// stopErr says why the consumer must stop, or nil.
func (k *consumer) stopErr(ctx context.Context) error {
	select {
	case <-k.stopCh:
		return ErrClosed
	default:
	}
	return ctx.Err()
}

func (k *consumer) run(ctx context.Context) error {
	// waitCtx ends on ctx or on Conn.Close, for the waits between channels.
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-k.stopCh:
			cancel()
		case <-waitCtx.Done():
		}
	}()
	failures := 0
	for {
		if err := k.stopErr(ctx); err != nil {
			return err
		}
		conn, err := k.c.connection(waitCtx)
		if err != nil {
			if stop := k.stopErr(ctx); stop != nil {
				return stop
			}
			return err
		}
		ch, deliveries, err := k.subscribe(conn)
		if err != nil {
			failures++
			delay := Backoff(failures, k.c.opts.BackoffMin, k.c.opts.BackoffMax, k.c.opts.Jitter, k.c.opts.Rand)
			k.log.Error(err, "Failed to subscribe", "retryIn", delay.Round(time.Millisecond).String())
			select {
			case <-waitCtx.Done():
			case <-k.c.opts.Clock.After(delay):
			}
			continue
		}
		if failures > 0 {
			k.log.Info("Subscribed after failures", "failures", failures)
		}
		failures = 0
		k.subscribed.Store(true)
		lost := k.serve(ctx, ch, deliveries)
		k.subscribed.Store(false)
		if lost == nil {
			return k.stopErr(ctx)
		}
		k.log.Error(lost, "Lost the consumer channel; resubscribing")
	}
}

// subscribe subscribes on conn within SubscribeTimeout; past it, the
// consumer leaves the node (the connection's close ends the call).
func (k *consumer) subscribe(conn *amqp.Connection) (*amqp.Channel, <-chan amqp.Delivery, error) {
	limit := k.c.opts.SubscribeTimeout
	if limit < 0 {
		return k.subscribeOn(conn)
	}
	type result struct {
		ch  *amqp.Channel
		d   <-chan amqp.Delivery
		err error
	}
	done := make(chan result, 1)
	go func() {
		ch, d, err := k.subscribeOn(conn)
		done <- result{ch, d, err}
	}()
	select {
	case r := <-done:
		return r.ch, r.d, r.err
	case <-k.c.opts.Clock.After(limit):
	}
	why := fmt.Errorf("subscribing to queue %q took longer than %s", k.queue, limit)
	k.c.leaveNode(conn, why)
	if r := <-done; r.err == nil {
		_ = r.ch.Close()
	}
	return nil, nil, why
}

func (k *consumer) subscribeOn(conn *amqp.Connection) (*amqp.Channel, <-chan amqp.Delivery, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	if err := ch.Qos(k.prefetch, 0, false); err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("basic.qos: %w", err)
	}
	d, err := ch.Consume(k.queue, k.tag, false, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("basic.consume on queue %q: %w", k.queue, err)
	}
	return ch, d, nil
}

// serve dispatches deliveries until the channel is lost (returning why) or
// the consumer stops (returning nil after draining).
func (k *consumer) serve(ctx context.Context, ch *amqp.Channel, deliveries <-chan amqp.Delivery) error {
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancels := ch.NotifyCancel(make(chan string, 1))
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	t := newTracker()
	t.wire = k.c.wire.Load()
	brokerCancelled := false
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				// The channel closed or the broker cancelled the
				// subscription (queue deleted): start over.
				hcancel()
				reason := errors.New("transport: delivery channel closed")
				select {
				case e := <-closes:
					if e != nil {
						reason = e
					}
				default:
				}
				if brokerCancelled {
					reason = fmt.Errorf("transport: the broker cancelled the subscription to queue %q (deleted?)", k.queue)
				}
				go func() { _ = ch.Close() }()
				return reason
			}
			k.dispatch(hctx, ch, t, d)
		case <-cancels:
			brokerCancelled = true
			cancels = nil
		case <-ctx.Done():
			return k.drain(ch, deliveries, closes, t, hctx, hcancel, k.c.opts.Clock.After(k.c.opts.DrainTimeout))
		case <-k.stopCh:
			return k.drain(ch, deliveries, closes, t, hctx, hcancel, nil)
		}
	}
}

// drain cancels the subscription (unless DrainWithoutCancel), hands the
// deliveries already buffered to the handler, waits for the handler to
// settle all of them (until timeout, Conn.Close's deadline or the channel's
// loss) and closes the channel.
func (k *consumer) drain(ch *amqp.Channel, deliveries <-chan amqp.Delivery, closes <-chan *amqp.Error, t *tracker, hctx context.Context, hcancel context.CancelFunc, timeout <-chan time.Time) error {
	cancelled := make(chan error, 1)
	if k.c.opts.DrainWithoutCancel {
		// No basic.cancel and no more hand-overs: whatever the handler has
		// not got stays unacked and returns in order when the channel closes.
		cancelled <- nil
		deliveries = nil
	} else {
		go func() { cancelled <- ch.Cancel(k.tag, false) }()
	}
	for deliveries != nil {
		select {
		case d, ok := <-deliveries:
			if !ok {
				deliveries = nil
				continue
			}
			k.dispatch(hctx, ch, t, d)
		case <-timeout:
			deliveries = nil
		case <-k.abandon:
			deliveries = nil
		}
	}
	select {
	case <-t.idle():
	case err := <-closes:
		if err != nil {
			k.log.Info("The channel closed while draining; unsettled deliveries return to the queue", "unsettled", t.len(), "reason", err.Error())
		}
	case <-timeout:
		k.log.Info("Drain time over; unsettled deliveries return to the queue", "unsettled", t.len())
	case <-k.abandon:
		k.log.Info("Shutdown deadline reached; unsettled deliveries return to the queue", "unsettled", t.len())
	}
	hcancel()
	select {
	case err := <-cancelled:
		if err != nil && !ch.IsClosed() {
			k.log.Error(err, "Failed to cancel the subscription")
		}
	default:
	}
	closed := make(chan struct{})
	go func() { _ = ch.Close(); close(closed) }()
	select {
	case <-closed:
	case <-k.abandon:
	}
	return nil
}

func (k *consumer) dispatch(ctx context.Context, ch *amqp.Channel, t *tracker, d amqp.Delivery) {
	if d.Redelivered {
		k.c.opts.Metrics.Redelivered()
	}
	t.add(d.DeliveryTag)
	d.Acknowledger = &acker{ch: ch, t: t, log: k.log}
	k.h(ctx, d)
}

// shutdown asks the consumer to drain and waits for it within ctx.
func (k *consumer) shutdown(ctx context.Context) error {
	k.stopOnce.Do(func() { close(k.stopCh) })
	select {
	case <-k.done:
		return nil
	case <-ctx.Done():
		k.abandonOnce.Do(func() { close(k.abandon) })
		return fmt.Errorf("transport: consumer of queue %q did not drain: %w", k.queue, ctx.Err())
	}
}
