package conformance

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DocumentedMaxMessageSize is the broker limit docs/install.md ("Broker
// settings: a message size limit") asks for: max_message_size = 8388608.
// HCP envelopes are at most 1 MiB (envelope.MaxEnvelopeBytes); the L1
// specification sets no size. RabbitMQ's own default is 128 MiB before 4.0
// and 16 MiB from 4.0.
const DocumentedMaxMessageSize = 8 << 20

// probeKey routes nowhere on either exchange: its first word is empty, and
// no callee id (hcp.commands, direct) or caller binding {caller_id}.#
// (hcp.events, topic) has an empty first word.
const probeKey = ".hcp-conformance-size-probe"

var maxSizeRE = regexp.MustCompile(`max size (\d+)`)

// probeMessageSize publishes one message of limit+1 bytes to exchange
// with a routing key that reaches no queue, on a channel of its own. The
// management API does not show max_message_size (RabbitMQ 3.10–4.x), but
// the broker's refusal names it: "PRECONDITION_FAILED - message size N is
// larger than configured max size M". A refusal passes (the limit is M);
// an acceptance fails (the limit is above limit).
func probeMessageSize(ctx context.Context, conn *amqp.Connection, exchange string, limit int64, timeout time.Duration) (BrokerInfo, Result, string) {
	if conn == nil {
		return BrokerInfo{}, Fail, "not connected"
	}
	ch, err := conn.Channel()
	if err != nil {
		return BrokerInfo{}, Fail, fmt.Sprintf("open a channel for the probe: %v", err)
	}
	defer func() { _ = ch.Close() }()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Confirm(false); err != nil {
		return BrokerInfo{}, Fail, fmt.Sprintf("enable confirms for the probe: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	size := limit + 1
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, probeKey, false, false,
		amqp.Publishing{ContentType: "application/octet-stream", Body: make([]byte, size)})
	if err != nil {
		return BrokerInfo{}, Fail, fmt.Sprintf("publish the %d-byte probe: %v", size, err)
	}
	acked := make(chan bool, 1)
	go func() {
		ok, _ := dc.WaitContext(ctx)
		acked <- ok
	}()
	select {
	case e := <-closed:
		return judgeProbe(e, size, limit)
	case ok := <-acked:
		// A refusal closes the channel, which also ends the wait: prefer it.
		select {
		case e := <-closed:
			return judgeProbe(e, size, limit)
		case <-time.After(200 * time.Millisecond):
		}
		if !ok {
			return BrokerInfo{}, Fail, fmt.Sprintf("the %d-byte probe was neither confirmed nor refused within %s", size, timeout)
		}
		return BrokerInfo{MaxMessageSizeAbove: size}, Fail, fmt.Sprintf("the broker accepted a %d-byte message: its max_message_size is above the documented %d bytes (%s); set max_message_size = %d in rabbitmq.conf",
			size, limit, mib(limit), limit)
	}
}

// judgeProbe reads the broker's answer to the probe.
func judgeProbe(e *amqp.Error, size, limit int64) (BrokerInfo, Result, string) {
	if e == nil || e.Code != amqp.PreconditionFailed {
		return BrokerInfo{}, Fail, fmt.Sprintf("the %d-byte probe's channel closed with %v, not PRECONDITION_FAILED naming the max size", size, e)
	}
	m := maxSizeRE.FindStringSubmatch(e.Reason)
	if m == nil {
		return BrokerInfo{}, Pass, fmt.Sprintf("a %d-byte message refused: %s (the limit is at most %d bytes)", size, e.Reason, limit)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return BrokerInfo{MaxMessageSize: n}, Pass, fmt.Sprintf("max_message_size %d (%s), at most the documented %s: a %d-byte message refused (%s)", n, mib(n), mib(limit), size, e.Reason)
}

func mib(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
}
