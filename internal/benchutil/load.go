package benchutil

import (
	"context"
	"time"
)

// Body returns a JSON body of about size bytes, shaped like an HCP event.
func Body(size int) []byte {
	const head = `{"hcp_version":"1.0","type":"event","payload":{"data":"`
	const tail = `"}}`
	n := max(0, size-len(head)-len(tail))
	b := make([]byte, 0, len(head)+n+len(tail))
	b = append(b, head...)
	for i := 0; i < n; i++ {
		b = append(b, 'x')
	}
	return append(b, tail...)
}

// Pacer spaces publishes at a fixed rate (no-op when rate is 0).
type Pacer struct {
	interval time.Duration
	next     time.Time
}

// NewPacer paces at rate per second.
func NewPacer(rate float64) *Pacer {
	if rate <= 0 {
		return &Pacer{}
	}
	return &Pacer{interval: time.Duration(float64(time.Second) / rate)}
}

// Wait blocks until the next publish is due.
func (p *Pacer) Wait(ctx context.Context) error {
	if p.interval == 0 {
		return ctx.Err()
	}
	now := time.Now()
	if p.next.IsZero() {
		p.next = now
	}
	if d := p.next.Sub(now); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	p.next = p.next.Add(p.interval)
	return nil
}
