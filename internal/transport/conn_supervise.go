package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// dial makes one connection; node is the address it went to.
func (c *Conn) dial() (conn *amqp.Connection, node string, err error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(c.opts.ConnectionName)
	// The handshakes are not ctx-aware: Close aborts a dial in progress by
	// closing its socket.
	abort := func() bool { return false }
	defer func() { abort() }()
	dialed := ""
	var sock *wire
	cfg := amqp.Config{
		Heartbeat:  c.opts.Heartbeat,
		Properties: props,
		Locale:     "en_US",
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: c.opts.DialTimeout}
			nc, node, err := c.dialNode(c.stopCtx, &d, network, addr)
			if err != nil {
				return nil, err
			}
			dialed = node
			// As amqp091.DefaultDial: a deadline for the TLS and AMQP
			// handshakes, cleared by amqp091-go once the connection is open.
			if err := nc.SetDeadline(time.Now().Add(c.opts.DialTimeout)); err != nil {
				_ = nc.Close()
				return nil, err
			}
			abort = context.AfterFunc(c.stopCtx, func() { _ = nc.Close() })
			sock = &wire{Conn: nc}
			return sock, nil
		},
	}
	if c.opts.TLS != nil {
		cfg.TLSClientConfig = c.opts.TLS.Clone()
	}
	conn, err = amqp.DialConfig(c.dialURL(), cfg)
	if err == nil {
		c.wire.Store(sock)
	}
	if err != nil && dialed != "" {
		c.skipNode()
		err = fmt.Errorf("%s: %w", dialed, err)
	}
	return conn, dialed, err
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
// Losing a connection that had been up for at least StableAfter starts over:
// the first redial waits a random fraction of BackoffMin (spreading the
// reconnect storm when a broker drops every client at once). Losing one that
// was up for less counts as one more failure, so a flapping connection backs
// off like a failing dial. (StableAfter, not BackoffMax: a cluster restarted
// node by node drops a client once per node, a minute or so apart, and each
// loss would otherwise double the wait although the other nodes serve.)
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
		conn, node, err := c.dial()
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
			c.log.Info("Reconnected to the AMQP broker", "node", node, "failedAttempts", failures)
		} else {
			c.log.Info("Connected to the AMQP broker", "node", node)
		}
		everConnected = true

		lost := c.watch(conn, closes, blocks)
		if lost == nil { // stop requested
			return
		}
		if why := c.leaving.Swap(nil); why != nil {
			lost = fmt.Errorf("transport: left the node: %w", *why)
			c.skipNode()
		}
		c.setDisconnected(lost)
		if c.opts.Clock.Since(upSince) >= c.opts.StableAfter {
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
