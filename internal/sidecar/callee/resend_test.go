package callee

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// heldConfirmation is a publish's confirm, resolved by the test.
type heldConfirmation struct {
	done chan struct{}
	err  error
}

func (c *heldConfirmation) Wait(ctx context.Context) error {
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// heldPublisher records the message ids it is given, in order, and holds
// each confirm until the test resolves it.
type heldPublisher struct {
	mu    sync.Mutex
	sent  []string
	confs []*heldConfirmation
}

func (p *heldPublisher) PublishAsync(_ context.Context, _, _ string, m amqp.Publishing) (transport.Confirmation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := &heldConfirmation{done: make(chan struct{})}
	p.sent = append(p.sent, m.MessageId)
	p.confs = append(p.confs, c)
	return c, nil
}

func (p *heldPublisher) Publish(ctx context.Context, ex, rk string, m amqp.Publishing) error {
	c, _ := p.PublishAsync(ctx, ex, rk, m)
	return c.Wait(ctx)
}

// resolve resolves the confirms of publishes [from, to) with err.
func (p *heldPublisher) resolve(from, to int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.confs[from:to] {
		c.err = err
		close(c.done)
	}
}

func (p *heldPublisher) published() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.sent)
}

// TestNackedPublishesAreResentInOrder: a session's five events are nacked
// together (what a quorum queue that has lost its leader answers, or a
// channel's loss). The republish of the first is followed at once by the
// other four, in order, before any of their new confirms: before, each was
// republished only once the one ahead of it was confirmed, one round trip
// and nack backoff after another, while the session's newer events went
// out at once, and the caller held a gap as long (a broker node's loss:
// 256 events of each session over 37 s).
func TestNackedPublishesAreResentInOrder(t *testing.T) {
	log, _, err := wal.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pub := &heldPublisher{}
	s := &Sidecar{pub: pub, m: metrics.New(prometheus.NewRegistry()), username: "callee.lab@/hcp",
		clk: clock.RealClock{}, life: t.Context(), wal: log, log: logr.Discard()}
	const sid = "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10"
	ss := &sess{sc: s, id: sid, callerID: "alpha"}
	ss.confirms.own()
	rk := topology.EventRoutingKey(ss.callerID, sid, envelope.TypeEvent)
	var want []string
	var ps []*pending
	for seq := int64(1); seq <= 5; seq++ {
		id := fmt.Sprintf("m%d", seq)
		want = append(want, id)
		p, err := ss.enqueueLocked(t.Context(), seq, envelope.TypeEvent, rk, amqp.Publishing{MessageId: id, Body: []byte("{}")}, seq)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	pub.resolve(0, 5, fmt.Errorf("%w: exchange %q", transport.ErrNacked, topology.EventsExchange))
	// The first's republish waits the nack backoff (100 ms).
	deadline := time.Now().Add(3 * time.Second)
	for len(pub.published()) < 10 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := pub.published()
	if !slices.Equal(got, append(slices.Clone(want), want...)) {
		t.Fatalf("after the five were nacked, publishes %v; want the five, then all five again in order before any new confirm", got)
	}
	pub.resolve(5, 10, nil)
	for _, p := range ps {
		select {
		case <-p.done:
			if p.err != nil {
				t.Errorf("event %d: %v", p.seq, p.err)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("event %d: no confirm after its republish was confirmed", p.seq)
		}
	}
	if got := ss.confirmed.Load(); got != 5 {
		t.Errorf("confirmed through %d; want 5", got)
	}
	if n := len(pub.published()); n != 10 {
		t.Errorf("%d publishes; want 10 (each event twice)", n)
	}
}

// A harness's retry of an event whose first call still waits for its
// confirm (that call timed out, or its answer was lost) is answered once
// the confirm comes, as the first call would have been. Before, the key
// table answered it 200 at once, and a 200 (the synchronous default) says
// that the broker has the event.
func TestRetryOfAnUnconfirmedEventWaitsForItsConfirm(t *testing.T) {
	f := newFenceFixture(t)
	ctx := t.Context()
	log, _, err := wal.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pub := &heldPublisher{}
	f.s.pub, f.s.wal, f.s.m, f.s.username = pub, log, metrics.New(prometheus.NewRegistry()), "callee.lab@/hcp"
	m, err := session.Restore(session.StateRunning, f.clk.Now(), f.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	// The envelope wants a UUID; the fixture's HCPSession is not read here.
	f.ss.machine, f.ss.seq, f.ss.callerID, f.ss.id = m, session.NewSequencer(0), "alpha", "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10"
	f.ss.confirms.own()
	ev := []harnessEvent{{EventType: session.EventProgress, IdempotencyKey: "step-3", Data: json.RawMessage(`{"stage":"s"}`)}}
	if _, _, e := f.ss.publishEvents(ctx, ev); e != nil {
		t.Fatal(e)
	}
	ps, seqs, e := f.ss.publishEvents(ctx, ev) // the retry
	if e != nil || len(seqs) != 1 || seqs[0] != 1 {
		t.Fatalf("the retry: sequences %v, error %+v; want sequence 1", seqs, e)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/hcp/v1/sessions/s1/events", nil)
	answered := make(chan struct{})
	go func() { respond(w, r, f.ss, ps, map[string]any{"sequence": seqs[0]}); close(answered) }()
	select {
	case <-answered:
		t.Fatalf("the retry was answered %d before its event was confirmed", w.Code)
	case <-time.After(300 * time.Millisecond):
	}
	pub.resolve(0, 1, nil)
	select {
	case <-answered:
	case <-time.After(3 * time.Second):
		t.Fatal("the retry was not answered after its event was confirmed")
	}
	if w.Code != http.StatusOK {
		t.Errorf("the retry was answered %d %s; want 200", w.Code, w.Body)
	}
	if n := len(pub.published()); n != 1 {
		t.Errorf("the event was published %d times; want once", n)
	}
}

// A session's log lines name the session and its caller (its logger is
// made per line, not kept: see sess.log).
func TestSessionLogNamesSessionAndCaller(t *testing.T) {
	var lines []string
	s := &Sidecar{log: funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})}
	ss := &sess{sc: s, id: "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10", callerID: "alpha"}
	ss.log().Info("Handed the session over")
	if len(lines) != 1 || !strings.Contains(lines[0], `"session"="4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10"`) || !strings.Contains(lines[0], `"caller"="alpha"`) {
		t.Errorf("log lines %q do not name the session and its caller", lines)
	}
}
