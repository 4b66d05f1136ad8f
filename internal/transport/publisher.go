package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
)

// CorrelationHeader is the header the publisher adds to a message that has no
// message_id, or whose (exchange, routing key, message_id) is already in
// flight on the channel, so that a basic.return can be matched to exactly one
// publish. basic.return carries the message's properties but no delivery
// tag; messages with a unique message_id are matched by it and go out
// unchanged.
const CorrelationHeader = "x-hcp-publish-id"

// connectionFailed: a publish failed because the connection did, not
// because of the message. amqp091-go returns the socket's write error
// (connection reset, broken pipe) as it is and closes its channels only
// afterwards, in another goroutine: such a publish must wait for the next
// channel like one that found the channel closed, or its event was lost.
func connectionFailed(err error) bool {
	var netErr net.Error
	return errors.Is(err, amqp.ErrClosed) || errors.As(err, &netErr) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrClosedPipe)
}

// PublisherOptions configure NewPublisher.
type PublisherOptions struct {
	// Window bounds the messages published but not yet confirmed (default
	// DefaultWindow). PublishAsync blocks while it is full.
	Window int
}

// ConfirmPublisher implements Publisher on a dedicated channel in confirm
// mode. Every message is published with mandatory set, through amqp091-go's
// PublishWithDeferredConfirmWithContext. One collector goroutine per channel
// resolves confirmations: it receives basic.return and waits for the
// deferred confirms, so a return (which RabbitMQ sends before the ack of the
// same message) is always recorded before that message's ack is looked at.
//
// When the channel or connection closes, every pending confirmation fails
// with ErrConnectionLost and PublishAsync blocks until a new channel is open
// on the next connection (or its ctx ends). It is safe for concurrent use;
// calls from one goroutine reach the broker in call order.
type ConfirmPublisher struct {
	c      *Conn
	log    logr.Logger
	win    chan struct{}
	nextID atomic.Uint64

	mu       sync.Mutex // serialises publishes; guards the fields below
	cur      *pubChannel
	ready    chan struct{} // closed while cur != nil
	closed   bool
	closedCh chan struct{}
	inflight sync.WaitGroup

	runCtx  context.Context
	runStop context.CancelFunc
	runDone chan struct{}
}

var _ Publisher = (*ConfirmPublisher)(nil)

// NewPublisher starts a publisher on c. Its channel opens (and reopens after
// every reconnect) in the background; publishing waits for it. Conn.Close
// closes the publisher too.
func NewPublisher(c *Conn, opts PublisherOptions) (*ConfirmPublisher, error) {
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	p := &ConfirmPublisher{
		c:        c,
		log:      c.log.WithName("publisher"),
		win:      make(chan struct{}, opts.Window),
		ready:    make(chan struct{}),
		closedCh: make(chan struct{}),
		runDone:  make(chan struct{}),
	}
	if err := c.register(p, nil); err != nil {
		return nil, err
	}
	p.runCtx, p.runStop = context.WithCancel(c.stopCtx)
	go p.run()
	return p, nil
}

// Publish publishes msg and waits for its confirmation.
func (p *ConfirmPublisher) Publish(ctx context.Context, exchange, routingKey string, msg amqp.Publishing) error {
	f, err := p.PublishAsync(ctx, exchange, routingKey, msg)
	if err != nil {
		return err
	}
	return f.Wait(ctx)
}

// PublishAsync publishes msg with mandatory set and returns once it is
// written to the channel. See Publisher.
func (p *ConfirmPublisher) PublishAsync(ctx context.Context, exchange, routingKey string, msg amqp.Publishing) (Confirmation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case p.win <- struct{}{}:
	case <-p.closedCh:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, fmt.Errorf("transport: publish window full (%d unconfirmed): %w", cap(p.win), ctx.Err())
	}
	f, err := p.publish(ctx, exchange, routingKey, msg)
	if err != nil {
		<-p.win
		return nil, err
	}
	return f, nil
}

func (p *ConfirmPublisher) publish(ctx context.Context, exchange, routingKey string, msg amqp.Publishing) (*confirmation, error) {
	for {
		pc, err := p.channel(ctx)
		if err != nil {
			return nil, err
		}
		if err := p.c.waitUnblocked(ctx); err != nil {
			return nil, err
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		if p.cur != pc {
			p.mu.Unlock()
			continue
		}
		f := &confirmation{exchange: exchange, routingKey: routingKey, done: make(chan struct{})}
		m := msg
		// Registered before the publish: its basic.return may be read
		// before PublishWithDeferredConfirm returns.
		pc.register(f, &m, p.newID)
		dc, err := pc.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey, true, false, m)
		if err != nil {
			pc.unregister(f)
			if connectionFailed(err) || pc.ch.IsClosed() {
				// Nothing reached the broker (a partly written message is
				// discarded with its channel): retry on the next channel.
				p.detachLocked(pc)
				p.mu.Unlock()
				continue
			}
			p.mu.Unlock()
			return nil, fmt.Errorf("transport: publishing to exchange %q with routing key %q: %w", exchange, routingKey, err)
		}
		f.dc = dc
		p.inflight.Add(1)
		pc.enqueue(f)
		p.mu.Unlock()
		return f, nil
	}
}

