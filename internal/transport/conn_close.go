package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// register adds a publisher or consumer, unless Close has begun.
func (c *Conn) register(p *ConfirmPublisher, k *consumer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return ErrClosed
	}
	c.users.Add(1)
	if p != nil {
		c.pubs[p] = struct{}{}
	}
	if k != nil {
		c.tagSeq++
		k.tag = consumerTag(c.opts.ConnectionName, k.queue, c.tagSeq)
		c.consumers[k] = struct{}{}
	}
	return nil
}

func (c *Conn) unregister(p *ConfirmPublisher, k *consumer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p != nil {
		delete(c.pubs, p)
	}
	if k != nil {
		delete(c.consumers, k)
	}
	c.users.Done()
}

// Close shuts the Conn down gracefully within ctx: consumers cancel their
// subscriptions (basic.cancel) and wait for their handlers to settle the
// deliveries they hold, publishers wait for outstanding confirms, then the
// channels and the connection close. Whatever is still unsettled when ctx
// ends is abandoned: unacked deliveries return to their queues
// (Redelivered=true) and pending confirmations fail with ErrConnectionLost.
// It returns ctx's error in that case. Closing twice returns ErrClosed.
func (c *Conn) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closing = true
	close(c.closingCh)
	pubs := make([]*ConfirmPublisher, 0, len(c.pubs))
	for p := range c.pubs {
		pubs = append(pubs, p)
	}
	cons := make([]*consumer, 0, len(c.consumers))
	for k := range c.consumers {
		cons = append(cons, k)
	}
	c.mu.Unlock()

	var errs []error
	var wg sync.WaitGroup
	var errMu sync.Mutex
	addErr := func(err error) {
		if err != nil && !errors.Is(err, ErrClosed) {
			errMu.Lock()
			errs = append(errs, err)
			errMu.Unlock()
		}
	}
	for _, k := range cons {
		wg.Go(func() { addErr(k.shutdown(ctx)) })
	}
	for _, p := range pubs {
		wg.Go(func() { addErr(p.Close(ctx)) })
	}
	settled := make(chan struct{})
	go func() { wg.Wait(); c.users.Wait(); close(settled) }()
	select {
	case <-settled:
	case <-ctx.Done():
		// A broker that stopped answering never sends the channels'
		// close-ok: closing the connection (CloseDeadline in watch) is
		// what ends their waits, so it must not wait for them.
		addErr(ctx.Err())
	}
	c.stop()
	<-c.stopped
	<-settled
	if len(errs) > 0 {
		return fmt.Errorf("transport: closed before all in-flight work settled: %w", errors.Join(errs...))
	}
	return nil
}

// consumerTag builds a tag unique within the connection and recognisable in
// the management UI: {connectionName}.{queue}.{n}, within AMQP's 255 bytes.
func consumerTag(connName, queue string, n uint64) string {
	suffix := fmt.Sprintf(".%d", n)
	tag := connName + "." + queue
	if len(tag)+len(suffix) > 255 {
		tag = tag[:255-len(suffix)]
	}
	return tag + suffix
}
