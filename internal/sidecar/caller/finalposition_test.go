package caller

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestShortSessionOneWrite runs against envtest and the real broker, with
// the caller's default status interval: a session shorter than the
// interval costs one write of callerAckedSequence, made soon after its
// last message (session_closed) and holding it. Before, the write at
// task_completed held the sequence before session_closed, which a second
// write carried an interval later.
func TestShortSessionOneWrite(t *testing.T) {
	sb := newStatusBed(t, DefaultStatusInterval, "lab")
	const n = 4
	v := sb.r.submit(t, taskReq("lab"))
	hs := sb.newSession(v.MessageID)
	s := newScript(t, "lab", v.MessageID, n)
	c := sb.b.callee("lab")
	for _, m := range s.msgs {
		c.publish(m)
	}
	eventually(t, 10*time.Second, "the stream", func() error { return sb.b.complete(s.sessionID, n) })
	start := time.Now()
	eventually(t, DefaultStatusInterval/2, "callerAckedSequence at session_closed's", func() error {
		if got := sb.acked(hs.Name); got != n {
			return fmt.Errorf("callerAckedSequence %d, want %d", got, n)
		}
		return nil
	})
	t.Logf("callerAckedSequence %d written %s after the app had the session's last message", n, time.Since(start).Round(time.Millisecond))
	// An interval later nothing more was written.
	time.Sleep(DefaultStatusInterval + time.Second)
	if writes := testutil.ToFloat64(sb.b.metrics.StatusWrites.WithLabelValues("ok")); writes != 1 {
		t.Errorf("%.0f status writes for a session shorter than the interval, want 1", writes)
	}
}