func (p *ConfirmPublisher) newID() string {
	return strconv.FormatUint(p.nextID.Add(1), 36)
}

// channel returns the open channel, waiting for one.
func (p *ConfirmPublisher) channel(ctx context.Context) (*pubChannel, error) {
	for {
		p.mu.Lock()
		pc, ready, closed := p.cur, p.ready, p.closed
		p.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		if pc != nil {
			return pc, nil
		}
		select {
		case <-ready:
		case <-p.closedCh:
			return nil, ErrClosed
		case <-ctx.Done():
			if last := p.c.LastError(); last != nil {
				return nil, fmt.Errorf("transport: no publishing channel: %w (last error: %v)", ctx.Err(), last)
			}
			return nil, fmt.Errorf("transport: no publishing channel: %w", ctx.Err())
		}
	}
}

// detachLocked stops new publishes from using pc. p.mu must be held.
func (p *ConfirmPublisher) detachLocked(pc *pubChannel) {
	if p.cur == pc {
		p.cur = nil
		p.ready = make(chan struct{})
	}
}

func (p *ConfirmPublisher) detach(pc *pubChannel) {
	p.mu.Lock()
	p.detachLocked(pc)
	p.mu.Unlock()
}

// Close stops accepting publishes (ErrClosed), waits within ctx for the
// outstanding confirms, then closes the channel; confirmations still pending
// then fail with ErrConnectionLost.
func (p *ConfirmPublisher) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	close(p.closedCh)
	p.mu.Unlock()
	defer p.c.unregister(p, nil)

	idle := make(chan struct{})
	go func() { p.inflight.Wait(); close(idle) }()
	var err error
	select {
	case <-idle:
	case <-ctx.Done():
		err = fmt.Errorf("transport: publisher closed with unconfirmed messages: %w", ctx.Err())
	}
	p.runStop()
	<-p.runDone
	return err
}

// run opens a confirm channel on every connection and collects its
// confirmations until it closes.
func (p *ConfirmPublisher) run() {
	defer close(p.runDone)
	failures := 0
	for {
		conn, err := p.c.connection(p.runCtx)
		if err != nil {
			return
		}
		pc, returns, closes, err := openConfirmChannel(conn)
		if err != nil {
			failures++
			delay := Backoff(failures, p.c.opts.BackoffMin, p.c.opts.BackoffMax, p.c.opts.Jitter, p.c.opts.Rand)
			p.log.Error(err, "Failed to open the publishing channel", "retryIn", delay.Round(time.Millisecond).String())
			select {
			case <-p.runCtx.Done():
				return
			case <-p.c.opts.Clock.After(delay):
			}
			continue
		}
		failures = 0
		p.mu.Lock()
		p.cur = pc
		close(p.ready)
		p.mu.Unlock()
		p.collect(pc, returns, closes)
		if p.runCtx.Err() != nil {
			return
		}
	}
}

func openConfirmChannel(conn *amqp.Connection) (*pubChannel, <-chan amqp.Return, <-chan *amqp.Error, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, nil, nil, fmt.Errorf("enabling confirm mode: %w", err)
	}
	// Registered before any publish, and drained without pause by collect:
	// amqp091-go drops a notification its listener has not taken within 5s.
	returns := ch.NotifyReturn(make(chan amqp.Return, 64))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	pc := &pubChannel{
		ch:    ch,
		byKey: map[corrKey]*confirmation{},
		byID:  map[string]*confirmation{},
		wake:  make(chan struct{}, 1),
	}
	return pc, returns, closes, nil
}

// collect resolves pc's confirmations in publish order until pc has closed
// and every confirmation is resolved.
func (p *ConfirmPublisher) collect(pc *pubChannel, returns <-chan amqp.Return, closes <-chan *amqp.Error) {
	stop := p.runCtx.Done()
	closed := false
	var head *confirmation
	drain := func() {
		for {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				pc.recordReturn(r, p.log)
			case e, ok := <-closes:
				if ok && e != nil {
					pc.closeErr = e
				}
				closes = nil
				closed = true
			default:
				return
			}
		}
	}
	for {
		if head == nil {
			head = pc.pop()
		}
		if head == nil && closed {
			// No publish can enqueue on pc once it is detached; anything
			// enqueued before is resolved by amqp091-go's channel shutdown.
			p.detach(pc)
			if head = pc.pop(); head == nil {
				return
			}
		}
		var headDone <-chan struct{}
		if head != nil {
			headDone = head.dc.Done()
		}
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			pc.recordReturn(r, p.log)
		case e, ok := <-closes:
			if ok && e != nil {
				pc.closeErr = e
				p.log.Error(e, "Publishing channel closed")
			}
			closes = nil
			closed = true
			p.detach(pc)
		case <-stop:
			stop = nil
			p.detach(pc)
			// Not here: Channel.Close waits for close-ok, which the reader
			// goroutine may only read after we take a pending return.
			go func() { _ = pc.ch.Close() }()
		case <-pc.wake:
		case <-headDone:
			// A return sent before this ack is already taken or buffered.
			drain()
			p.resolve(pc, head)
			head = nil
		}
	}
}

