package caller

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/internal/transport/transporttest"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// The group commit's two crash windows, with a real process killed by
// SIGKILL on a real broker: an event the app has processed (2xx) is acked
// only after the fsync of its session record, so a crash before that
// commit leaves it unacked and it comes back, marked redelivered; a crash
// after the commit and before the ack brings it back too, and the
// restarted sidecar recognises it from its journal and does not deliver it
// again. The commit linger (Options.CommitLinger) holds the window open for
// as long as the test needs: the sidecar process lingers, and nothing else
// hurries its commit (three events stay below half the prefetch window of
// 10, lingerCap).

// TestCrashBeforeCommitRedelivers: the app took events 1–3, the sidecar
// lingers on their commit and is killed. Nothing of them was acked (the
// broker holds them, ready, once the process is gone) and the journal has
// no record of them; the next process delivers them again with
// redelivered=true, then the rest of the session, once each.
func TestCrashBeforeCommitRedelivers(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns sidecar processes")
	}
	b := newBed(t, "lab")
	p := b.spawnWith(t, 0, b.amqpURL(b.caller), lingerEnv+"=1h")
	v := p.submit(t, taskReq("lab"))
	s := newScript(t, "lab", v.MessageID, 8)
	c := b.callee("lab")
	for _, m := range s.msgs[:4] { // task_accepted, events 1–3
		c.publish(m)
	}
	b.waitEvents(t, s.sessionID, 3)
	// An ack sent before the commit would reach the broker meanwhile.
	time.Sleep(300 * time.Millisecond)
	p.kill(t)
	if seq := journalSeq(t, b.stateDir, s.sessionID); seq != 0 {
		t.Fatalf("the journal records sequence %d: the commit was not lingering when the process died", seq)
	}
	if n := b.readyCount(t, 3); n != 3 {
		t.Fatalf("%d of events 1–3 back in the queue after the crash, want 3: an event was acked before its commit", n)
	}
	log := b.resumeAfterCrash(t, c, s)
	if log.Deduplicated != 3 || log.Duplicates != 0 {
		t.Errorf("the app got %d events again with redelivered=true (want 3) and %d without (want 0)", log.Deduplicated, log.Duplicates)
	}
}

// TestCrashAfterCommitBeforeAckDeduplicates: the broker connection is cut
// while the app answers event 3 (so no ack can leave), the sidecar commits
// events 1–3 and is killed. The broker gives them to the next process,
// which finds them in its journal: acked, not delivered again.
func TestCrashAfterCommitBeforeAckDeduplicates(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns sidecar processes")
	}
	b := newBed(t, "lab")
	proxy := transporttest.NewProxy(t, b.broker.AMQPAddr)
	p := b.spawnWith(t, 0, b.amqpURLVia(proxy.Addr(), b.caller), lingerEnv+"=500ms")
	v := p.submit(t, taskReq("lab"))
	s := newScript(t, "lab", v.MessageID, 8)
	var cut sync.Once
	b.app.FailWhen(func(m samplecaller.Message) bool {
		if m.SessionID == s.sessionID && m.Sequence == 3 {
			cut.Do(func() { proxy.Down(true); proxy.Cut() })
		}
		return false
	})
	c := b.callee("lab")
	for _, m := range s.msgs[:4] {
		c.publish(m)
	}
	b.waitEvents(t, s.sessionID, 3)
	eventually(t, 30*time.Second, "the commit of event 3", func() error {
		if seq := journalSeq(t, b.stateDir, s.sessionID); seq != 3 {
			return fmt.Errorf("the journal records sequence %d", seq)
		}
		return nil
	})
	p.kill(t)
	if n := b.readyCount(t, 3); n != 3 {
		t.Fatalf("%d of events 1–3 back in the queue, want 3 (the cut came too late to hold their acks)", n)
	}
	log := b.resumeAfterCrash(t, c, s)
	if log.Deduplicated != 0 || log.Duplicates != 0 {
		t.Errorf("committed events were delivered again: %d with redelivered=true, %d without (want none)", log.Deduplicated, log.Duplicates)
	}
	eventually(t, 30*time.Second, "an empty queue", func() error {
		if n := b.readyCount(t, 0); n != 0 {
			return fmt.Errorf("%d messages left", n)
		}
		return nil
	})
}

// kill SIGKILLs the process and waits for it.
func (p *process) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = p.cmd.Process.Wait()
}

// waitEvents waits until the app has received n events of session sid.
func (b *bed) waitEvents(t *testing.T, sid string, n int) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%d events at the app", n), func() error {
		if log, ok := b.app.Session(sid); !ok || log.Events < n {
			return fmt.Errorf("%d events", log.Events)
		}
		return nil
	})
}

// readyCount is the number of ready messages in the caller's event queue,
// once it reaches want or after 10 s (the broker returns a dead
// connection's unacked deliveries when it notices the close).
func (b *bed) readyCount(t *testing.T, want int) int {
	t.Helper()
	ch, err := b.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q, err := ch.QueueDeclarePassive(topology.EventQueue(b.callerID), true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == want || time.Now().After(deadline) {
			return q.Messages
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// journalSeq is the highest last_processed_sequence of session sid that
// the journal in dir holds (as a restarted process would read it).
func journalSeq(t *testing.T, dir, sid string) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, journalFile))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var seq int64
	for _, raw := range bytes.SplitAfter(data, []byte("\n")) {
		if l, ok := parseLine(raw); ok && l.Session != nil && l.Session.SessionID == sid {
			seq = max(seq, l.Session.LastSeq)
		}
	}
	return seq
}

// resumeAfterCrash starts the next sidecar process, publishes the rest of
// the script and returns the app's record of the session once all of it
// was delivered.
func (b *bed) resumeAfterCrash(t *testing.T, c *callee, s *script) samplecaller.SessionLog {
	t.Helper()
	b.spawn(t, 1)
	for _, m := range s.msgs[4:] {
		c.publish(m)
	}
	eventually(t, 60*time.Second, "the session delivered", func() error { return b.complete(s.sessionID, 8) })
	log, _ := b.app.Session(s.sessionID)
	return log
}
