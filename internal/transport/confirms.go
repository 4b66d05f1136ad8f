package transport

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/utils/clock"
)

// run opens a confirm channel on every connection and collects its
// confirmations until it closes.
func (p *ConfirmPublisher) run() {
	defer close(p.runDone)
	failures := 0
	var stalledOn *amqp.Connection
	for {
		conn, err := p.c.connection(p.runCtx)
		if err != nil {
			return
		}
		pc, returns, closes, err := openConfirmChannel(conn)
		if err != nil {
			failures++
			delay := Backoff(failures, p.c.opts.BackoffMin, p.c.opts.BackoffMax, p.c.opts.Jitter, p.c.opts.Rand)
			p.log.Error(err, "Failed to open the publishing channel", "retryIn", delay.Round(time.Millisecond).String())
			select {
			case <-p.runCtx.Done():
				return
			case <-p.c.opts.Clock.After(delay):
			}
			continue
		}
		failures = 0
		p.mu.Lock()
		p.cur = pc
		close(p.ready)
		p.mu.Unlock()
		stalled := p.collect(pc, returns, closes)
		if p.runCtx.Err() != nil {
			return
		}
		switch {
		case !stalled:
			stalledOn = nil
		case stalledOn == conn:
			p.c.leaveNode(conn, fmt.Errorf("no publish acked on two channels in a row, each for %s", p.c.opts.ConfirmStall))
			stalledOn = nil
		default:
			stalledOn = conn
		}
	}
}

func openConfirmChannel(conn *amqp.Connection) (*pubChannel, <-chan amqp.Return, <-chan *amqp.Error, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, nil, nil, fmt.Errorf("enabling confirm mode: %w", err)
	}
	// Registered before any publish, and drained without pause by collect:
	// amqp091-go drops a notification its listener has not taken within 5s.
	returns := ch.NotifyReturn(make(chan amqp.Return, 64))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	pc := &pubChannel{
		conn:  conn,
		ch:    ch,
		byKey: map[corrKey]*confirmation{},
		byID:  map[string]*confirmation{},
		wake:  make(chan struct{}, 1),
	}
	return pc, returns, closes, nil
}

// collect resolves pc's confirmations in publish order until pc has closed
// and every confirmation is resolved. It reports whether it closed pc
// because no confirm came for ConfirmStall.
func (p *ConfirmPublisher) collect(pc *pubChannel, returns <-chan amqp.Return, closes <-chan *amqp.Error) (stalled bool) {
	stop := p.runCtx.Done()
	closed := false
	var head *confirmation
	watch := p.watchConfirms()
	defer watch.stop()
	drain := func() {
		for {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				pc.recordReturn(r, p.log)
			case e, ok := <-closes:
				if ok && e != nil {
					pc.closeErr = e
				}
				closes = nil
				closed = true
			default:
				return
			}
		}
	}
	for {
		if head == nil {
			head = pc.pop()
		}
		if head == nil && closed {
			// No publish can enqueue on pc once it is detached; anything
			// enqueued before is resolved by amqp091-go's channel shutdown.
			p.detach(pc)
			if head = pc.pop(); head == nil {
				return stalled
			}
		}
		var headDone <-chan struct{}
		if head != nil {
			headDone = head.dc.Done()
		}
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			pc.recordReturn(r, p.log)
		case e, ok := <-closes:
			if ok && e != nil {
				pc.closeErr = e
				p.log.Error(e, "Publishing channel closed")
			}
			closes = nil
			closed = true
			p.detach(pc)
		case <-stop:
			stop = nil
			p.detach(pc)
			// Not here: Channel.Close waits for close-ok, which the reader
			// goroutine may only read after we take a pending return.
			go func() { _ = pc.ch.Close() }()
		case <-pc.wake:
		case <-watch.tick:
			if closed || stop == nil || !watch.idle(head != nil && !p.c.isBlocked()) {
				continue
			}
			watch.quiet = 0
			if stalled {
				// Its close waits on the same unreachable queue leader (a
				// partition's minority before it pauses): leave the node.
				p.c.leaveNode(pc.conn, fmt.Errorf("the publishing channel did not close within %s of its confirms stalling", watch.after))
				continue
			}
			stalled = true
			pc.closeErr = fmt.Errorf("no publish acked for %s", watch.after)
			p.log.Info("No publish acked for a while; reopening the publishing channel, its unconfirmed messages are published again (a quorum queue leader may have moved)",
				"after", watch.after.String(), "nacked", watch.nacks)
			p.detach(pc)
			go func() { _ = pc.ch.Close() }() // resolves the pending confirmations as lost
		case <-headDone:
			// A return sent before this ack is already taken or buffered.
			drain()
			watch.progress(p.resolve(pc, head))
			head = nil
		}
	}
}

// stallWatch watches one channel's confirms for ConfirmStall: a tick every
// half of it, and idle reports the third tick in a row with no publish
// acked while publishes were pending or the last one was nacked (a stall
// of ConfirmStall to 1.5 times it), so that no clock is read per confirm.
// Nacks are no progress: a node whose quorum queue client still places
// the leader on a lost node nacks every publish at once, for as long as
// that node is gone (RabbitMQ 3.10.8, measured: 36 s of nacks from a live
// node after another was killed, none acked), and between the retries'
// backoffs such a channel has nothing pending.
type stallWatch struct {
	tick  <-chan time.Time
	stop  func()
	after time.Duration
	acked uint64 // publishes acked (or returned: the broker routed them)
	seen  uint64 // acked at the last tick
	nacks uint64 // nacks since the last ack
	quiet int
}

