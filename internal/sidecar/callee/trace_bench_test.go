package callee

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// nopPublisher confirms every publish at once.
type nopPublisher struct{}

type okConfirmation struct{}

func (okConfirmation) Wait(context.Context) error { return nil }

func (nopPublisher) PublishAsync(context.Context, string, string, amqp.Publishing) (transport.Confirmation, error) {
	return okConfirmation{}, nil
}
func (nopPublisher) Publish(context.Context, string, string, amqp.Publishing) error { return nil }

// BenchmarkEventPublish is the callee's per-event hot path without I/O:
// encode the event, then enqueueLocked (headers, publish, queue for the
// confirm). The variants: a session without trace context, and one whose
// task_submit carried a traceparent (tracing off: pass-through).
func BenchmarkEventPublish(b *testing.B) {
	const sid = "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10"
	for _, traced := range []bool{false, true} {
		name := "untraced"
		if traced {
			name = "traceparent"
		}
		b.Run(name, func(b *testing.B) {
			s := &Sidecar{pub: nopPublisher{}, m: metrics.New(prometheus.NewRegistry()), username: "callee.lab@/hcp"}
			ss := &sess{sc: s, id: sid, callerID: "alpha"}
			// Not registered: no confirm loop runs, the benchmark takes its place.
			if traced {
				benchTrace(ss, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			}
			ss.confirmed.Store(40)
			rk := topology.EventRoutingKey(ss.callerID, sid, envelope.TypeEvent)
			data := json.RawMessage(`{"stage":"heating","percent":40}`)
			now := time.Now()
			ctx := context.Background()
			b.ReportAllocs()
			var seq int64
			for b.Loop() {
				seq++
				env, err := envelope.NewAt(now, envelope.TypeEvent, sid, session.EventPayload{EventType: session.EventProgress, Sequence: seq, Data: data})
				if err != nil {
					b.Fatal(err)
				}
				pub, err := envelope.EncodePublishing(env, s.username)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := ss.enqueueLocked(ctx, seq, envelope.TypeEvent, rk, pub, seq); err != nil {
					b.Fatal(err)
				}
				if _, _, ok := ss.confirms.pop(); !ok {
					b.Fatal("nothing queued for its confirm")
				}
			}
		})
	}
}
