package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
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
	// lastURL is the URL of the last dial (the supervisor's alone).
	lastURL string

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

// waitUnblocked waits while the broker has blocked the connection
// (connection.blocked: memory or disk alarm), so that publishers wait with
// their ctx instead of inside a socket write that no ctx can interrupt.
func (c *Conn) waitUnblocked(ctx context.Context) error {
	c.mu.Lock()
	ch := c.unblocked
	c.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("transport: the broker blocks publishing (resource alarm): %w", ctx.Err())
	}
}

func (c *Conn) dial() (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(c.opts.ConnectionName)
	// The handshakes are not ctx-aware: Close aborts a dial in progress by
	// closing its socket.
	abort := func() bool { return false }
	defer func() { abort() }()
	cfg := amqp.Config{
		Heartbeat:  c.opts.Heartbeat,
		Properties: props,
		Locale:     "en_US",
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: c.opts.DialTimeout}
			nc, err := d.DialContext(c.stopCtx, network, addr)
			if err != nil {
				return nil, err
			}
			// As amqp091.DefaultDial: a deadline for the TLS and AMQP
			// handshakes, cleared by amqp091-go once the connection is open.
			if err := nc.SetDeadline(time.Now().Add(c.opts.DialTimeout)); err != nil {
				_ = nc.Close()
				return nil, err
			}
			abort = context.AfterFunc(c.stopCtx, func() { _ = nc.Close() })
			return nc, nil
		},
	}
	if c.opts.TLS != nil {
		cfg.TLSClientConfig = c.opts.TLS.Clone()
	}
	return amqp.DialConfig(c.dialURL(), cfg)
}

// dialURL is the URL to dial now: the source's when it gives a usable one
// for the same user and vhost, else the last usable one. Only the
// supervisor calls it.
func (c *Conn) dialURL() string {
	if c.lastURL == "" {
		c.lastURL = c.opts.URL
	}
	if c.opts.URLSource == nil {
		return c.lastURL
	}
	u := c.opts.URLSource()
	p, err := amqp.ParseURI(u)
	switch {
	case err != nil:
		c.log.Error(nil, "The rotated AMQP URL does not parse; dialing the previous one")
	case p.Username != c.uri.Username || p.Vhost != c.uri.Vhost:
		c.log.Error(nil, "The rotated AMQP URL names another user or vhost; restart the sidecar to switch. Dialing the previous one",
			"user", p.Username, "vhost", p.Vhost)
	default:
		c.lastURL = u
	}
	return c.lastURL
}

// supervise dials, waits for the connection to close, and redials, until
// stop. Each failed dial doubles the delay from BackoffMin up to BackoffMax.
// Losing a connection that had been up for at least BackoffMax starts over:
// the first redial waits a random fraction of BackoffMin (spreading the
// reconnect storm when a broker drops every client at once). Losing one that
// was up for less counts as one more failure, so a flapping connection backs
// off like a failing dial.
func (c *Conn) supervise() {
	defer close(c.stopped)
	defer c.setDisconnected(ErrClosed)
	failures := 0
	everConnected := false
	var delay time.Duration
	for {
		if delay > 0 {
			select {
			case <-c.stopCtx.Done():
				return
			case <-c.opts.Clock.After(delay):
			}
		}
		if c.stopCtx.Err() != nil {
			return
		}
		conn, err := c.dial()
		if err != nil && c.stopCtx.Err() != nil {
			return // aborted by Close
		}
		if err != nil {
			failures++
			delay = Backoff(failures, c.opts.BackoffMin, c.opts.BackoffMax, c.opts.Jitter, c.opts.Rand)
			c.mu.Lock()
			c.lastErr = err
			c.mu.Unlock()
			c.log.Error(err, "Failed to connect to the AMQP broker", "attempt", failures, "retryIn", delay.Round(time.Millisecond).String())
			continue
		}
		closes := conn.NotifyClose(make(chan *amqp.Error, 1))
		blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
		upSince := c.opts.Clock.Now()
		c.setConnected(conn)
		if everConnected {
			c.opts.Metrics.Reconnected(c.opts.Role)
			c.log.Info("Reconnected to the AMQP broker", "failedAttempts", failures)
		} else {
			c.log.Info("Connected to the AMQP broker")
		}
		everConnected = true

		lost := c.watch(conn, closes, blocks)
		if lost == nil { // stop requested
			return
		}
		c.setDisconnected(lost)
		if c.opts.Clock.Since(upSince) >= c.opts.BackoffMax {
			failures = 0
			delay = time.Duration(c.opts.Rand() * float64(c.opts.BackoffMin))
		} else {
			// Flapping: keep growing the delay as if the dial had failed.
			failures++
			delay = Backoff(failures, c.opts.BackoffMin, c.opts.BackoffMax, c.opts.Jitter, c.opts.Rand)
		}
		c.log.Error(lost, "Lost the AMQP connection; reconnecting", "retryIn", delay.Round(time.Millisecond).String())
	}
}

