package caller

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// syncWatch records what of the journal each fsync covered.
type syncWatch struct {
	mu     sync.Mutex
	synced []byte // the journal's content as of the last fsync
	syncs  int
}

func watchSyncs(t *testing.T, s *Store) *syncWatch {
	t.Helper()
	w := &syncWatch{}
	path := filepath.Join(s.dir, journalFile)
	s.fsync = func(f *os.File) error {
		err := f.Sync()
		data, rerr := os.ReadFile(path)
		if rerr != nil {
			t.Error(rerr)
		}
		w.mu.Lock()
		w.synced, w.syncs = data, w.syncs+1
		w.mu.Unlock()
		return err
	}
	return w
}

// covers reports whether the last fsync covered a record of session sid at
// sequence seq.
func (w *syncWatch) covers(sid string, seq int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, raw := range bytes.SplitAfter(w.synced, []byte("\n")) {
		if l, ok := parseLine(raw); ok && l.Session != nil && l.Session.SessionID == sid && l.Session.LastSeq == seq {
			return true
		}
	}
	return false
}

func (w *syncWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.syncs
}

func setSeq(seq int64) func(*SessionRecord) bool {
	return func(r *SessionRecord) bool { r.LastSeq = seq; return true }
}

// TestGroupCommitLingerAcksAfterFsync: records queued within the linger
// share one batch, nothing of it is written or fsynced while it lingers,
// and its callbacks (the acks) run only after the fsync that covers every
// record of it; a batch whose linger ends is written without anyone
// waiting. Broken if a callback ran before the batch's fsync, or a
// lingering batch were written early.
func TestGroupCommitLingerAcksAfterFsync(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetCommitLinger(time.Hour)
	w := watchSyncs(t, s)
	_, t1 := s.RecordSession("a", setSeq(1))
	_, t2 := s.RecordSession("b", setSeq(1))
	_, t3 := s.RecordSession("a", setSeq(2))
	if t1 != t2 || t2 != t3 {
		t.Fatal("records queued within the linger joined different batches")
	}
	acked := make(chan [2]bool, 1)
	t1.Then(func(err error) {
		if err != nil {
			t.Error(err)
		}
		acked <- [2]bool{w.covers("a", 2), w.covers("b", 1)}
	})
	time.Sleep(100 * time.Millisecond)
	if t1.Done() || w.count() != 0 {
		t.Fatalf("a batch with an hour of linger left was written (done %v, fsyncs %d)", t1.Done(), w.count())
	}
	if st, err := os.Stat(filepath.Join(s.dir, journalFile)); err != nil || st.Size() != 0 {
		t.Fatalf("the journal was written to while the batch lingered: %v, %v", st.Size(), err)
	}
	t1.Hurry()
	select {
	case got := <-acked:
		if !got[0] || !got[1] {
			t.Errorf("the acks ran before an fsync covered every record of their batch (a@2 %v, b@1 %v)", got[0], got[1])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a hurried batch was not written")
	}
	if n := w.count(); n != 1 {
		t.Errorf("%d fsyncs for one batch", n)
	}

	// A linger ends by itself.
	s.SetCommitLinger(20 * time.Millisecond)
	_, t4 := s.RecordSession("a", setSeq(3))
	done := make(chan bool, 1)
	t4.Then(func(error) { done <- w.covers("a", 3) })
	select {
	case covered := <-done:
		if !covered {
			t.Error("the ack ran before the fsync of its record")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a batch was not written at the end of its linger")
	}
}

// TestGroupCommitWaitersDoNotLinger: what something waits for is written
// at once (UpdateSession, UpdateTask, DeleteSession, Ticket.Wait), and a
// lingering batch is written by Close; after a reopen it is there.
func TestGroupCommitWaitersDoNotLinger(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.SetCommitLinger(time.Hour)
	start := time.Now()
	_, lingering := s.RecordSession("a", setSeq(4))
	if _, err := s.UpdateSession("b", setSeq(9)); err != nil {
		t.Fatal(err)
	}
	if !lingering.Done() {
		t.Error("the batch a synchronous update joined was not written with it")
	}
	if _, err := s.UpdateTask("m1", func(r *TaskRecord) bool { r.CalleeID = "lab"; return true }); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSession("b"); err != nil {
		t.Fatal(err)
	}
	_, tk := s.RecordSession("a", setSeq(5))
	if err := tk.Wait(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("synchronous writes took %s: they waited for the linger", d)
	}
	_, last := s.RecordSession("a", setSeq(6))
	var ran bool
	last.Then(func(error) { ran = true })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Error("Close returned before the lingering batch's callbacks ran")
	}
	s2, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if seq, _ := s2.Load("a"); seq != 6 {
		t.Errorf("after reopen: a at %d, want 6", seq)
	}
	if _, ok := s2.Session("b"); ok {
		t.Error("after reopen: b is back")
	}
	if _, ok := s2.Task("m1"); !ok {
		t.Error("after reopen: task m1 is missing")
	}
}

// TestLingerDoesNotHoldTheWindow: with a commit linger far longer than the
// test, a stream of more events than the prefetch window (10) still flows:
// once half the window is unsettled the commit is written at once
// (lingerCap). Without that, the broker would stop at 10 unacked events
// and the stream would wait out the linger.
func TestLingerDoesNotHoldTheWindow(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.CommitLinger = time.Hour })
	v := r.submit(t, taskReq("lab"))
	const n = 60
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	for _, m := range s.msgs {
		c.publish(m)
	}
	// The app can only get them all if all but a window's worth were acked.
	eventually(t, 30*time.Second, "the whole stream at the app", func() error { return b.complete(s.sessionID, n) })
}

