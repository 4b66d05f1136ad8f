package transport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrStaleDelivery is returned by Ack, Nack and Reject on a delivery whose
// channel has closed (a reconnect happened while the handler held it). The
// acknowledgement cannot reach the broker, which requeues the message and
// delivers it again with Redelivered=true; the error is logged and otherwise
// harmless. It also matches amqp.ErrClosed with errors.Is.
var ErrStaleDelivery = errors.New("transport: delivery is from a closed channel; the broker will redeliver it")

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

func (k *consumer) subscribe(conn *amqp.Connection) (*amqp.Channel, <-chan amqp.Delivery, error) {
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

// acker is the Acknowledger of every delivery handed to a handler: it keeps
// track of unsettled deliveries for draining, refuses to settle one twice
// (a second ack of the same tag makes the broker close the channel with 406
// PRECONDITION_FAILED, requeueing every unacked message on it) and turns an
// ack on a closed channel into a logged ErrStaleDelivery.
type acker struct {
	ch  *amqp.Channel
	t   *tracker
	log logr.Logger
}

func (a *acker) Ack(tag uint64, multiple bool) error {
	return a.settle("ack", tag, multiple, func() error { return a.ch.Ack(tag, multiple) })
}

func (a *acker) Nack(tag uint64, multiple, requeue bool) error {
	return a.settle("nack", tag, multiple, func() error { return a.ch.Nack(tag, multiple, requeue) })
}

func (a *acker) Reject(tag uint64, requeue bool) error {
	return a.settle("reject", tag, false, func() error { return a.ch.Reject(tag, requeue) })
}

func (a *acker) settle(op string, tag uint64, multiple bool, send func() error) error {
	if a.ch.IsClosed() {
		return a.stale(op, tag, amqp.ErrClosed)
	}
	a.t.sendMu.Lock()
	defer a.t.sendMu.Unlock()
	if !a.t.settle(tag, multiple) {
		return fmt.Errorf("transport: %s of delivery %d refused: already settled", op, tag)
	}
	return a.sent(op, tag, send())
}

// sent is the outcome of sending op's frame for tag: an error from a
// closed channel becomes ErrStaleDelivery.
func (a *acker) sent(op string, tag uint64, err error) error {
	if err != nil && (errors.Is(err, amqp.ErrClosed) || a.ch.IsClosed()) {
		return a.stale(op, tag, err)
	}
	return err
}

// AckAll acks deliveries with as few basic.ack frames as is safe: per
// channel, the deliveries below the lowest tag still unsettled on it
// (other than these) go in one ack with multiple=true, every other one in
// an ack of its own. A consumer that settles in bursts (a group commit)
// costs the broker and itself one frame per burst instead of one per
// message, and nothing that is not in ds is ever acked. Deliveries not
// from this package's consumers are acked one by one. It returns the first
// error; a delivery whose channel is gone counts as ErrStaleDelivery.
func AckAll(ds []amqp.Delivery) error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	// Each delivery has an acker of its own; those of one channel share
	// its tracker. A burst spans a handful of channels at most.
	type burst struct {
		a    *acker
		tags []uint64
	}
	var bursts []*burst
	for i := range ds {
		a, ok := ds[i].Acknowledger.(*acker)
		if !ok {
			keep(ds[i].Ack(false))
			continue
		}
		j := slices.IndexFunc(bursts, func(b *burst) bool { return b.a.ch == a.ch })
		if j < 0 {
			j = len(bursts)
			bursts = append(bursts, &burst{a: a})
		}
		bursts[j].tags = append(bursts[j].tags, ds[i].DeliveryTag)
	}
	for _, b := range bursts {
		keep(b.a.ackAll(b.tags))
	}
	return first
}

// ackAll acks tags of a's channel (see AckAll).
func (a *acker) ackAll(tags []uint64) error {
	if a.ch.IsClosed() {
		return a.stale("ack", tags[0], amqp.ErrClosed)
	}
	a.t.sendMu.Lock()
	defer a.t.sendMu.Unlock()
	upTo, single := a.t.settleAll(tags)
	var first error
	send := func(tag uint64, multiple bool) {
		if err := a.sent("ack", tag, a.ch.Ack(tag, multiple)); err != nil && first == nil {
			first = err
		}
	}
	if upTo > 0 {
		send(upTo, true)
	}
	for _, tag := range single {
		send(tag, false)
	}
	return first
}

func (a *acker) stale(op string, tag uint64, cause error) error {
	a.log.Info("Ignored a "+op+" for a delivery from a closed channel; the broker redelivers it", "deliveryTag", tag)
	return fmt.Errorf("%w (%s of delivery %d): %w", ErrStaleDelivery, op, tag, cause)
}

// tracker holds the delivery tags of one channel not yet settled.
type tracker struct {
	// sendMu is held from settling tags here to sending their frame: an
	// ack with multiple=true covers every tag below it that is settled
	// here, so a nack settled here must be on the wire before it.
	sendMu sync.Mutex
	mu     sync.Mutex
	tags   map[uint64]struct{}
	idleCh chan struct{} // closed while tags is empty
}

func newTracker() *tracker {
	t := &tracker{tags: map[uint64]struct{}{}, idleCh: make(chan struct{})}
	close(t.idleCh)
	return t
}

func (t *tracker) add(tag uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.tags) == 0 {
		t.idleCh = make(chan struct{})
	}
	t.tags[tag] = struct{}{}
}

// settle removes tag (and with multiple every smaller tag) and reports
// whether anything was unsettled.
func (t *tracker) settle(tag uint64, multiple bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	found := false
	if multiple {
		for k := range t.tags {
			if k <= tag {
				delete(t.tags, k)
				found = true
			}
		}
	} else if _, ok := t.tags[tag]; ok {
		delete(t.tags, tag)
		found = true
	}
	if found && len(t.tags) == 0 {
		close(t.idleCh)
	}
	return found
}

// settleAll removes the unsettled ones of tags. upTo (0: none) is the
// highest of them below every other unsettled tag, so one ack with
// multiple=true settles exactly those; single are the rest, to ack one by
// one. Tags delivered later are higher than all of these: a concurrent
// delivery never falls under upTo.
func (t *tracker) settleAll(tags []uint64) (upTo uint64, single []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	mine := make(map[uint64]bool, len(tags))
	for _, tag := range tags {
		if _, ok := t.tags[tag]; ok {
			mine[tag] = true
		}
	}
	if len(mine) == 0 {
		return 0, nil
	}
	var lowestOther uint64 // 0: none
	for k := range t.tags {
		if !mine[k] && (lowestOther == 0 || k < lowestOther) {
			lowestOther = k
		}
	}
	for tag := range mine {
		delete(t.tags, tag)
		if lowestOther == 0 || tag < lowestOther {
			upTo = max(upTo, tag)
		} else {
			single = append(single, tag)
		}
	}
	slices.Sort(single)
	if len(t.tags) == 0 {
		close(t.idleCh)
	}
	return upTo, single
}

func (t *tracker) idle() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.idleCh
}

func (t *tracker) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.tags)
}
