package caller

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/client-go/tools/record"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// publishEpoch publishes env as this callee with the owner epoch header
// (none for a negative epoch), as a fencing callee replica does.
func (c *callee) publishEpoch(env *envelope.Envelope, epoch int64) {
	c.b.t.Helper()
	pub, err := envelope.EncodePublishing(env, c.u.name)
	if err != nil {
		c.b.t.Fatal(err)
	}
	if epoch >= 0 {
		if pub.Headers == nil {
			pub.Headers = amqp.Table{}
		}
		pub.Headers[envelope.HeaderOwnerEpoch] = epoch
	}
	c.publishRaw(topology.EventRoutingKey(c.b.callerID, env.Session(), env.Type), pub)
}

// progress builds a progress event of session sid with a message that
// tells who wrote it.
func progress(t *testing.T, sid string, seq int64, who string) *envelope.Envelope {
	t.Helper()
	p := 50.0
	env, err := envelope.New(envelope.TypeEvent, sid, mustEvent(t, seq, &session.ProgressData{Stage: "step", Percent: &p, Message: who}))
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// messageOf returns what the app received as event seq of session sid.
func (b *bed) messageOf(sid string, seq int64) string {
	l, _ := b.app.Session(sid)
	for _, m := range l.Messages {
		if m.Sequence == seq {
			var d struct {
				Message string `json:"message"`
			}
			_ = json.Unmarshal(m.Data, &d)
			return d.Message
		}
	}
	return ""
}

// withRecorder gives the sidecar an event recorder.
func withRecorder(r record.EventRecorder) sidecarOpt {
	return func(o *Options) { o.Recorder = r }
}

// TestStaleOwnerIsRefused: the session's owner (epoch 1) publishes events
// 1..3, a takeover gives it to epoch 2, which continues at 4. The old owner
// lives on as a zombie and publishes 6 (a sequence the new owner has not
// sent yet) and 4 again with its own body: both are refused as stale and
// acked away; the app gets every event once, each of them the current
// owner's, and the sidecar remembers the epoch across a restart.
func TestStaleOwnerIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("RabbitMQ")
	}
	b := newBed(t, "lab")
	rec := record.NewFakeRecorder(100)
	r := b.start(withRecorder(rec))
	const n = 8
	s := newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, n)
	c := b.callee("lab")
	c.publishEpoch(s.msgs[0], 1) // task_accepted
	for seq := int64(1); seq <= 3; seq++ {
		c.publishEpoch(s.msgs[seq], 1)
	}
	c.publishEpoch(progress(t, s.sessionID, 4, "owner-2"), 2)
	c.publishEpoch(progress(t, s.sessionID, 5, "owner-2"), 2)
	eventually(t, 20*time.Second, "events 1..5", func() error {
		if got := b.lastSeq(s.sessionID); got != 5 {
			return fmt.Errorf("last sequence %d", got)
		}
		return nil
	})
	// The zombie: a sequence the new owner has not sent yet, and one it has.
	c.publishEpoch(progress(t, s.sessionID, 6, "zombie"), 1)
	c.publishEpoch(progress(t, s.sessionID, 4, "zombie"), 1)
	eventually(t, 10*time.Second, "the zombie's messages refused", func() error {
		if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonStaleOwner)); got != 2 {
			return fmt.Errorf("%s = %.0f, want 2", ReasonStaleOwner, got)
		}
		return nil
	})
	// A restarted sidecar (same state directory) still knows epoch 2.
	r.stop(t)
	b.start(withRecorder(rec))
	c.publishEpoch(progress(t, s.sessionID, 7, "zombie"), 1)
	c.publishEpoch(progress(t, s.sessionID, 6, "owner-2"), 2)
	c.publishEpoch(progress(t, s.sessionID, 7, "owner-2"), 2)
	c.publishEpoch(s.msgs[n], 2)   // task_completed
	c.publishEpoch(s.msgs[n+1], 2) // session_closed (8)
	eventually(t, 20*time.Second, "the session complete", func() error { return b.complete(s.sessionID, n) })
	for seq := int64(4); seq <= 7; seq++ {
		if got := b.messageOf(s.sessionID, seq); got != "owner-2" {
			t.Errorf("event %d at the app was written by %q, want owner-2", seq, got)
		}
	}
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonStaleOwner)); got != 3 {
		t.Errorf("%s = %.0f, want 3 (one after the restart)", ReasonStaleOwner, got)
	}
	if !sawEvent(rec, EventStaleOwner) {
		t.Errorf("no %s Warning Event", EventStaleOwner)
	}
	eventually(t, 10*time.Second, "the queue empty", func() error {
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("depth %d", d)
		}
		return nil
	})
}

