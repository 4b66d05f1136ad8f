package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Retry republishes a message until the broker confirms it: at once after
// a lost connection (the receiver deduplicates a copy that did arrive), with
// exponential backoff after a nack (a full queue with reject-publish). It
// stops on success, on ErrUnroutable (no queue is bound: retrying cannot
// help), ErrClosed, any other error, when ctx ends, after Max attempts,
// after MaxLost republishes for lost connections, or when Check refuses.
// The one reliable-publish loop of the sidecars.
type Retry struct {
	// Max bounds the publishes after the first; 0 means until ctx ends.
	Max int
	// MaxLost bounds the republishes after a lost connection (a message
	// that makes the broker close the channel would otherwise be sent
	// again forever); 0 means no bound but Max.
	MaxLost int
	// Check, when set, is asked before every republish; an error stops
	// the retries with it (a publisher that may no longer publish: a
	// fenced owner).
	Check func() error
	// BackoffMin and BackoffMax bound the delay after a nack (defaults
	// 100 ms and 5 s).
	BackoffMin, BackoffMax time.Duration
	// After is the clock (default time.After).
	After func(time.Duration) <-chan time.Time
	// OnRetry, when set, is told of each failed attempt before the next.
	OnRetry func(attempt int, err error)
	// Resent, when set, is called right after each republish of msg has
	// been sent, before its confirm is awaited: a caller that keeps its
	// own publishes in order sends those queued behind msg again there,
	// so that they follow it instead of going ahead of it.
	Resent func()
}

// Publish publishes msg and retries it until it is confirmed.
func (r Retry) Publish(ctx context.Context, p Publisher, exchange, key string, msg amqp.Publishing) error {
	return r.Confirm(ctx, p, exchange, key, msg, nil)
}

// Confirm waits for first (the confirmation of msg's first publish; nil
// publishes it now) and republishes msg until it is confirmed.
func (r Retry) Confirm(ctx context.Context, p Publisher, exchange, key string, msg amqp.Publishing, first Confirmation) error {
	minB, maxB := r.BackoffMin, r.BackoffMax
	if minB <= 0 {
		minB = 100 * time.Millisecond
	}
	if maxB < minB {
		maxB = max(5*time.Second, minB)
	}
	after := r.After
	if after == nil {
		after = time.After
	}
	conf := first
	backoff := minB
	lost := 0
	for attempt := 0; ; attempt++ {
		var err error
		if conf == nil {
			conf, err = p.PublishAsync(ctx, exchange, key, msg)
			if err == nil && attempt > 0 && r.Resent != nil {
				r.Resent()
			}
		}
		if err == nil {
			err = conf.Wait(ctx)
		}
		conf = nil
		if err == nil || ctx.Err() != nil || (r.Max > 0 && attempt >= r.Max) {
			return err
		}
		switch {
		case errors.Is(err, ErrConnectionLost):
			if lost++; r.MaxLost > 0 && lost > r.MaxLost {
				return fmt.Errorf("%w (republished %d times after a lost connection; giving up)", err, r.MaxLost)
			}
		case errors.Is(err, ErrNacked):
			select {
			case <-ctx.Done():
				return err
			case <-after(backoff):
			}
			backoff = min(backoff*2, maxB)
		default: // unroutable, closed, or not the broker's answer
			return err
		}
		if r.OnRetry != nil {
			r.OnRetry(attempt+1, err)
		}
		if r.Check != nil {
			if cerr := r.Check(); cerr != nil {
				return fmt.Errorf("%w (not republished: %w)", err, cerr)
			}
		}
	}
}
