package transport

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Conn owns one AMQP connection and keeps it up: a supervisor goroutine
// dials, watches the connection's NotifyClose and redials with exponential
// backoff (Options.BackoffMin…BackoffMax, with jitter). Publishers and
// consumers built on a Conn open their own channels on every new connection
// and re-apply confirm mode, QoS and subscriptions themselves.
//
// amqp091-go's built-in recovery (Config.Recovery) is deliberately not used:
// it retries at a fixed interval a bounded number of times, it resolves the
// pending deferred confirmations of a recovered channel as nacks (a broker
// refusal and a lost connection would look alike), and it reuses the same
// *amqp.Channel, so an application acking a delivery from before the
// reconnect sends a stale delivery tag on the new channel, which the broker
// answers by closing that channel (406 PRECONDITION_FAILED - unknown
// delivery tag). Fresh channels per connection make such acks fail locally
// with ErrStaleDelivery instead.
//
// Conn implements Consumer.
type Conn struct {
	opts Options
	uri  amqp.URI
	log  logr.Logger
	// lastURL is the URL of the last dial, nextAddr the index in
	// opts.Addresses the next dial starts from (the supervisor's alone).
	lastURL  string
	nextAddr int
	// leaving, when set, is why this process closed the current
	// connection to move to another node (leaveNode).
	leaving atomic.Pointer[error]
	// wire is the socket under the current connection (publishers hold
	// its writes back in a Batch).
	wire atomic.Pointer[wire]

	// stop ends the supervisor (hard stop); stopped is closed when it has.
	stopCtx context.Context
	stop    context.CancelFunc
	stopped chan struct{}

	mu        sync.Mutex
	conn      *amqp.Connection // nil while disconnected
	ready     chan struct{}    // closed while conn != nil
	lost      chan struct{}    // closed when conn is lost
	unblocked chan struct{}    // closed unless the broker blocked the connection
	lastErr   error
	closing   bool          // Close called: no new publishers or consumers
	closingCh chan struct{} // closed when closing is set
	users     sync.WaitGroup
	pubs      map[*ConfirmPublisher]struct{}
	consumers map[*consumer]struct{}
	tagSeq    uint64
}

// Dial validates opts and returns at once; a background supervisor makes the
// first connection and every later one. Use WaitReady to block until the
// connection is up (its error carries the last dial failure), and Ready for
// a readiness probe. Dial fails only for unusable options: an unparsable URL
// or TLS set on an amqp:// URL. Failures to connect, authentication and
// missing vhosts included, are retried with backoff, because in Kubernetes
// the broker user and its permissions may be created after the pod starts.
func Dial(ctx context.Context, opts Options) (*Conn, error) {
	opts = opts.withDefaults()
	uri, err := amqp.ParseURI(opts.URL)
	if err != nil {
		return nil, fmt.Errorf("transport: bad AMQP URL: %w", err)
	}
	if opts.TLS != nil && uri.Scheme != "amqps" {
		return nil, fmt.Errorf("transport: TLS is configured but the URL scheme is %s://; use amqps://", uri.Scheme)
	}
	if err := checkAddresses(opts.Addresses); err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	c := &Conn{
		opts:      opts,
		uri:       uri,
		log:       opts.Logger.WithValues("amqp", redactedURL(uri), "connectionName", opts.ConnectionName),
		stopped:   make(chan struct{}),
		ready:     make(chan struct{}),
		unblocked: make(chan struct{}),
		closingCh: make(chan struct{}),
		pubs:      map[*ConfirmPublisher]struct{}{},
		consumers: map[*consumer]struct{}{},
	}
	close(c.unblocked)
	// The supervisor outlives the ctx that Dial was called with; only Close
	// stops it. Values (loggers, tracing) are kept.
	c.stopCtx, c.stop = context.WithCancel(context.WithoutCancel(ctx))
	c.opts.Metrics.SetConnected(c.opts.Role, false)
	go c.supervise()
	return c, nil
}

// Role is the connection's role (Options.Role).
func (c *Conn) Role() string { return c.opts.Role }

// Username is the user in the URL: the value every publish must carry as
// user_id.
func (c *Conn) Username() string { return c.uri.Username }

// Vhost is the virtual host in the URL.
func (c *Conn) Vhost() string { return c.uri.Vhost }

// Ready reports whether the AMQP connection is up.
func (c *Conn) Ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn != nil
}

// Subscribed reports whether a consumer of queue is subscribed now
// (basic.consume accepted on a live channel), not merely running.
func (c *Conn) Subscribed(queue string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.consumers {
		if k.queue == queue && k.subscribed.Load() {
			return true
		}
	}
	return false
}

// LastError is the most recent dial failure or connection loss (nil when the
// connection has been up since).
func (c *Conn) LastError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

// WaitReady blocks until the connection is up, ctx ends (the error wraps
// ctx.Err() and names the last dial failure) or the Conn is closed
// (ErrClosed).
func (c *Conn) WaitReady(ctx context.Context) error {
	_, err := c.connection(ctx)
	return err
}

// connection returns the current connection, waiting for one.
func (c *Conn) connection(ctx context.Context) (*amqp.Connection, error) {
	for {
		c.mu.Lock()
		conn, ready, lost := c.conn, c.ready, c.lost
		c.mu.Unlock()
		if conn != nil {
			if !conn.IsClosed() {
				return conn, nil
			}
			// Closed, and the supervisor is about to notice.
			ready = lost
		}
		select {
		case <-c.stopped:
			return nil, ErrClosed
		case <-ready:
		case <-ctx.Done():
			if lastErr := c.LastError(); lastErr != nil {
				return nil, fmt.Errorf("transport: not connected to %s: %w (last error: %v)", redactedURL(c.uri), ctx.Err(), lastErr)
			}
			return nil, fmt.Errorf("transport: not connected to %s: %w", redactedURL(c.uri), ctx.Err())
		}
	}
}

// leaveNode closes conn, if it is still the current connection, so that
// the supervisor dials the next node: one that takes publishes but
// confirms none of them on two channels in a row, or does not answer a
// subscription, cannot reach the queues' leaders (a partition's minority
// before it pauses, a node that still places a leader on a lost node).
func (c *Conn) leaveNode(conn *amqp.Connection, why error) {
	c.mu.Lock()
	current := c.conn == conn
	c.mu.Unlock()
	if !current {
		return
	}
	if c.leaving.Swap(&why) == nil {
		c.log.Info("Leaving this broker node for the next one", "why", why.Error())
	}
	go func() { _ = conn.CloseDeadline(time.Now().Add(5 * time.Second)) }()
}

// unblockedCh is closed while the broker does not block the connection.
func (c *Conn) unblockedCh() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unblocked
}

// isBlocked reports whether the broker blocks the connection now.
func (c *Conn) isBlocked() bool {
	select {
	case <-c.unblockedCh():
		return false
	default:
		return true
	}
}

// waitUnblocked waits while the broker has blocked the connection
// (connection.blocked: memory or disk alarm), so that publishers wait with
// their ctx instead of inside a socket write that no ctx can interrupt.
func (c *Conn) waitUnblocked(ctx context.Context) error {
	select {
	case <-c.unblockedCh():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("transport: the broker blocks publishing (resource alarm): %w", ctx.Err())
	}
}