func (p *ConfirmPublisher) resolve(pc *pubChannel, f *confirmation) {
	result := ConfirmAck
	switch {
	case f.returned != nil:
		result = ConfirmReturned
		f.err = fmt.Errorf("%w: exchange %q, routing key %q: %d %s", ErrUnroutable, f.exchange, f.routingKey, f.returned.ReplyCode, f.returned.ReplyText)
	case f.dc.Acked():
	case pc.ch.IsClosed():
		// amqp091-go resolves the confirmations pending on a closing channel
		// as nacks; the channel is marked closed before it does.
		result = ConfirmLost
		if pc.closeErr != nil {
			// The broker's *amqp.Error stays reachable with errors.As:
			// 404 (no such exchange), 403 (no write permission) or 406
			// (user_id is not the authenticated user) mean the publish
			// itself was refused and retrying it will fail the same way.
			f.err = fmt.Errorf("%w: %w", ErrConnectionLost, pc.closeErr)
		} else {
			f.err = ErrConnectionLost
		}
	default:
		result = ConfirmNack
		f.err = fmt.Errorf("%w: exchange %q, routing key %q", ErrNacked, f.exchange, f.routingKey)
	}
	pc.unregister(f)
	close(f.done)
	<-p.win
	p.inflight.Done()
	p.c.opts.Metrics.Confirmed(result)
}

// confirmation implements Confirmation.
type confirmation struct {
	exchange, routingKey string
	dc                   *amqp.DeferredConfirmation
	key                  *corrKey // set when correlated by message_id
	id                   string   // set when correlated by CorrelationHeader
	returned             *amqp.Return
	err                  error
	done                 chan struct{}
}

func (f *confirmation) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

type corrKey struct{ exchange, routingKey, messageID string }

// pubChannel is one confirm-mode channel with its pending confirmations.
type pubChannel struct {
	ch       *amqp.Channel
	closeErr error // written and read by the collector only

	corrMu sync.Mutex
	byKey  map[corrKey]*confirmation
	byID   map[string]*confirmation

	qMu   sync.Mutex
	queue []*confirmation
	wake  chan struct{}
}

func (pc *pubChannel) register(f *confirmation, m *amqp.Publishing, newID func() string) {
	pc.corrMu.Lock()
	defer pc.corrMu.Unlock()
	if m.MessageId != "" {
		k := corrKey{f.exchange, f.routingKey, m.MessageId}
		if _, busy := pc.byKey[k]; !busy {
			pc.byKey[k] = f
			f.key = &k
			return
		}
	}
	f.id = newID()
	h := make(amqp.Table, len(m.Headers)+1)
	for k, v := range m.Headers {
		h[k] = v
	}
	h[CorrelationHeader] = f.id
	m.Headers = h
	pc.byID[f.id] = f
}

func (pc *pubChannel) unregister(f *confirmation) {
	pc.corrMu.Lock()
	defer pc.corrMu.Unlock()
	if f.key != nil && pc.byKey[*f.key] == f {
		delete(pc.byKey, *f.key)
	}
	if f.id != "" {
		delete(pc.byID, f.id)
	}
}

func (pc *pubChannel) recordReturn(r amqp.Return, log logr.Logger) {
	pc.corrMu.Lock()
	var f *confirmation
	if id, ok := r.Headers[CorrelationHeader].(string); ok {
		f = pc.byID[id]
	} else {
		f = pc.byKey[corrKey{r.Exchange, r.RoutingKey, r.MessageId}]
	}
	pc.corrMu.Unlock()
	if f == nil {
		log.Info("Received a basic.return for no pending publish", "exchange", r.Exchange, "routingKey", r.RoutingKey, "messageId", r.MessageId, "reply", r.ReplyText)
		return
	}
	f.returned = &amqp.Return{ReplyCode: r.ReplyCode, ReplyText: r.ReplyText, Exchange: r.Exchange, RoutingKey: r.RoutingKey}
}

func (pc *pubChannel) enqueue(f *confirmation) {
	pc.qMu.Lock()
	pc.queue = append(pc.queue, f)
	pc.qMu.Unlock()
	select {
	case pc.wake <- struct{}{}:
	default:
	}
}

func (pc *pubChannel) pop() *confirmation {
	pc.qMu.Lock()
	defer pc.qMu.Unlock()
	if len(pc.queue) == 0 {
		return nil
	}
	f := pc.queue[0]
	pc.queue[0] = nil
	pc.queue = pc.queue[1:]
	return f
}
