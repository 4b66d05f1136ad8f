package caller

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// TestGapIsSkippedAfterTimeout: from a sender that does not mark its
// events (envelope.HeaderConfirmedThrough), an event that never arrives
// holds the later ones for GapTimeout, then the gap is skipped with a
// warning, the app is told with the next event, and a late copy is
// dropped.
func TestGapIsSkippedAfterTimeout(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.GapTimeout = 500 * time.Millisecond })
	v := r.submit(t, taskReq("lab"))
	const n = 8
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	var missing *envelope.Envelope
	start := time.Now()
	for _, m := range s.msgs {
		if m.Type == envelope.TypeEvent && seqOf(t, m) == 4 {
			missing = m
			continue
		}
		c.publish(m)
	}
	eventually(t, 10*time.Second, "the stream minus one", func() error {
		l, _ := b.app.Session(s.sessionID)
		if l.LastSequence != n || l.Terminal != "task_completed" {
			return fmt.Errorf("last %d terminal %q", l.LastSequence, l.Terminal)
		}
		return nil
	})
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("gap skipped after %s, before the gap timeout", took)
	}
	c.publish(missing)
	eventually(t, 10*time.Second, "the late event dropped", func() error {
		if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonLateEvent)); got != 1 {
			return fmt.Errorf("late %.0f", got)
		}
		return nil
	})
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped)); got != 1 {
		t.Errorf("gap_skipped %.0f, want 1", got)
	}
	l, _ := b.app.Session(s.sessionID)
	want := []int64{1, 2, 3, 5, 6, 7, 8}
	if got := l.Sequences(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("app got sequences %v, want %v", got, want)
	}
	if want := []samplecaller.Lost{{From: 4, To: 4, Reason: LostGapTimeout}}; fmt.Sprint(l.Lost) != fmt.Sprint(want) {
		t.Errorf("app was told of lost %v, want %v", l.Lost, want)
	}
}

// TestGapFromConfirmedMarks: with events marked by the callee sidecar
// (envelope.HeaderConfirmedThrough) time alone never skips a gap, however
// short GapTimeout is: a missing event the callee had not got confirmed
// when it published the later ones is waited for and delivered in order
// when its republished copy arrives; missing events the marks show were
// queued before (and are gone: TTL, overflow) are given up at once, and
// the app is told which, with the next event.
func TestGapFromConfirmedMarks(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.GapTimeout = 50 * time.Millisecond })
	v := r.submit(t, taskReq("lab"))
	const n = 10
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	ev := map[int64]*envelope.Envelope{}
	for _, m := range s.msgs {
		if m.Type == envelope.TypeEvent {
			ev[seqOf(t, m)] = m
		}
	}
	c.publish(s.msgs[0]) // task_accepted
	c.publishMarked(ev[1], 0)
	c.publishMarked(ev[2], 1)
	// 3 and 4 were confirmed and then dropped by the broker; 5 was
	// published before their confirms came, 6 after.
	c.publishMarked(ev[5], 2)
	time.Sleep(300 * time.Millisecond) // six gap timeouts
	if l, _ := b.app.Session(s.sessionID); l.LastSequence != 2 {
		t.Fatalf("the app has up to %d; want 2: 3-4 are not known to be gone yet", l.LastSequence)
	}
	c.publishMarked(ev[6], 4)
	eventually(t, 10*time.Second, "3-4 given up", func() error {
		if l, _ := b.app.Session(s.sessionID); l.LastSequence != 6 {
			return fmt.Errorf("last %d", l.LastSequence)
		}
		return nil
	})
	// 7 lost its confirm with the connection; 8 went out before its
	// republished copy.
	c.publishMarked(ev[8], 6)
	time.Sleep(300 * time.Millisecond)
	if l, _ := b.app.Session(s.sessionID); l.LastSequence != 6 {
		t.Fatalf("the app has up to %d; want 6: 7 is on its way", l.LastSequence)
	}
	c.publishMarked(ev[7], 6)
	c.publishMarked(ev[9], 8)
	c.publish(s.msgs[len(s.msgs)-2]) // task_completed
	c.publishMarked(ev[10], 9)
	eventually(t, 10*time.Second, "the whole stream", func() error {
		if l, _ := b.app.Session(s.sessionID); l.LastSequence != n || l.Terminal != "task_completed" {
			return fmt.Errorf("last %d terminal %q", l.LastSequence, l.Terminal)
		}
		return nil
	})
	l, _ := b.app.Session(s.sessionID)
	if want := []int64{1, 2, 5, 6, 7, 8, 9, 10}; fmt.Sprint(l.Sequences()) != fmt.Sprint(want) {
		t.Errorf("app got sequences %v, want %v", l.Sequences(), want)
	}
	if want := []samplecaller.Lost{{From: 3, To: 4, Reason: LostNotInQueue}}; fmt.Sprint(l.Lost) != fmt.Sprint(want) {
		t.Errorf("app was told of lost %v, want %v", l.Lost, want)
	}
	for _, m := range l.Messages {
		if m.Lost != nil && m.Sequence != 5 {
			t.Errorf("event %d carries lost %+v; only 5 should", m.Sequence, *m.Lost)
		}
	}
	if len(l.Problems) != 0 {
		t.Errorf("app saw problems: %v", l.Problems)
	}
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped)); got != 2 {
		t.Errorf("gap_skipped %.0f, want 2", got)
	}
}
