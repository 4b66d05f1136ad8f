package transport

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"time"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/utils/clock"
)

// Defaults for Options.
const (
	DefaultHeartbeat        = 30 * time.Second
	DefaultBackoffMin       = time.Second
	DefaultBackoffMax       = 60 * time.Second
	DefaultJitter           = 0.2
	DefaultDialTimeout      = 30 * time.Second
	DefaultStableAfter      = 10 * time.Second
	DefaultDrainTimeout     = 10 * time.Second
	DefaultConfirmStall     = 5 * time.Second
	DefaultSubscribeTimeout = 10 * time.Second
	// DefaultWindow is the publisher's default bound on unconfirmed messages.
	DefaultWindow = 256
)

// Options configure a Conn. Only URL is required.
type Options struct {
	// URL is amqp://user:pass@host:port/vhost or amqps://…; the vhost is one
	// path segment, so "/hcp" is written %2Fhcp.
	URL string
	// URLSource, when set, is asked for the URL at every dial (a mounted
	// credentials Secret that may have been rotated); URL is then the
	// first value, which fixes the username and vhost the Conn reports.
	URLSource func() string
	// Addresses, when set, are the broker nodes (HOST:PORT) to connect to
	// instead of the URL's host: a cluster without a load balancer in
	// front. Each dial tries them in order, starting from the one that
	// last worked (after a failed handshake, from the next one), and the
	// URL's user, vhost and TLS settings apply to each. For amqps, every
	// node's certificate must be valid for the URL's host name.
	Addresses []string
	// TLS is used for amqps:// URLs (build it with TLSConfig). It is cloned
	// per dial: amqp091-go writes ServerName into the config it is given.
	// Setting it with an amqp:// URL is an error rather than a silent
	// plaintext connection.
	TLS *tls.Config
	// Heartbeat is the AMQP heartbeat interval proposed to the broker;
	// 0 means DefaultHeartbeat. (amqp091-go cannot disable heartbeats from
	// its Config; a heartbeat=0 URL parameter can.)
	Heartbeat time.Duration
	// ConnectionName is sent as the connection_name client property, shown
	// by the management UI and rabbitmqctl list_connections. It also
	// prefixes consumer tags.
	ConnectionName string
	// Role names the connection in the metrics' connection label
	// ("publish", "consume"); default "amqp".
	Role string
	// Logger receives structured logs; the zero value discards them.
	Logger logr.Logger
	// Metrics, when set, receives the connection's state, its recoveries,
	// publisher confirm outcomes and redeliveries.
	Metrics Metrics
	// BackoffMin and BackoffMax bound the exponential redial backoff
	// (defaults 1s and 60s); Jitter is the ± fraction applied to each delay
	// (default 0.2; negative means none).
	BackoffMin, BackoffMax time.Duration
	Jitter                 float64
	// StableAfter is how long a connection must have been up for its loss
	// to start the backoff over (default 10s); a shorter-lived one counts
	// as one more failure (a flapping broker).
	StableAfter time.Duration
	// DialTimeout bounds TCP connect plus the TLS and AMQP handshakes of one
	// attempt (default 30s).
	DialTimeout time.Duration
	// DrainTimeout bounds how long a Consume whose ctx ended waits for its
	// handlers to settle the deliveries they hold (default 10s). Conn.Close
	// uses its own ctx instead.
	DrainTimeout time.Duration
	// DrainWithoutCancel makes a draining consumer skip basic.cancel: it
	// stops handing new deliveries to the handler, waits for the handler to
	// settle the ones it has, then closes the channel, so every unsettled
	// delivery returns to the head of the queue in order. With basic.cancel,
	// RabbitMQ (measured on 3.10 quorum queues) puts the messages in transit
	// to the consumer at that moment at the back of the queue, behind
	// everything already queued: harmless for independent commands, a
	// reordering (and, past a reorder buffer, a loss) for an ordered event
	// stream. The caller sidecar sets it.
	DrainWithoutCancel bool
	// ConfirmStall is how long a publishing channel may hold unconfirmed
	// messages without receiving a single confirm (ack, nack or return)
	// before the publisher closes it and opens another; its pending
	// confirmations then fail with ErrConnectionLost and are published
	// again (default 5s; negative: never). The case it exists for: a channel
	// opened right after a RabbitMQ node died sends a quorum queue's
	// enqueues to the leader it knew, on that node, and RabbitMQ 3.10 tells
	// it of the new leader only when the dead node is back; a new channel
	// opened once the queue has elected another leader confirms at once.
	// Not counted while the broker blocks the connection (a resource
	// alarm holds confirms back on purpose).
	ConfirmStall time.Duration
	// SubscribeTimeout bounds a consumer's subscription on a connection
	// (channel.open, basic.qos, basic.consume; default 10s; negative:
	// none). Past it the consumer leaves the node and subscribes through
	// the next: a basic.consume on a quorum queue whose leader the node
	// still places on a lost node waits for that node.
	SubscribeTimeout time.Duration
	// Clock drives backoff delays (default: the real clock).
	Clock clock.Clock
	// Rand returns values in [0,1) for jitter (default math/rand/v2).
	Rand func() float64
}

