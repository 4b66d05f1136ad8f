package runner

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/sidecar/secretfile"
	"github.com/hcp-io/hcp-operator/internal/transport"
)

// closeTimeout bounds closing both AMQP connections at shutdown.
const closeTimeout = 15 * time.Second

// broker holds the sidecar's two AMQP connections. RabbitMQ's flow
// control (connection.blocked on a resource alarm, credit flow) throttles
// connections that publish, and a consumer sharing one would stop
// receiving and acknowledging too. The consume connection also carries
// the passive topology checks.
type broker struct {
	publish, consume *transport.Conn
	// publisher publishes on the publish connection (start makes it).
	publisher *transport.ConfirmPublisher
}

// dialBroker dials both connections and checks that the broker URL's user
// is HCP_USERNAME. On error nothing stays open. rotated is called when the
// mounted credentials change.
func dialBroker(ctx context.Context, cfg *config.Config, m *metrics.Metrics, log logr.Logger, rotated func()) (*broker, error) {
	url, err := amqpURLSource(cfg, log, rotated)
	if err != nil {
		return nil, err
	}
	o := transportOptions(cfg, url, m, log)
	if cfg.TLSCAFile != "" || cfg.TLSCertFile != "" {
		if o.TLS, err = transport.TLSConfig(cfg.TLSCAFile, cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
			return nil, err
		}
	}
	conns, err := dialBoth(ctx, o)
	if err != nil {
		return nil, err
	}
	b := &broker{publish: conns[0], consume: conns[1]}
	if b.consume.Username() != cfg.Username {
		b.close(log)
		return nil, fmt.Errorf("%s user %q differs from %s %q: every publish carries user_id %q, which the broker refuses unless it is the connection's user",
			config.EnvAMQPURL, b.consume.Username(), config.EnvUsername, cfg.Username, cfg.Username)
	}
	return b, nil
}

// start makes the publisher and waits until both connections are up.
func (b *broker) start(ctx context.Context) error {
	var err error
	if b.publisher, err = transport.NewPublisher(b.publish, transport.PublisherOptions{}); err != nil {
		return err
	}
	for _, c := range []*transport.Conn{b.publish, b.consume} {
		if err := c.WaitReady(ctx); err != nil {
			return err
		}
	}
	return nil
}

// ready is the readiness check of both connections.
func (b *broker) ready() error {
	for _, c := range []*transport.Conn{b.publish, b.consume} {
		if !c.Ready() {
			if err := c.LastError(); err != nil {
				return fmt.Errorf("%s connection not connected: %w", c.Role(), err)
			}
			return fmt.Errorf("%s connection not connected", c.Role())
		}
	}
	return nil
}

// close closes both connections, the consuming one first.
func (b *broker) close(log logr.Logger) {
	cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	for _, c := range []*transport.Conn{b.consume, b.publish} {
		if err := c.Close(cctx); err != nil {
			log.Error(err, "Failed to close an AMQP connection cleanly")
		}
	}
}

// amqpURLSource gives the broker URL: as set in the environment, or from
// the mounted credentials Secret (pods), reread at each dial so that a
// rotated password needs no restart and no secret sits in the environment.
func amqpURLSource(cfg *config.Config, log logr.Logger, rotated func()) (func() string, error) {
	if cfg.AMQPURLFile == "" {
		return func() string { return cfg.AMQPURL }, nil
	}
	f, err := secretfile.Load(cfg.AMQPURLFile, func(b []byte) (string, error) {
		u := strings.TrimSpace(string(b))
		return u, config.CheckAMQPURL(u)
	}, secretfile.Options[string]{
		OnChange: func(string) {
			log.Info("The broker credentials changed; the next connection uses them")
			rotated()
		},
		OnError: func(err error) {
			log.Error(err, "The rotated broker URL is unusable; keeping the previous one")
		},
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", config.EnvAMQPURLFile, err)
	}
	return f.Get, nil
}

// dialBoth dials the publish and the consume connection (named and
// labelled apart in the metrics).
func dialBoth(ctx context.Context, o transport.Options) ([]*transport.Conn, error) {
	conns := make([]*transport.Conn, 0, 2)
	for _, role := range []string{"publish", "consume"} {
		ro := o
		ro.Role, ro.ConnectionName = role, o.ConnectionName+" "+role
		c, err := transport.Dial(ctx, ro)
		if err != nil {
			for _, d := range conns {
				_ = d.Close(ctx)
			}
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// transportOptions are the options both AMQP connections share.
func transportOptions(cfg *config.Config, url func() string, m transport.Metrics, log logr.Logger) transport.Options {
	return transport.Options{
		URL:            url(),
		URLSource:      url,
		Addresses:      cfg.AMQPAddresses,
		Heartbeat:      cfg.Heartbeat,
		ConnectionName: fmt.Sprintf("hcp-sidecar %s %s %s", cfg.Mode, cfg.ID, cfg.PodName),
		Logger:         log.WithName("amqp"),
		Metrics:        m,
		// Caller mode: on shutdown, close the channel without basic.cancel so
		// the broker puts unacked events back at the head of the quorum queue
		// in order (a cancel sends in-transit ones to the back). See
		// internal/sidecar/caller/doc.go.
		DrainWithoutCancel: cfg.Mode == config.ModeCaller,
	}
}