// TestEarlierOwnersEventsAreKept: events of the earlier owner that arrive
// after the new owner's first (a redelivery, a republish of an
// unconfirmed publish made before the takeover) have sequences below
// everything the new owner sends: they are delivered, in order, not
// refused.
func TestEarlierOwnersEventsAreKept(t *testing.T) {
	if testing.Short() {
		t.Skip("RabbitMQ")
	}
	b := newBed(t, "lab")
	r := b.start()
	const n = 6
	s := newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, n)
	c := b.callee("lab")
	c.publishEpoch(s.msgs[0], 1)
	c.publishEpoch(s.msgs[1], 1)
	c.publishEpoch(s.msgs[2], 1)
	// The new owner continues at 4; 3 of the old owner comes after it.
	c.publishEpoch(s.msgs[4], 2)
	c.publishEpoch(s.msgs[3], 1)
	c.publishEpoch(s.msgs[5], 2)
	c.publishEpoch(s.msgs[6], 2)
	c.publishEpoch(s.msgs[7], 2)
	eventually(t, 20*time.Second, "the session complete", func() error { return b.complete(s.sessionID, n) })
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonStaleOwner)); got != 0 {
		t.Errorf("%s = %.0f, want 0", ReasonStaleOwner, got)
	}
}

// TestContradictionKeepsTheFirst: one owner epoch publishes two different
// bodies for sequence 3. The first received is delivered and kept; the
// other is acked away, counted as a contradiction, and reported with a
// Warning Event; the session goes on.
func TestContradictionKeepsTheFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("RabbitMQ")
	}
	b := newBed(t, "lab")
	rec := record.NewFakeRecorder(100)
	r := b.start(withRecorder(rec))
	const n = 6
	s := newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, n)
	c := b.callee("lab")
	for i, m := range s.msgs {
		c.publishEpoch(m, 1)
		switch i {
		case 3: // event 3, then a different body for 3
			c.publishEpoch(progress(t, s.sessionID, 3, "other"), 1)
		case 5: // later: a third body, and an identical copy (a plain duplicate)
			c.publishEpoch(progress(t, s.sessionID, 3, "third"), 1)
			c.publishEpoch(s.msgs[3], 1)
		}
	}
	eventually(t, 20*time.Second, "the session complete", func() error { return b.complete(s.sessionID, n) })
	eventually(t, 10*time.Second, "the contradictions counted", func() error {
		if got := testutil.ToFloat64(b.metrics.Contradictions.WithLabelValues("sequence")); got != 2 {
			return fmt.Errorf("contradictions %.0f, want 2", got)
		}
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("depth %d", d)
		}
		return nil
	})
	if got := b.messageOf(s.sessionID, 3); strings.Contains(got, "other") || got == "" {
		t.Errorf("event 3 at the app is %q, want the first body", got)
	}
	if !sawEvent(rec, EventContradiction) {
		t.Errorf("no %s Warning Event", EventContradiction)
	}
}

// sawEvent reports whether rec recorded a Warning Event with reason.
func sawEvent(rec *record.FakeRecorder, reason string) bool {
	for {
		select {
		case e := <-rec.Events:
			if strings.HasPrefix(e, "Warning "+reason+" ") {
				return true
			}
		default:
			return false
		}
	}
}

// TestOwnerEpochHeader: the header's accepted forms.
func TestOwnerEpochHeader(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want int64
		bad  bool
	}{{nil, 0, false}, {int64(3), 3, false}, {int32(2), 2, false}, {uint8(1), 1, false}, {int64(-1), 0, true}, {"2", 0, true}, {1.5, 0, true}} {
		h := amqp.Table{}
		if tc.v != nil {
			h[envelope.HeaderOwnerEpoch] = tc.v
		}
		got, err := envelope.OwnerEpoch(h)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("envelope.OwnerEpoch(%v) = %d, %v; want %d, error %v", tc.v, got, err, tc.want, tc.bad)
		}
	}
}