func (p *ConfirmPublisher) watchConfirms() *stallWatch {
	w := &stallWatch{stop: func() {}, after: p.c.opts.ConfirmStall}
	if w.after > 0 {
		if c, ok := p.c.opts.Clock.(clock.WithTicker); ok {
			t := c.NewTicker(w.after / 2)
			w.tick, w.stop = t.C(), t.Stop
		} else {
			t := time.NewTicker(w.after / 2)
			w.tick, w.stop = t.C, t.Stop
		}
	}
	return w
}

// progress counts a resolved publish by its result (Confirm*).
func (w *stallWatch) progress(result string) {
	switch result {
	case ConfirmNack:
		w.nacks++
	case ConfirmAck, ConfirmReturned:
		w.acked++
		w.nacks = 0
	}
}

func (w *stallWatch) idle(pending bool) bool {
	if (!pending && w.nacks == 0) || w.acked != w.seen {
		w.quiet = 0
	} else {
		w.quiet++
	}
	w.seen = w.acked
	return w.quiet >= 3
}

// resolve resolves f and says how.
func (p *ConfirmPublisher) resolve(pc *pubChannel, f *confirmation) string {
	result := ConfirmAck
	switch {
	case f.returned != nil:
		result = ConfirmReturned
		f.err = fmt.Errorf("%w: exchange %q, routing key %q: %d %s", ErrUnroutable, f.exchange, f.routingKey, f.returned.ReplyCode, f.returned.ReplyText)
	case f.dc.Acked():
	case pc.ch.IsClosed():
		// amqp091-go resolves the confirmations pending on a closing channel
		// as nacks; the channel is marked closed before it does.
		result = ConfirmLost
		if pc.closeErr != nil {
			// The broker's *amqp.Error stays reachable with errors.As:
			// 404 (no such exchange), 403 (no write permission) or 406
			// (user_id is not the authenticated user) mean the publish
			// itself was refused and retrying it will fail the same way.
			f.err = fmt.Errorf("%w: %w", ErrConnectionLost, pc.closeErr)
		} else {
			f.err = ErrConnectionLost
		}
	default:
		result = ConfirmNack
		f.err = fmt.Errorf("%w: exchange %q, routing key %q", ErrNacked, f.exchange, f.routingKey)
	}
	pc.unregister(f)
	close(f.done)
	<-p.win
	p.inflight.Done()
	p.c.opts.Metrics.Confirmed(result)
	return result
}

// confirmation implements Confirmation.
type confirmation struct {
	exchange, routingKey string
	dc                   *amqp.DeferredConfirmation
	key                  *corrKey // set when correlated by message_id
	id                   string   // set when correlated by CorrelationHeader
	returned             *amqp.Return
	err                  error
	done                 chan struct{}
}

func (f *confirmation) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

type corrKey struct{ exchange, routingKey, messageID string }

// pubChannel is one confirm-mode channel with its pending confirmations.
type pubChannel struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	closeErr error // written and read by the collector only

	corrMu sync.Mutex
	byKey  map[corrKey]*confirmation
	byID   map[string]*confirmation

	qMu   sync.Mutex
	queue []*confirmation
	wake  chan struct{}
}

func (pc *pubChannel) register(f *confirmation, m *amqp.Publishing, newID func() string) {
	pc.corrMu.Lock()
	defer pc.corrMu.Unlock()
	if m.MessageId != "" {
		k := corrKey{f.exchange, f.routingKey, m.MessageId}
		if _, busy := pc.byKey[k]; !busy {
			pc.byKey[k] = f
			f.key = &k
			return
		}
	}
	f.id = newID()
	h := make(amqp.Table, len(m.Headers)+1)
	for k, v := range m.Headers {
		h[k] = v
	}
	h[CorrelationHeader] = f.id
	m.Headers = h
	pc.byID[f.id] = f
}

func (pc *pubChannel) unregister(f *confirmation) {
	pc.corrMu.Lock()
	defer pc.corrMu.Unlock()
	if f.key != nil && pc.byKey[*f.key] == f {
		delete(pc.byKey, *f.key)
	}
	if f.id != "" {
		delete(pc.byID, f.id)
	}
}

func (pc *pubChannel) recordReturn(r amqp.Return, log logr.Logger) {
	pc.corrMu.Lock()
	var f *confirmation
	if id, ok := r.Headers[CorrelationHeader].(string); ok {
		f = pc.byID[id]
	} else {
		f = pc.byKey[corrKey{r.Exchange, r.RoutingKey, r.MessageId}]
	}
	pc.corrMu.Unlock()
	if f == nil {
		log.Info("Received a basic.return for no pending publish", "exchange", r.Exchange, "routingKey", r.RoutingKey, "messageId", r.MessageId, "reply", r.ReplyText)
		return
	}
	f.returned = &amqp.Return{ReplyCode: r.ReplyCode, ReplyText: r.ReplyText, Exchange: r.Exchange, RoutingKey: r.RoutingKey}
}

func (pc *pubChannel) enqueue(f *confirmation) {
	pc.qMu.Lock()
	pc.queue = append(pc.queue, f)
	pc.qMu.Unlock()
	select {
	case pc.wake <- struct{}{}:
	default:
	}
}

func (pc *pubChannel) pop() *confirmation {
	pc.qMu.Lock()
	defer pc.qMu.Unlock()
	if len(pc.queue) == 0 {
		return nil
	}
	f := pc.queue[0]
	pc.queue[0] = nil
	pc.queue = pc.queue[1:]
	return f
}
