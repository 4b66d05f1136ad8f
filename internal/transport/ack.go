package transport

import (
	"errors"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrStaleDelivery is returned by Ack, Nack and Reject on a delivery whose
// channel has closed (a reconnect happened while the handler held it). The
// acknowledgement cannot reach the broker, which requeues the message and
// delivers it again with Redelivered=true; the error is logged and otherwise
// harmless. It also matches amqp.ErrClosed with errors.Is.
var ErrStaleDelivery = errors.New("transport: delivery is from a closed channel; the broker will redeliver it")

// acker is the Acknowledger of every delivery handed to a handler: it keeps
// track of unsettled deliveries for draining, refuses to settle one twice
// (a second ack of the same tag makes the broker close the channel with 406
// PRECONDITION_FAILED, requeueing every unacked message on it) and turns an
// ack on a closed channel into a logged ErrStaleDelivery.
type acker struct {
	ch  *amqp.Channel
	t   *tracker
	log logr.Logger
}

func (a *acker) Ack(tag uint64, multiple bool) error {
	return a.settle("ack", tag, multiple, func() error { return a.ch.Ack(tag, multiple) })
}

func (a *acker) Nack(tag uint64, multiple, requeue bool) error {
	return a.settle("nack", tag, multiple, func() error { return a.ch.Nack(tag, multiple, requeue) })
}

func (a *acker) Reject(tag uint64, requeue bool) error {
	return a.settle("reject", tag, false, func() error { return a.ch.Reject(tag, requeue) })
}

func (a *acker) settle(op string, tag uint64, multiple bool, send func() error) error {
	if a.ch.IsClosed() {
		return a.stale(op, tag, amqp.ErrClosed)
	}
	a.t.sendMu.Lock()
	defer a.t.sendMu.Unlock()
	if !a.t.settle(tag, multiple) {
		return fmt.Errorf("transport: %s of delivery %d refused: already settled", op, tag)
	}
	return a.sent(op, tag, send())
}

// sent is the outcome of sending op's frame for tag: an error from a
// closed channel becomes ErrStaleDelivery.
func (a *acker) sent(op string, tag uint64, err error) error {
	if err != nil && (errors.Is(err, amqp.ErrClosed) || a.ch.IsClosed()) {
		return a.stale(op, tag, err)
	}
	return err
}

// AckAll acks deliveries with as few basic.ack frames as is safe: per
// channel, the deliveries below the lowest tag still unsettled on it
// (other than these) go in one ack with multiple=true, every other one in
// an ack of its own. A consumer that settles in bursts (a group commit)
// costs the broker and itself one frame per burst instead of one per
// message, and nothing that is not in ds is ever acked. Deliveries not
// from this package's consumers are acked one by one. It returns the first
// error; a delivery whose channel is gone counts as ErrStaleDelivery.
func AckAll(ds []amqp.Delivery) error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	// Each delivery has an acker of its own; those of one channel share
	// its tracker. A burst spans a handful of channels at most.
	type burst struct {
		a    *acker
		tags []uint64
	}
	var bursts []*burst
	for i := range ds {
		a, ok := ds[i].Acknowledger.(*acker)
		if !ok {
			keep(ds[i].Ack(false))
			continue
		}
		j := slices.IndexFunc(bursts, func(b *burst) bool { return b.a.ch == a.ch })
		if j < 0 {
			j = len(bursts)
			bursts = append(bursts, &burst{a: a})
		}
		bursts[j].tags = append(bursts[j].tags, ds[i].DeliveryTag)
	}
	for _, b := range bursts {
		keep(b.a.ackAll(b.tags))
	}
	return first
}

// ackAll acks tags of a's channel (see AckAll).
func (a *acker) ackAll(tags []uint64) error {
	if a.ch.IsClosed() {
		return a.stale("ack", tags[0], amqp.ErrClosed)
	}
	a.t.sendMu.Lock()
	defer a.t.sendMu.Unlock()
	upTo, single := a.t.settleAll(tags)
	var first error
	// The frames go out in one socket write (wire).
	a.t.wire.beginBatch()
	defer a.t.wire.endBatch()
	send := func(tag uint64, multiple bool) {
		var err error
		a.t.wire.own(func() { err = a.ch.Ack(tag, multiple) })
		if err = a.sent("ack", tag, err); err != nil && first == nil {
			first = err
		}
	}
	if upTo > 0 {
		send(upTo, true)
	}
	for _, tag := range single {
		send(tag, false)
	}
	return first
}

func (a *acker) stale(op string, tag uint64, cause error) error {
	a.log.Info("Ignored a "+op+" for a delivery from a closed channel; the broker redelivers it", "deliveryTag", tag)
	return fmt.Errorf("%w (%s of delivery %d): %w", ErrStaleDelivery, op, tag, cause)
}
