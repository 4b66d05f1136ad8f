package benchutil

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Latencies are one measurement per request, in order.
type Latencies []time.Duration

// Percentile returns the p-quantile (0 < p ≤ 1) of l (0 when empty).
func (l Latencies) Percentile(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	i := min(int(float64(len(s))*p+0.5), len(s)) - 1
	return s[max(i, 0)]
}

func (l Latencies) String() string {
	return fmt.Sprintf("%d requests: p50 %v, p99 %v", len(l), l.Percentile(0.5).Round(time.Microsecond), l.Percentile(0.99).Round(time.Microsecond))
}

// RoundTrip measures n sequential request/reply round trips over two hops
// of raw amqp091-go, the least a task submit → task_accepted can cost on
// the wire: the requester publishes a persistent message to queue
// requests (confirmed), a responder consumes it and publishes a persistent
// reply to queue replies (confirmed), then acks; the requester's consumer
// receives the reply. Both queues must exist (quorum queues, like HCP's);
// url must allow using them.
//
// gap is an idle pause before each request (not timed): a request that
// follows idle time costs more than one in a tight loop (the processes on
// both ends and the broker wake up), so a baseline for operations that
// follow idle time must pause as they do.
func RoundTrip(ctx context.Context, url, requests, replies string, n, bodySize int, gap time.Duration) (Latencies, error) {
	return RoundTripThen(ctx, url, requests, replies, n, bodySize, gap, nil)
}

// RoundTripThen is RoundTrip with then(i), when not nil, called after the
// i-th reply, within the time measured: a round trip followed by what the
// system measured beside it does next on its path (an API create, say).
func RoundTripThen(ctx context.Context, url, requests, replies string, n, bodySize int, gap time.Duration, then func(i int) error) (Latencies, error) {
	publish := func(ch *amqp.Channel, queue string, id string, body []byte) error {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: body,
		})
		if err != nil {
			return err
		}
		ok, err := dc.WaitContext(ctx)
		if err == nil && !ok {
			err = errors.New("benchutil: publish nacked")
		}
		return err
	}
	body := Body(bodySize)

	// The responder.
	rc, rch, err := DialChannel(url, "bench-roundtrip-responder")
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	if err := rch.Confirm(false); err != nil {
		return nil, err
	}
	in, err := rch.Consume(requests, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	respErr := make(chan error, 1)
	go func() {
		for d := range in {
			if err := publish(rch, replies, d.MessageId, body); err != nil {
				respErr <- err
				return
			}
			if err := d.Ack(false); err != nil {
				respErr <- err
				return
			}
		}
	}()

	// The requester.
	qc, qch, err := DialChannel(url, "bench-roundtrip-requester")
	if err != nil {
		return nil, err
	}
	defer func() { _ = qc.Close() }()
	if err := qch.Confirm(false); err != nil {
		return nil, err
	}
	cc, cch, err := DialChannel(url, "bench-roundtrip-reply-consumer")
	if err != nil {
		return nil, err
	}
	defer func() { _ = cc.Close() }()
	out, err := cch.Consume(replies, "", true, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	lat := make(Latencies, 0, n)
	for i := range n {
		id := strconv.Itoa(i)
		if gap > 0 {
			select {
			case <-time.After(gap):
			case <-ctx.Done():
				return lat, ctx.Err()
			}
		}
		start := time.Now()
		if err := publish(qch, requests, id, body); err != nil {
			return lat, err
		}
		for {
			select {
			case d, ok := <-out:
				if !ok {
					return lat, errors.New("benchutil: reply consumer closed")
				}
				if d.MessageId != id {
					continue // a late reply of an earlier request
				}
			case err := <-respErr:
				return lat, err
			case <-ctx.Done():
				return lat, ctx.Err()
			}
			break
		}
		if then != nil {
			if err := then(i); err != nil {
				return lat, err
			}
		}
		lat = append(lat, time.Since(start))
	}
	return lat, nil
}
