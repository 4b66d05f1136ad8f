package caller

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestBatchDelivery: with AppMaxBatch the events of a session that are
// ready go to the app together, in order, each once, in far fewer requests
// than events; task_completed still comes after every event before it and
// before session_closed; every delivery is acked (the queue ends empty).
func TestBatchDelivery(t *testing.T) {
	b := newBed(t, "lab")
	b.app.SetDelay(20 * time.Millisecond) // a slow app: events pile up meanwhile
	r := b.start(func(o *Options) { o.AppMaxBatch = 50; o.Config.Prefetch = 100 })
	v := r.submit(t, taskReq("lab"))
	const n = 300
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	for _, m := range s.msgs {
		c.publish(m)
	}
	eventually(t, 30*time.Second, "the whole stream", func() error { return b.complete(s.sessionID, n) })
	l, _ := b.app.Session(s.sessionID)
	if len(l.Problems) != 0 {
		t.Fatalf("app saw problems: %v", l.Problems)
	}
	var types []string
	for _, m := range l.Messages[len(l.Messages)-3:] {
		types = append(types, fmt.Sprintf("%s/%d", m.Type, m.Sequence))
	}
	if want := fmt.Sprintf("[event/%d task_completed/0 event/%d]", n-1, n); fmt.Sprint(types) != want {
		t.Errorf("the stream ends %v, want %s", types, want)
	}
	snap := b.app.Snapshot()
	if snap.Requests*4 > snap.Total {
		t.Errorf("%d messages came in %d requests; want batches (at least 4 per request on average)", snap.Total, snap.Requests)
	}
	t.Logf("%d messages in %d requests", snap.Total, snap.Requests)
	eventually(t, 10*time.Second, "every delivery acked", func() error {
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("%d messages still in the event queue", d)
		}
		return nil
	})
}

// TestBatchOffer: with AppMaxBatch 1 (the default) the sidecar POSTs one
// event per request until the app offers batches (HeaderBatchMax on its
// answers), then the events of a session that are ready together go in
// one request; when the app withdraws (its batch endpoint answers 404) the
// sidecar goes back to single requests, the refused batch included. Every
// event reaches the app once and in order throughout, and every delivery
// is acked.
func TestBatchOffer(t *testing.T) {
	b := newBed(t, "lab")
	b.app.SetDelay(20 * time.Millisecond) // a slow app: events pile up meanwhile
	r := b.start(func(o *Options) { o.Config.Prefetch = 100 })
	v := r.submit(t, taskReq("lab"))
	const n = 300
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	// phase publishes s.msgs[from:to] (event seq k is msgs[k]), waits until
	// the app has sequence upTo and returns the messages and requests the
	// app counted meanwhile.
	phase := func(what string, from, to int, upTo int64) (msgs, reqs int) {
		t.Helper()
		before := b.app.Snapshot()
		for _, m := range s.msgs[from:to] {
			c.publish(m)
		}
		eventually(t, 30*time.Second, what, func() error {
			if l, _ := b.app.Session(s.sessionID); l.LastSequence < upTo {
				return fmt.Errorf("the app has sequence %d, want %d", l.LastSequence, upTo)
			}
			return nil
		})
		after := b.app.Snapshot()
		return after.Total - before.Total, after.Requests - before.Requests
	}

	if msgs, reqs := phase("the events before any offer", 0, 21, 20); reqs != msgs {
		t.Errorf("without an offer: %d messages in %d requests, want one per request", msgs, reqs)
	}
	b.app.OfferBatches(50)
	msgs, reqs := phase("the events after the offer", 21, 221, 220)
	if reqs*4 > msgs {
		t.Errorf("after the offer: %d messages in %d requests; want batches (at least 4 per request on average)", msgs, reqs)
	}
	t.Logf("after the offer: %d messages in %d requests", msgs, reqs)
	// The app withdraws while it processes the first event of the last
	// part (its answer still offers batches), so the next request is a
	// batch, answered 404, and retried as single requests.
	b.app.FailWhen(func(m samplecaller.Message) bool {
		if m.Sequence == 221 {
			b.app.WithdrawBatches()
		}
		return false
	})
	if msgs, reqs := phase("the events after the withdrawal", 221, len(s.msgs), n); reqs != msgs {
		t.Errorf("after the withdrawal: %d messages in %d requests, want one per request", msgs, reqs)
	}
	if failed := testutil.ToFloat64(b.metrics.AppDeliveries.WithLabelValues("error")); failed < 2 {
		t.Errorf("%.0f event deliveries failed; want the batch refused with 404 after the withdrawal", failed)
	}
	eventually(t, 10*time.Second, "the whole stream", func() error { return b.complete(s.sessionID, n) })
	if l, _ := b.app.Session(s.sessionID); l.Duplicates != 0 || len(l.Problems) != 0 {
		t.Errorf("app saw %d duplicates, problems %v", l.Duplicates, l.Problems)
	}
	eventually(t, 10*time.Second, "every delivery acked", func() error {
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("%d messages still in the event queue", d)
		}
		return nil
	})
}

func seqOf(t *testing.T, env *envelope.Envelope) int64 {
	var p session.EventPayload
	if err := json.Unmarshal(env.Payload, &p); err != nil {
		t.Fatal(err)
	}
	return p.Sequence
}