// TestLingerEndsWithTheNextChange: a batch that has lingered its time is
// written by the next change queued, in the moment that change is made,
// not by a timer of its own that would wake an idle process (at 1,000
// events/s that wake-up cost the caller sidecar about 11 µs of CPU per
// event); a batch no change follows is written at twice the linger.
// Broken if a lingering batch were written at the end of its linger with
// nothing else happening, or if the change that follows it had to wait.
func TestLingerEndsWithTheNextChange(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const linger = 500 * time.Millisecond
	s.SetCommitLinger(linger)
	w := watchSyncs(t, s)
	_, t1 := s.RecordSession("a", setSeq(1))
	time.Sleep(linger + 100*time.Millisecond)
	if t1.Done() || w.count() != 0 {
		t.Fatalf("a batch was written at the end of its linger with no change to carry it (done %v, fsyncs %d)", t1.Done(), w.count())
	}
	start := time.Now()
	_, t2 := s.RecordSession("b", setSeq(1))
	if t1 != t2 {
		t.Fatal("the change after the linger did not join the lingering batch")
	}
	done := make(chan bool, 1)
	t2.Then(func(error) { done <- w.covers("a", 1) && w.covers("b", 1) })
	select {
	case covered := <-done:
		if !covered {
			t.Error("the ack ran before an fsync covered both records")
		}
		if d := time.Since(start); d > linger {
			t.Errorf("the change that ended the linger waited %s for its write", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a change queued after the linger was not written")
	}

	// A batch nothing follows is written at twice the linger.
	start = time.Now()
	_, t3 := s.RecordSession("a", setSeq(2))
	if err := waitDone(t3, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < linger {
		t.Errorf("a lone batch was written after %s, within its linger", d)
	}
	if !w.covers("a", 2) {
		t.Error("the lone batch's ack ran before its fsync")
	}
}

// waitDone waits up to d for tk's batch to be written.
func waitDone(tk *Ticket, d time.Duration) error {
	done := make(chan error, 1)
	tk.Then(func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return errors.New("a lingering batch was never written")
	}
}
