package caller

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/tools/record"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestPoisonEventIsDeadLettered: the app refuses event 3 of a session every
// time. After MaxAttempts refusals the event goes to the Caller's
// dead-letter queue (through the event queue's dead-letter exchange), a
// Warning Event and the metric say so, and the session goes on: event 4
// reaches the app announcing 3 as lost (dead_lettered), and the session
// completes. A second session, meanwhile, is not held up.
func TestPoisonEventIsDeadLettered(t *testing.T) {
	if testing.Short() {
		t.Skip("RabbitMQ")
	}
	b := newBed(t, "lab")
	rec := record.NewFakeRecorder(100)
	const attempts = 3
	r := b.start(withRecorder(rec), func(o *Options) { o.MaxAttempts = attempts })
	const n = 6
	poisoned := newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, n)
	healthy := newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, n)
	var refused int
	b.app.FailWhen(func(m samplecaller.Message) bool {
		if m.SessionID == poisoned.sessionID && m.Sequence == 3 {
			refused++
			return true
		}
		return false
	})
	c := b.callee("lab")
	for i := range poisoned.msgs {
		c.publish(poisoned.msgs[i])
		c.publish(healthy.msgs[i])
	}
	eventually(t, 20*time.Second, "the healthy session", func() error { return b.complete(healthy.sessionID, n) })
	eventually(t, 30*time.Second, "the poisoned session past its dead letter", func() error {
		l, _ := b.app.Session(poisoned.sessionID)
		if l.LastSequence != n || l.Terminal != "task_completed" || l.Events != n-1 {
			return fmt.Errorf("last %d terminal %q events %d", l.LastSequence, l.Terminal, l.Events)
		}
		if len(l.Lost) != 1 || l.Lost[0].From != 3 || l.Lost[0].To != 3 || l.Lost[0].Reason != LostDeadLettered {
			return fmt.Errorf("lost %+v, want 3-3 %s", l.Lost, LostDeadLettered)
		}
		if len(l.Problems) > 0 {
			return fmt.Errorf("problems %v", l.Problems)
		}
		return nil
	})
	dlq := topology.DeadLetterQueue(topology.EventQueue(b.callerID))
	eventually(t, 10*time.Second, "the event in the dead-letter queue", func() error {
		if d := b.queueDepth(dlq); d != 1 {
			return fmt.Errorf("%s holds %d", dlq, d)
		}
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("event queue holds %d", d)
		}
		return nil
	})
	if got := testutil.ToFloat64(b.metrics.DeadLetters.WithLabelValues(DeadLetterMaxAttempts)); got != 1 {
		t.Errorf("dead letters %.0f, want 1", got)
	}
	if !sawEvent(rec, EventDeadLettered) {
		t.Errorf("no %s Warning Event", EventDeadLettered)
	}
}

// TestGapWaitIsBounded: event 2 of a session never comes, and the marks of
// the events behind it (confirmed-through 0) say it is on its way, so the
// session waits for it whatever the time, while the events behind it go
// round the queue. After MaxGapWait the gap is given up: the rest of the
// session is delivered, announcing 2 as lost (gap_wait_limit).
func TestGapWaitIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("RabbitMQ")
	}
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.MaxGapWait = 3 * time.Second })
	const n = 6
	s := newScript(t, "lab", r.submit(t, taskReq("lab")).MessageID, n)
	c := b.callee("lab")
	c.publish(s.msgs[0])
	c.publishMarked(s.msgs[1], 0)
	for _, m := range s.msgs[3:] {
		c.publishMarked(m, 0)
	}
	eventually(t, 30*time.Second, "the session past the gap", func() error {
		l, _ := b.app.Session(s.sessionID)
		if l.LastSequence != n || l.Terminal != "task_completed" {
			return fmt.Errorf("last %d terminal %q", l.LastSequence, l.Terminal)
		}
		if len(l.Lost) != 1 || l.Lost[0].From != 2 || l.Lost[0].To != 2 || l.Lost[0].Reason != LostGapWaitLimit {
			return fmt.Errorf("lost %+v, want 2-2 %s", l.Lost, LostGapWaitLimit)
		}
		return nil
	})
}
