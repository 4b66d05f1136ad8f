package caller

import (
	"encoding/json"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/sidecar/tracing"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

const testTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func traceItem(h amqp.Table) *item {
	ev := &session.EventPayload{EventType: session.EventProgress, Sequence: 41, Data: json.RawMessage(`{"percent":40}`)}
	env, _ := envelope.New(envelope.TypeEvent, "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10", ev)
	return &item{d: amqp.Delivery{Headers: h}, env: env, event: ev}
}

// The app gets the event's trace context in the body and as headers; a
// malformed one is dropped, never an error.
func TestAppMessageTrace(t *testing.T) {
	s := &Sidecar{}
	for _, tc := range []struct {
		name   string
		h      amqp.Table
		parent string
		state  string
	}{
		{"none", nil, "", ""},
		{"valid", amqp.Table{"traceparent": testTraceparent, "tracestate": "a=b"}, testTraceparent, "a=b"},
		{"malformed", amqp.Table{"traceparent": "00-nope", "tracestate": "a=b"}, "", ""},
		{"not a string", amqp.Table{"traceparent": int64(1)}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := s.appMessage(traceItem(tc.h), "lab", "")
			if m.Traceparent != tc.parent || m.Tracestate != tc.state {
				t.Fatalf("AppMessage trace = %q %q, want %q %q", m.Traceparent, m.Tracestate, tc.parent, tc.state)
			}
			h := appHeaders(m.SessionID, m.Type, m.MessageID, "41", tracing.Context{Parent: m.Traceparent, State: m.Tracestate})
			if got := h.Get("traceparent"); got != tc.parent {
				t.Fatalf("traceparent header %q, want %q", got, tc.parent)
			}
			if h.Get("Content-Type") != "application/json" || h.Get(HeaderSessionID) != m.SessionID || h.Get(HeaderSequence) != "41" ||
				h.Get(HeaderIdempotencyKey) != m.MessageID || h.Get(HeaderMessageType) != "event" {
				t.Fatalf("headers %v", h)
			}
			b, _ := json.Marshal(m)
			var back map[string]any
			_ = json.Unmarshal(b, &back)
			if _, has := back["traceparent"]; has != (tc.parent != "") {
				t.Fatalf("body %s", b)
			}
		})
	}
}

// With tracing off, passing a traceparent on costs the sidecar no
// allocation: the header values share one array either way.
func TestAppDeliveryTraceAllocs(t *testing.T) {
	s := &Sidecar{}
	allocs := func(h amqp.Table) float64 {
		it := traceItem(h)
		return testing.AllocsPerRun(200, func() {
			m := s.appMessage(it, "lab", "")
			_ = appHeaders(m.SessionID, m.Type, m.MessageID, "41", tracing.Context{Parent: m.Traceparent, State: m.Tracestate})
		})
	}
	plain := allocs(amqp.Table{envelope.HeaderConfirmedThrough: int64(40)})
	traced := allocs(amqp.Table{envelope.HeaderConfirmedThrough: int64(40), "traceparent": testTraceparent, "tracestate": "a=b"})
	if traced != plain {
		t.Fatalf("allocations per event: %v with a traceparent, %v without", traced, plain)
	}
}
