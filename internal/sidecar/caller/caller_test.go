package caller

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestSubmitThenStream: a task submitted through the local API reaches the
// callee's command queue as a proper task_submit, and the session's stream
// reaches the app whole, in order, with the sidecar's views following.
func TestSubmitThenStream(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	v := r.submit(t, taskReq("lab"))
	if v.Status != TaskPending || v.Warning != "" || v.SessionID != topology.SessionID("lab", "alpha", v.MessageID) {
		t.Fatalf("POST /hcp/v1/tasks = %+v", v)
	}

	// The command as the callee sees it.
	ch, err := b.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var d amqp.Delivery
	eventually(t, 10*time.Second, "the task_submit in the command queue", func() error {
		var ok bool
		d, ok, err = ch.Get(topology.CommandQueue("lab"), true)
		if err != nil || !ok {
			return fmt.Errorf("empty (%v)", err)
		}
		return nil
	})
	env, err := envelope.FromDelivery(d, 0)
	if err != nil {
		t.Fatal(err)
	}
	var p task.TaskSubmit
	if err := json.Unmarshal(env.Payload, &p); err != nil {
		t.Fatal(err)
	}
	if d.UserId != b.caller.name || d.DeliveryMode != amqp.Persistent || env.MessageID != v.MessageID ||
		env.Type != envelope.TypeTaskSubmit || p.CallerID != b.callerID || p.CalleeID != "lab" || p.Capability != "analyze" {
		t.Fatalf("task_submit: user_id %q mode %d envelope %+v payload %+v", d.UserId, d.DeliveryMode, env, p)
	}

	// The session.
	const n = 20
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	for _, m := range s.msgs {
		c.publish(m)
	}
	eventually(t, 20*time.Second, "the whole stream at the app", func() error { return b.complete(s.sessionID, n) })
	log, _ := b.app.Session(s.sessionID)
	if log.Messages[0].Type != "task_accepted" || log.Messages[len(log.Messages)-2].Type != "task_completed" ||
		log.Messages[len(log.Messages)-1].EventType != "session_closed" {
		t.Errorf("app saw %+v", log.Messages)
	}

	var tv TaskView
	if st := r.call(t, http.MethodGet, "/hcp/v1/tasks/"+v.MessageID, nil, &tv); st != 200 || tv.Status != TaskAccepted || !tv.DeliveredToApp || tv.SessionID != s.sessionID {
		t.Errorf("GET task: %d %+v", st, tv)
	}
	var sv SessionView
	eventually(t, 5*time.Second, "the session view", func() error {
		if st := r.call(t, http.MethodGet, "/hcp/v1/sessions/"+s.sessionID, nil, &sv); st != 200 {
			return fmt.Errorf("HTTP %d", st)
		}
		if sv.State != "COMPLETED" || sv.LastSequence != n || !sv.Finished || sv.CalleeID != "lab" || sv.TokenExpiresAt == nil || sv.Terminal != "task_completed" {
			return fmt.Errorf("%+v", sv)
		}
		return nil
	})
	eventually(t, 10*time.Second, "an empty event queue", func() error {
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("%d messages left", d)
		}
		return nil
	})
}

