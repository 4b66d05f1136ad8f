package caller

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
)

// One session whose app deliveries always fail (a poisoned session: a bad
// app reply for it, every time) must not stall another: with a prefetch of
// 10 and 30 of the poisoned session's events queued ahead, the healthy
// session still reaches the app completely, in order.
func TestPoisonedSessionDoesNotStallOthers(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	poisoned := r.submit(t, taskReq("lab"))
	healthy := r.submit(t, taskReq("lab"))
	bad := newScript(t, "lab", poisoned.MessageID, 30)
	good := newScript(t, "lab", healthy.MessageID, 10)
	b.app.FailWhen(func(m samplecaller.Message) bool { return m.SessionID == bad.sessionID && m.Sequence > 2 })
	c := b.callee("lab")
	for _, m := range bad.msgs {
		c.publish(m)
	}
	for _, m := range good.msgs {
		c.publish(m)
	}
	eventually(t, 60*time.Second, "the healthy session delivered while the other is poisoned", func() error {
		return b.complete(good.sessionID, 10)
	})
	if s, ok := b.app.Session(bad.sessionID); !ok || s.LastSequence != 2 {
		t.Errorf("poisoned session: %+v, want it held at sequence 2 (nothing skipped, nothing out of order)", s)
	}
	if n := testutil.ToFloat64(b.metrics.Released); n == 0 {
		t.Error("no delivery was released")
	}
	// The app recovers: the poisoned session's events, some of them
	// returned to the queue meanwhile, all arrive, once each, in order.
	b.app.FailWhen(func(samplecaller.Message) bool { return false })
	eventually(t, 60*time.Second, "the poisoned session, once the app recovered", func() error {
		return b.complete(bad.sessionID, 30)
	})
}