func (o Options) withDefaults() Options {
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.BackoffMin <= 0 {
		o.BackoffMin = DefaultBackoffMin
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.BackoffMax < o.BackoffMin {
		o.BackoffMax = o.BackoffMin
	}
	if o.Jitter == 0 {
		o.Jitter = DefaultJitter
	}
	if o.Jitter < 0 {
		o.Jitter = 0
	}
	if o.Jitter > 1 {
		o.Jitter = 1
	}
	if o.StableAfter <= 0 {
		o.StableAfter = DefaultStableAfter
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.ConfirmStall == 0 {
		o.ConfirmStall = DefaultConfirmStall
	}
	if o.SubscribeTimeout == 0 {
		o.SubscribeTimeout = DefaultSubscribeTimeout
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	if o.Metrics == nil {
		o.Metrics = noMetrics{}
	}
	if o.Role == "" {
		o.Role = "amqp"
	}
	if o.ConnectionName == "" {
		o.ConnectionName = "hcp"
	}
	return o
}

// Backoff returns the delay before redial attempt n (n ≥ 1 counts
// consecutive failures): min·2^(n-1) capped at max, then scaled by a random
// factor in [1-jitter, 1+jitter] drawn from rnd (values in [0,1)).
func Backoff(n int, min, max time.Duration, jitter float64, rnd func() float64) time.Duration {
	if n < 1 {
		n = 1
	}
	d := min
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	if jitter > 0 && rnd != nil {
		d = time.Duration(float64(d) * (1 + jitter*(2*rnd()-1)))
	}
	return d
}

// TLSConfig builds the client TLS configuration for amqps from PEM files.
// caFile, when set, replaces the system roots for verifying the broker;
// certFile and keyFile, when set (both or neither), are the client
// certificate for mutual TLS (RabbitMQ's EXTERNAL mechanism or
// verify_peer). TLS 1.2 is the minimum.
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pemBytes, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("transport: reading TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemBytes) {
			return nil, fmt.Errorf("transport: TLS CA file %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case certFile == "" && keyFile == "":
	case certFile == "" || keyFile == "":
		return nil, errors.New("transport: TLS client certificate and key files must be set together")
	default:
		for _, f := range []struct{ what, path, block string }{{"certificate", certFile, "CERTIFICATE"}, {"key", keyFile, "PRIVATE KEY"}} {
			b, err := os.ReadFile(f.path)
			if err != nil {
				return nil, fmt.Errorf("transport: reading TLS client %s file: %w", f.what, err)
			}
			if blk, _ := pem.Decode(b); blk == nil {
				return nil, fmt.Errorf("transport: TLS client %s file %s holds no PEM block (want %s)", f.what, f.path, f.block)
			}
		}
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("transport: loading TLS client certificate %s and key %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// redactedURL renders an AMQP URI without its password, for logs and errors.
func redactedURL(u amqp.URI) string {
	user := ""
	if u.Username != "" {
		user = u.Username + "@"
	}
	return fmt.Sprintf("%s://%s%s:%d/%s", u.Scheme, user, u.Host, u.Port, url.PathEscape(u.Vhost))
}