// watch blocks until conn closes (returning why) or stop (returning nil,
// after closing conn).
func (c *Conn) watch(conn *amqp.Connection, closes chan *amqp.Error, blocks chan amqp.Blocking) error {
	for {
		select {
		case <-c.stopCtx.Done():
			_ = conn.CloseDeadline(time.Now().Add(5 * time.Second))
			return nil
		case b, ok := <-blocks:
			if !ok {
				blocks = nil
				continue
			}
			c.setBlocked(b)
		case e, ok := <-closes:
			if !ok || e == nil {
				// Closed without an error: only our own Close does that.
				if c.stopCtx.Err() != nil {
					return nil
				}
				return errors.New("transport: connection closed")
			}
			return e
		}
	}
}

func (c *Conn) setConnected(conn *amqp.Connection) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conn = conn
	c.lost = make(chan struct{})
	c.lastErr = nil
	close(c.ready)
	c.opts.Metrics.SetConnected(c.opts.Role, true)
}

func (c *Conn) setDisconnected(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn = nil
		c.ready = make(chan struct{})
		close(c.lost)
	}
	if err != nil && !errors.Is(err, ErrClosed) {
		c.lastErr = err
	}
	select {
	case <-c.unblocked:
	default:
		close(c.unblocked) // a new connection starts unblocked
	}
	c.opts.Metrics.SetConnected(c.opts.Role, false)
}

func (c *Conn) setBlocked(b amqp.Blocking) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.unblocked:
		if b.Active {
			c.unblocked = make(chan struct{})
			c.log.Info("Broker blocked publishing on this connection", "reason", b.Reason)
		}
	default:
		if !b.Active {
			close(c.unblocked)
			c.log.Info("Broker unblocked publishing on this connection")
		}
	}
}

// register adds a publisher or consumer, unless Close has begun.
func (c *Conn) register(p *ConfirmPublisher, k *consumer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return ErrClosed
	}
	c.users.Add(1)
	if p != nil {
		c.pubs[p] = struct{}{}
	}
	if k != nil {
		c.tagSeq++
		k.tag = consumerTag(c.opts.ConnectionName, k.queue, c.tagSeq)
		c.consumers[k] = struct{}{}
	}
	return nil
}

func (c *Conn) unregister(p *ConfirmPublisher, k *consumer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p != nil {
		delete(c.pubs, p)
	}
	if k != nil {
		delete(c.consumers, k)
	}
	c.users.Done()
}

// Close shuts the Conn down gracefully within ctx: consumers cancel their
// subscriptions (basic.cancel) and wait for their handlers to settle the
// deliveries they hold, publishers wait for outstanding confirms, then the
// channels and the connection close. Whatever is still unsettled when ctx
// ends is abandoned: unacked deliveries return to their queues
// (Redelivered=true) and pending confirmations fail with ErrConnectionLost.
// It returns ctx's error in that case. Closing twice returns ErrClosed.
func (c *Conn) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closing = true
	close(c.closingCh)
	pubs := make([]*ConfirmPublisher, 0, len(c.pubs))
	for p := range c.pubs {
		pubs = append(pubs, p)
	}
	cons := make([]*consumer, 0, len(c.consumers))
	for k := range c.consumers {
		cons = append(cons, k)
	}
	c.mu.Unlock()

	var errs []error
	var wg sync.WaitGroup
	var errMu sync.Mutex
	addErr := func(err error) {
		if err != nil && !errors.Is(err, ErrClosed) {
			errMu.Lock()
			errs = append(errs, err)
			errMu.Unlock()
		}
	}
	for _, k := range cons {
		wg.Go(func() { addErr(k.shutdown(ctx)) })
	}
	for _, p := range pubs {
		wg.Go(func() { addErr(p.Close(ctx)) })
	}
	settled := make(chan struct{})
	go func() { wg.Wait(); c.users.Wait(); close(settled) }()
	select {
	case <-settled:
	case <-ctx.Done():
		// A broker that stopped answering never sends the channels'
		// close-ok: closing the connection (CloseDeadline in watch) is
		// what ends their waits, so it must not wait for them.
		addErr(ctx.Err())
	}
	c.stop()
	<-c.stopped
	<-settled
	if len(errs) > 0 {
		return fmt.Errorf("transport: closed before all in-flight work settled: %w", errors.Join(errs...))
	}
	return nil
}

// consumerTag builds a tag unique within the connection and recognisable in
// the management UI: {connectionName}.{queue}.{n}, within AMQP's 255 bytes.
func consumerTag(connName, queue string, n uint64) string {
	suffix := fmt.Sprintf(".%d", n)
	tag := connName + "." + queue
	if len(tag)+len(suffix) > 255 {
		tag = tag[:255-len(suffix)]
	}
	return tag + suffix
}
