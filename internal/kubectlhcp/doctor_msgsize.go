package kubectlhcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DocumentedMaxMessageSize is the broker's max_message_size that
// docs/install.md sets: HCP envelopes are at most 1 MiB, 8 MiB leaves room
// for everything HCP sends, and RabbitMQ's own default (128 MiB) lets a
// hostile publisher make a sidecar buffer 128 MiB per delivery.
const DocumentedMaxMessageSize = 8 << 20

// The broker's management API does not expose max_message_size (it is an
// application setting of the node), so the doctor asks the broker itself:
// it publishes one message of DocumentedMaxMessageSize+1 bytes over AMQP,
// unroutable (the default exchange, a queue name nobody declares), with a
// publisher confirm. A broker configured as documented closes the channel
// with 406 PRECONDITION_FAILED "message size … is larger than configured
// max size N", which names the setting; one that confirms the message
// accepts larger messages than documented. The probe stores nothing.

// sizeProbe is what the broker did with the probe.
type sizeProbe struct {
	// Refused: the broker closed the channel for the message's size.
	Refused bool
	// Limit is max_message_size as the refusal names it; 0 when it did
	// not.
	Limit int64
	// Reason is the broker's text.
	Reason string
}

// probeRoutingKey is the default exchange's routing key: a queue name no
// one declares, so a confirmed probe is dropped at once.
const probeRoutingKey = "hcp.doctor.max-message-size-probe"

var maxSizeInReason = regexp.MustCompile(`configured max size (\d+)`)

// probeMaxMessageSize publishes one unroutable message of size bytes to
// vhost on the broker at amqpURL (amqp[s]://HOST:PORT) and reports whether
// the broker refused it for its size.
func probeMaxMessageSize(ctx context.Context, amqpURL, username, password, vhost string, size int) (sizeProbe, error) {
	u, err := url.Parse(amqpURL)
	if err != nil || u.Host == "" {
		return sizeProbe{}, fmt.Errorf("AMQP URL %q does not parse", amqpURL)
	}
	u.User, u.Path, u.RawPath = nil, "", ""
	conn, err := amqp.DialConfig(u.String(), amqp.Config{
		SASL:  []amqp.Authentication{&amqp.PlainAuth{Username: username, Password: password}},
		Vhost: vhost,
		Dial:  amqp.DefaultDial(5 * time.Second),
	})
	if err != nil {
		return sizeProbe{}, fmt.Errorf("AMQP %s (vhost %s): %w", u.Host, vhost, err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return sizeProbe{}, fmt.Errorf("AMQP channel: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Confirm(false); err != nil {
		return sizeProbe{}, fmt.Errorf("AMQP confirm mode: %w", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := ch.PublishWithContext(ctx, "", probeRoutingKey, false, false, amqp.Publishing{Body: make([]byte, size)}); err != nil {
		var ae *amqp.Error
		if !errors.As(err, &ae) {
			return sizeProbe{}, fmt.Errorf("publishing the probe: %w", err)
		}
		// The channel closed while the body was on its way: the close says why.
	}
	select {
	case e := <-closed:
		return refusal(e)
	case c, ok := <-confirms:
		if !ok {
			// The confirm channel closes with the channel: read the reason.
			select {
			case e := <-closed:
				return refusal(e)
			case <-time.After(5 * time.Second):
				return sizeProbe{}, errors.New("the channel closed without a reason")
			}
		}
		if !c.Ack {
			return sizeProbe{}, errors.New("the broker nacked the probe (an internal error, not its size)")
		}
		return sizeProbe{}, nil
	case <-ctx.Done():
		return sizeProbe{}, fmt.Errorf("no confirm and no refusal for the probe: %w", ctx.Err())
	}
}

func refusal(e *amqp.Error) (sizeProbe, error) {
	if e == nil {
		return sizeProbe{}, errors.New("the channel closed without a reason")
	}
	if e.Code != amqp.PreconditionFailed {
		return sizeProbe{}, fmt.Errorf("the broker closed the channel: %w", e)
	}
	p := sizeProbe{Refused: true, Reason: e.Reason}
	if m := maxSizeInReason.FindStringSubmatch(e.Reason); m != nil {
		p.Limit, _ = strconv.ParseInt(m[1], 10, 64)
	}
	return p, nil
}

const checkMessageSize = "broker max_message_size"

// messageSizeFix is how to set the limit, for every check that asks for it.
const messageSizeFix = "set max_message_size = 8388608 in rabbitmq.conf, or in spec.rabbitmq.additionalConfig of the RabbitmqCluster (docs/install.md); " +
	"at run time until the next restart: rabbitmqctl eval 'application:set_env(rabbit, max_message_size, 8388608).'"

// messageSizeCheck turns the probe's outcome into a check: fine when the
// broker refuses a message above the documented limit, failed when it
// accepts one, a warning when the probe could not run.
func messageSizeCheck(broker string, p sizeProbe, err error) Check {
	name := checkMessageSize + " (" + broker + ")"
	probe := DocumentedMaxMessageSize + 1
	switch {
	case err != nil:
		return Check{Name: name, Status: CheckWarn,
			Detail: "unknown: the management API does not show it, and the probe (one unroutable message of " + strconv.Itoa(probe) + " bytes over AMQP) could not run: " + oneLine(err.Error(), 200),
			Fix:    "read it on a broker node: rabbitmqctl eval 'application:get_env(rabbit, max_message_size).' (undefined means RabbitMQ's default, 128 MiB); it must be at most 8388608 (docs/install.md)"}
	case !p.Refused:
		return Check{Name: name, Status: CheckFail,
			Detail: fmt.Sprintf("above %d bytes (8 MiB), the limit docs/install.md sets: the broker accepted a message of %d bytes (RabbitMQ's default is 128 MiB), so a hostile publisher can make a sidecar buffer that much per delivery", DocumentedMaxMessageSize, probe),
			Fix:    messageSizeFix}
	case p.Limit > 0:
		return Check{Name: name, Status: CheckOK,
			Detail: fmt.Sprintf("%d bytes (%s), at most the %d docs/install.md sets: larger publishes are refused before any consumer buffers them", p.Limit, mebibytes(p.Limit), DocumentedMaxMessageSize)}
	default:
		return Check{Name: name, Status: CheckOK,
			Detail: fmt.Sprintf("at most %d bytes: the broker refused a message of %d (%s)", DocumentedMaxMessageSize, probe, oneLine(p.Reason, 160))}
	}
}

func mebibytes(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// probeTarget is where the probe goes for a broker: the AMQP address the
// sidecars use (from a connection Secret: its amqpURL, else its management
// host on 5672), else, with --management-url, that host on 5672 (or amqps
// on 5671 for https).
func probeTarget(amqpURL, mgmtOverride string) string {
	if amqpURL != "" || mgmtOverride == "" {
		return amqpURL
	}
	u, err := url.Parse(mgmtOverride)
	if err != nil || u.Hostname() == "" {
		return ""
	}
	scheme, port := "amqp", "5672"
	if u.Scheme == "https" {
		scheme, port = "amqps", "5671"
	}
	return scheme + "://" + net.JoinHostPort(u.Hostname(), port)
}
