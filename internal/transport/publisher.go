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
	default:
		p.flushHeld()
		select {
		case p.win <- struct{}{}:
		case <-p.closedCh:
			return nil, ErrClosed
		case <-ctx.Done():
			return nil, fmt.Errorf("transport: publish window full (%d unconfirmed): %w", cap(p.win), ctx.Err())
		}
	}
	f, err := p.publish(ctx, exchange, routingKey, msg)
	if err != nil {
		<-p.win
		return nil, err
	}
	return f, nil
}

// Batch runs publish, which calls PublishAsync several times, with the
// socket writes of those publishes held back until it returns: the
// messages reach the broker in one write instead of one each (wire). A
// publish that must wait (for the window, a channel, the broker to unblock
// the connection) first writes what is held, so that it never waits for
// an answer to something held back. Other writes on the connection are
// not held.
func (p *ConfirmPublisher) Batch(publish func()) {
	w := p.c.wire.Load()
	w.beginBatch()
	defer w.endBatch()
	publish()
}

// flushHeld writes what a Batch holds back, before a publish waits.
func (p *ConfirmPublisher) flushHeld() { p.c.wire.Load().flush() }

func (p *ConfirmPublisher) publish(ctx context.Context, exchange, routingKey string, msg amqp.Publishing) (*confirmation, error) {
	for {
		pc, err := p.channel(ctx)
		if err != nil {
			return nil, err
		}
		if p.c.isBlocked() {
			p.flushHeld()
			if err := p.c.waitUnblocked(ctx); err != nil {
				return nil, err
			}
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
		var dc *amqp.DeferredConfirmation
		p.c.wire.Load().own(func() {
			dc, err = pc.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey, true, false, m)
		})
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
		p.flushHeld()
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
