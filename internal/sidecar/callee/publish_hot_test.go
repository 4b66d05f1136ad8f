package callee

import (
	"bytes"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

const hotSID = "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10"

// TestHarnessEventEnvelopeIsValid: the envelope of a harness event, built
// without validating it, passes the receiver's decoding and Validate, with
// the event's data as the harness wrote it, whichever path parsed it.
func TestHarnessEventEnvelopeIsValid(t *testing.T) {
	ss := &sess{sc: &Sidecar{clk: clock.RealClock{}, username: "callee.lab@/hcp"}, id: hotSID, seq: session.NewSequencer(0)}
	lines := []string{
		`{"event_type":"progress","data":{ "stage" : "a", "percent": 10 ,"x":{"y":[1, 2]}}}`,
		`{"event_type":"log","data":{"Level":"info","message":"m\u00e9"},"idempotency_key":"k"}`, // the general path
		`{"event_type":"intermediate_result","data":{"result_type":"t","data":[{"a":1},{"a":2}]}}`,
	}
	for i, line := range lines {
		ev, err := parseEvent([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		o, err := ss.sequenceHarnessEventLocked(&ev)
		if err != nil {
			t.Fatal(err)
		}
		env, err := envelope.FromDelivery(amqp.Delivery{ContentType: o.pub.ContentType, MessageId: o.pub.MessageId,
			Type: o.pub.Type, CorrelationId: o.pub.CorrelationId, Body: o.pub.Body}, 0)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if err := env.Validate(); err != nil {
			t.Fatal(err)
		}
		p, err := session.UnmarshalEventPayload(env.Payload)
		if err != nil || p.Sequence != int64(i+1) || p.EventType != ev.EventType || !bytes.Equal(p.Data, ev.Data) || o.key != ev.IdempotencyKey {
			t.Errorf("%s: payload %s (%v), key %q", line, env.Payload, err, o.key)
		}
	}
}

// TestEventHeadersShared: events share their header table while the
// epoch and the confirmed mark hold; a table once published never
// changes; a message with headers of its own gets its own table.
func TestEventHeadersShared(t *testing.T) {
	ss := &sess{id: hotSID, epoch: 3}
	benchTrace(ss, benchTraceparent)
	ss.confirmed.Store(4)
	h1 := ss.headersLocked(nil, 5)
	h2 := ss.headersLocked(nil, 6)
	if !sameTable(h1, h2) {
		t.Error("two events under the same mark do not share their headers")
	}
	want := amqp.Table{envelope.HeaderTraceparent: benchTraceparent, envelope.HeaderOwnerEpoch: int64(3), envelope.HeaderConfirmedThrough: int64(4)}
	if !equalTable(h1, want) {
		t.Fatalf("headers %v, want %v", h1, want)
	}
	own := ss.headersLocked(amqp.Table{"x": "y", envelope.HeaderOwnerEpoch: int64(1)}, 0)
	if own["x"] != "y" || own[envelope.HeaderOwnerEpoch] != int64(3) || own[envelope.HeaderConfirmedThrough] != nil || sameTable(own, h1) {
		t.Errorf("a message's own headers: %v", own)
	}
	if h := ss.headersLocked(nil, 7); !sameTable(h, h1) {
		t.Error("a message with headers of its own ended the sharing")
	}
	ss.confirmed.Store(6)
	h3 := ss.headersLocked(nil, 7)
	if sameTable(h3, h1) || h3[envelope.HeaderConfirmedThrough] != int64(6) || !equalTable(h1, want) {
		t.Errorf("after the mark moved: %v, and the earlier table %v", h3, h1)
	}
	ss.epoch = 4
	if h := ss.headersLocked(nil, 8); sameTable(h, h3) || h[envelope.HeaderOwnerEpoch] != int64(4) {
		t.Errorf("after a new epoch: %v", h)
	}
	if h := ss.headersLocked(nil, 0); h[envelope.HeaderConfirmedThrough] != nil {
		t.Errorf("a message without a sequence carries a mark: %v", h)
	}
}

func sameTable(a, b amqp.Table) bool {
	a["probe"] = 1
	defer delete(a, "probe")
	return b["probe"] == 1
}

func equalTable(a, b amqp.Table) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}
