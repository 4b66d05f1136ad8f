package caller

import (
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// A session worker busy elsewhere (retrying its app) can be handed more
// deliveries than a window holds: the stale ones of channels gone
// meanwhile and its live channel's. Every one reaches it, in order; none is
// left unsettled for want of room (the fixed inbox of 4 × prefetch + 16
// refused the 57th at prefetch 10). And a worker costs no buffer for
// deliveries it does not have.
func TestWorkerInboxTakesEveryDelivery(t *testing.T) {
	s := &Sidecar{log: logr.Discard(), clk: clock.RealClock{}, cfg: &config.Config{Prefetch: 10},
		m: metrics.New(prometheus.NewRegistry()), streams: map[string]*stream{}}
	const sid = "0f8fad5b-d9cb-469f-a165-70867728950e"
	w := s.newStream(sid)
	s.streams[sid] = w // registered, not running: it takes nothing meanwhile
	const n = 100
	for i := range n {
		id := sid
		s.dispatch(&item{d: amqp.Delivery{DeliveryTag: uint64(i + 1)}, env: &envelope.Envelope{SessionID: &id}})
	}
	got := w.inbox.take()
	if len(got) != n {
		t.Fatalf("the worker got %d of %d deliveries", len(got), n)
	}
	for i, it := range got {
		if it.d.DeliveryTag != uint64(i+1) {
			t.Fatalf("delivery %d is tag %d: out of order", i, it.d.DeliveryTag)
		}
	}
	if h := w.held.Load(); h != n {
		t.Errorf("the worker holds %d deliveries, want %d", h, n)
	}
	if a := testing.AllocsPerRun(100, func() { s.newStream(sid) }); a > 2 {
		t.Errorf("a new worker makes %v allocations, want its struct and its wake-up channel", a)
	}
}
