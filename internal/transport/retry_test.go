package transport

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

type scripted struct {
	results []error // one per publish, in order
	calls   int
}

type conf struct{ err error }

func (c conf) Wait(context.Context) error { return c.err }

func (s *scripted) PublishAsync(context.Context, string, string, amqp.Publishing) (Confirmation, error) {
	err := s.results[min(s.calls, len(s.results)-1)]
	s.calls++
	return conf{err}, nil
}

func (s *scripted) Publish(ctx context.Context, e, k string, m amqp.Publishing) error {
	c, _ := s.PublishAsync(ctx, e, k, m)
	return c.Wait(ctx)
}

func TestRetry(t *testing.T) {
	var delays []time.Duration
	after := func(d time.Duration) <-chan time.Time {
		delays = append(delays, d)
		c := make(chan time.Time, 1)
		c <- time.Time{}
		return c
	}
	for _, c := range []struct {
		name    string
		results []error
		max     int
		calls   int
		want    error
		delays  []time.Duration
	}{
		{"confirmed at once", []error{nil}, 0, 1, nil, nil},
		{"lost, then confirmed: republished without delay", []error{ErrConnectionLost, ErrConnectionLost, nil}, 0, 3, nil, nil},
		{"nacked with backoff", []error{ErrNacked, ErrNacked, ErrNacked, nil}, 0, 4, nil, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}},
		{"unroutable is final", []error{ErrUnroutable, nil}, 0, 1, ErrUnroutable, nil},
		{"closed is final", []error{ErrClosed, nil}, 0, 1, ErrClosed, nil},
		{"max bounds the retries", []error{ErrConnectionLost}, 2, 3, ErrConnectionLost, nil},
		{"no max: retries until confirmed", []error{ErrConnectionLost, ErrConnectionLost, ErrConnectionLost, ErrConnectionLost, ErrConnectionLost, nil}, 0, 6, nil, nil},
	} {
		delays = nil
		p := &scripted{results: c.results}
		retries := 0
		err := Retry{Max: c.max, After: after, OnRetry: func(int, error) { retries++ }}.Publish(context.Background(), p, "x", "k", amqp.Publishing{})
		if !errors.Is(err, c.want) || p.calls != c.calls || len(delays) != len(c.delays) || retries != c.calls-1 {
			t.Errorf("%s: err %v, %d publishes, delays %v, %d retries; want %v, %d, %v", c.name, err, p.calls, delays, retries, c.want, c.calls, c.delays)
			continue
		}
		for i := range delays {
			if delays[i] != c.delays[i] {
				t.Errorf("%s: delays %v, want %v", c.name, delays, c.delays)
			}
		}
	}
	// A first confirmation given is waited for, not republished at once.
	p := &scripted{results: []error{nil}}
	if err := (Retry{}).Confirm(context.Background(), p, "x", "k", amqp.Publishing{}, conf{ErrConnectionLost}); err != nil || p.calls != 1 {
		t.Errorf("Confirm with a lost first confirmation: %v after %d publishes, want nil after 1", err, p.calls)
	}
	// The context ends the retries.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (Retry{}).Publish(ctx, &scripted{results: []error{ErrNacked}}, "x", "k", amqp.Publishing{}); !errors.Is(err, ErrNacked) {
		t.Errorf("cancelled: %v", err)
	}
}

// A republish after a lost connection passes Check first (a fenced owner
// stops), and MaxLost bounds how often one message is sent again for lost
// connections, while nacks (a full queue) keep being retried.
func TestRetryCheckAndMaxLost(t *testing.T) {
	now := func(time.Duration) <-chan time.Time { c := make(chan time.Time, 1); c <- time.Time{}; return c }
	fenced := errors.New("fenced")
	p := &scripted{results: []error{ErrConnectionLost, nil}}
	err := Retry{After: now, Check: func() error { return fenced }}.Publish(context.Background(), p, "x", "k", amqp.Publishing{})
	if !errors.Is(err, fenced) || !errors.Is(err, ErrConnectionLost) || p.calls != 1 {
		t.Fatalf("Check refusing: %v after %d publishes, want the fence after 1", err, p.calls)
	}
	p = &scripted{results: []error{ErrConnectionLost}}
	err = Retry{After: now, MaxLost: 3}.Publish(context.Background(), p, "x", "k", amqp.Publishing{})
	if !errors.Is(err, ErrConnectionLost) || p.calls != 4 {
		t.Fatalf("MaxLost 3: %v after %d publishes, want 4", err, p.calls)
	}
	p = &scripted{results: []error{ErrNacked, ErrNacked, ErrNacked, ErrNacked, ErrNacked, nil}}
	checks := 0
	err = Retry{After: now, MaxLost: 1, Check: func() error { checks++; return nil }}.Publish(context.Background(), p, "x", "k", amqp.Publishing{})
	if err != nil || p.calls != 6 || checks != 5 {
		t.Fatalf("nacks under MaxLost 1: %v after %d publishes, %d checks", err, p.calls, checks)
	}
}
