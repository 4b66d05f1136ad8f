package caller

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// BenchmarkDeliverEvent is the caller's per-event hot path to the app:
// build the app message from the delivery (appMessage) and POST it
// (deliver) to a local app that answers 204. The variants: an event
// without trace context, and one that carries a traceparent header
// (tracing off: pass-through).
func BenchmarkDeliverEvent(b *testing.B) {
	const sid = "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10"
	for _, tc := range []struct {
		name    string
		headers amqp.Table
	}{
		{"untraced", amqp.Table{envelope.HeaderConfirmedThrough: int64(40)}},
		{"traceparent", amqp.Table{envelope.HeaderConfirmedThrough: int64(40), "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusNoContent)
			}))
			defer app.Close()
			s := &Sidecar{cfg: &config.Config{HarnessURL: app.URL}, o: Options{AppTimeout: 5 * time.Second},
				http: app.Client(), m: metrics.New(prometheus.NewRegistry()), runCtx: context.Background()}
			ev := &session.EventPayload{EventType: session.EventProgress, Sequence: 41, Data: json.RawMessage(`{"stage":"heating","percent":40}`)}
			env, err := envelope.New(envelope.TypeEvent, sid, ev)
			if err != nil {
				b.Fatal(err)
			}
			it := &item{d: amqp.Delivery{Headers: tc.headers}, env: env, event: ev}
			b.ReportAllocs()
			for b.Loop() {
				if err := s.deliver(s.appMessage(it, "lab", "550e8400-e29b-41d4-a716-446655440000")); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
