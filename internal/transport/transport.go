// Package transport is the sidecar's AMQP 0-9-1 layer over amqp091-go: one
// long-lived connection with recovery (exponential backoff 1s…60s),
// heartbeats and TLS; a confirming publisher (persistent, mandatory, deferred
// confirms in a bounded window, returns turned into errors); and consumers with
// manual acknowledgements and prefetch that resume after every reconnect.
//
// Protocol logic (pkg/hcp, internal/sidecar) sees only the small interfaces
// below, so it can be unit-tested; this package itself is tested against a
// real RabbitMQ.
//
// # Where things are
//
//	transport.go       the interfaces and the errors a publish ends with
//	options.go         Options and their defaults, Backoff, TLSConfig
//	conn.go            Conn: Dial, its state, waiting for a connection
//	conn_supervise.go  dialling, and redialling with backoff when the connection is lost
//	conn_close.go      the publishers and consumers of a Conn, and its graceful Close
//	consumer.go        Consume: subscribe, dispatch, resubscribe, drain
//	ack.go             settling deliveries once each (acker), AckAll
//	tracker.go         the unsettled delivery tags of a channel
//	publisher.go       ConfirmPublisher: publish, Batch, wait for a channel, Close
//	wire.go            the socket under a connection: a batch's sends in one write
//	confirms.go        the confirm channel: opened per connection, returns and confirms resolved
//	retry.go           Retry: republish until confirmed
//	topology.go        Conn.CheckTopology: the exchanges and queues checked passively
//	metrics.go         the Metrics a Conn reports to
package transport

import (
	"context"
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Errors a publish can end with. Callers distinguish them with errors.Is.
var (
	// ErrUnroutable: the broker returned the message (mandatory flag): no
	// queue is bound for its routing key. Retrying will not help until the
	// topology changes.
	ErrUnroutable = errors.New("transport: message unroutable (returned by broker)")
	// ErrNacked: the broker refused the message (for example a queue with
	// x-overflow reject-publish is full). The message may be retried.
	ErrNacked = errors.New("transport: message nacked by broker")
	// ErrConnectionLost: the channel closed before the confirm arrived; the
	// message may or may not have been routed. Republish it (same message_id):
	// the receiver deduplicates.
	ErrConnectionLost = errors.New("transport: connection lost before confirm")
	// ErrClosed: the transport was shut down.
	ErrClosed = errors.New("transport: closed")
)

// Publisher publishes with publisher confirms.
type Publisher interface {
	// PublishAsync sends msg and returns once it is written to the channel,
	// without waiting for the confirm; messages published from one goroutine
	// reach the broker in call order. It blocks while the in-flight window is
	// full or the connection is down (until ctx ends). Delivery mode,
	// content type/encoding and user_id are the caller's to set on msg;
	// mandatory is always on.
	PublishAsync(ctx context.Context, exchange, routingKey string, msg amqp.Publishing) (Confirmation, error)
	// Publish is PublishAsync followed by Wait.
	Publish(ctx context.Context, exchange, routingKey string, msg amqp.Publishing) error
}

// InBatch runs publish, which calls p.PublishAsync several times, with
// the connection's socket writes held back until it returns, when p is a
// ConfirmPublisher (ConfirmPublisher.Batch); other Publishers just run it.
func InBatch(p Publisher, publish func()) {
	if b, ok := p.(interface{ Batch(func()) }); ok {
		b.Batch(publish)
		return
	}
	publish()
}

// Confirmation is the outcome of one PublishAsync.
type Confirmation interface {
	// Wait blocks until the broker confirmed (nil) or refused the message, it
	// was returned, or the connection was lost (ErrUnroutable, ErrNacked,
	// ErrConnectionLost), or ctx ended.
	Wait(ctx context.Context) error
}

// Handler processes one delivery. It owns the acknowledgement: it must call
// d.Ack, d.Nack or d.Reject exactly once, possibly later and from another
// goroutine. Deliveries from a channel that has since closed cannot be acked;
// the broker redelivers them (Redelivered=true) on the next channel.
type Handler func(ctx context.Context, d amqp.Delivery)

// Consumer consumes one queue with manual acks and a prefetch window.
type Consumer interface {
	// Consume runs until ctx ends, (re)subscribing after every reconnect.
	// exclusive is always false so a restarted consumer can resume.
	Consume(ctx context.Context, queue string, prefetch int, h Handler) error
	// Subscribed reports whether a consumer of queue is subscribed now.
	Subscribed(queue string) bool
}