// TestConcurrentSessionsDuplicatesAndReordering: several sessions
// interleaved in one queue, each with redelivered duplicates (same and new
// message ids) and pairs published out of order: every session reaches the
// app exactly once and in order.
func TestConcurrentSessionsDuplicatesAndReordering(t *testing.T) {
	b := newBed(t, "lab", "mill")
	r := b.start()
	const sessions, n = 6, 40
	var scripts []*script
	for i := range sessions {
		callee := []string{"lab", "mill"}[i%2]
		v := r.submit(t, taskReq(callee))
		scripts = append(scripts, newScript(t, callee, v.MessageID, n))
	}
	var wg sync.WaitGroup
	dups := 0
	var dupMu sync.Mutex
	for i, s := range scripts {
		c := b.callee([]string{"lab", "mill"}[i%2])
		wg.Go(func() {
			msgs := s.msgs
			for j := 0; j < len(msgs); j++ {
				m := msgs[j]
				// Swap every fifth pair of events (out-of-order arrival).
				if j%5 == 2 && j+1 < len(msgs) && msgs[j+1].Type == envelope.TypeEvent && m.Type == envelope.TypeEvent {
					c.publish(msgs[j+1])
					c.publish(m)
					j++
					continue
				}
				c.publish(m)
				// A redelivered duplicate: the same message again, or the
				// same sequence under a new message id (a callee republish).
				if j%7 == 3 {
					c.publish(m)
					dup := *m
					dup.MessageID = envelope.NewMessageID()
					c.publish(&dup)
					dupMu.Lock()
					dups += 2
					dupMu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, s := range scripts {
		eventually(t, 30*time.Second, "session "+s.sessionID, func() error { return b.complete(s.sessionID, n) })
	}
	snap := b.app.Snapshot()
	if snap.Duplicates != 0 || snap.Deduplicated != 0 || snap.Problems != 0 {
		t.Errorf("app saw %d duplicates (+%d flagged redelivered), %d problems", snap.Duplicates, snap.Deduplicated, snap.Problems)
	}
	skipped := testutil.ToFloat64(b.metrics.Duplicates.WithLabelValues("sequence")) + testutil.ToFloat64(b.metrics.Duplicates.WithLabelValues("message"))
	t.Logf("sessions %d × %d events; duplicates published %d, skipped by the sidecar %.0f; app received %d messages, 0 duplicates",
		sessions, n, dups, skipped, snap.Total)
	if int(skipped) != dups {
		t.Errorf("sidecar skipped %.0f duplicates, %d were published", skipped, dups)
	}
}

// TestAppFailuresAreRetried: the app answers 500 to every third message the
// first time it sees it; those are nacked, redelivered and delivered again,
// nothing is lost or reordered.
func TestAppFailuresAreRetried(t *testing.T) {
	b := newBed(t, "lab")
	var mu sync.Mutex
	failed := map[string]bool{}
	count := 0
	b.app.FailWhen(func(m samplecaller.Message) bool {
		mu.Lock()
		defer mu.Unlock()
		count++
		if count%3 == 0 && !failed[m.MessageID] {
			failed[m.MessageID] = true
			return true
		}
		return false
	})
	r := b.start()
	const sessions, n = 3, 30
	var wg sync.WaitGroup
	var scripts []*script
	for range sessions {
		v := r.submit(t, taskReq("lab"))
		scripts = append(scripts, newScript(t, "lab", v.MessageID, n))
	}
	for _, s := range scripts {
		c := b.callee("lab")
		wg.Go(func() {
			for _, m := range s.msgs {
				c.publish(m)
			}
		})
	}
	wg.Wait()
	for _, s := range scripts {
		eventually(t, 60*time.Second, "session "+s.sessionID, func() error { return b.complete(s.sessionID, n) })
	}
	snap := b.app.Snapshot()
	errs := testutil.ToFloat64(b.metrics.AppDeliveries.WithLabelValues("error"))
	t.Logf("app failed %d deliveries on purpose (sidecar counted %.0f); received %d messages, %d duplicates", snap.Failed, errs, snap.Total, snap.Duplicates)
	if snap.Failed == 0 || float64(snap.Failed) != errs || snap.Duplicates != 0 || snap.Deduplicated != 0 {
		t.Errorf("failed %d, counted %.0f, duplicates %d", snap.Failed, errs, snap.Duplicates)
	}
}

// TestDuplicatesAfterRestart: events the app already acknowledged, arriving
// again after a restart (a callee republish), are recognised from the
// store and skipped.
func TestDuplicatesAfterRestart(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	v := r.submit(t, taskReq("lab"))
	const n = 12
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	half := 7 // accepted + events 1..6
	for _, m := range s.msgs[:half] {
		c.publish(m)
	}
	eventually(t, 10*time.Second, "the first half", func() error {
		if l, _ := b.app.Session(s.sessionID); l.LastSequence != 6 {
			return fmt.Errorf("last %d", l.LastSequence)
		}
		return nil
	})
	r.stop(t)
	// While the caller is down the callee republishes everything (new
	// message ids, same sequences), then goes on.
	for _, m := range s.msgs[:half] {
		dup := *m
		dup.MessageID = envelope.NewMessageID()
		c.publish(&dup)
	}
	for _, m := range s.msgs[half:] {
		c.publish(m)
	}
	b.start()
	eventually(t, 20*time.Second, "the whole stream", func() error { return b.complete(s.sessionID, n) })
	if got := testutil.ToFloat64(b.metrics.Duplicates.WithLabelValues("sequence")) + testutil.ToFloat64(b.metrics.Duplicates.WithLabelValues("message")); int(got) != half {
		t.Errorf("skipped %.0f duplicates after the restart, want %d", got, half)
	}
}
