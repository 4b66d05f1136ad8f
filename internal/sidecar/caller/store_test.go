package caller

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

func TestStoreSurvivesReopenAndTornTail(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	if _, err := s.UpdateTask("t1", func(r *TaskRecord) bool {
		r.CalleeID, r.State, r.SubmittedAt, r.Envelope = "lab", TaskPending, now, []byte(`{"x":1}`)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for seq := int64(1); seq <= 5; seq++ {
		if err := s.Save("s1", seq); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Save("s1", 3); err != nil { // never lowers
		t.Fatal(err)
	}
	if _, err := OpenStore(dir); err == nil {
		t.Fatal("a second store opened the same directory")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A crash in the middle of an append leaves a torn line.
	f, err := os.OpenFile(filepath.Join(dir, journalFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(`0badc0de {"session":{"session_id":"s1","last_seq":99`)
	_ = f.Close()

	s2, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if seq, _ := s2.Load("s1"); seq != 5 {
		t.Errorf("last sequence %d after reopen, want 5", seq)
	}
	if tr, ok := s2.Task("t1"); !ok || tr.CalleeID != "lab" || string(tr.Envelope) != `{"x":1}` || !tr.SubmittedAt.Equal(now) {
		t.Errorf("task after reopen: %+v", tr)
	}
	// Appends after the torn tail land on a line boundary.
	if err := s2.Save("s1", 6); err != nil {
		t.Fatal(err)
	}
	_ = s2.Close()
	s3, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if seq, _ := s3.Load("s1"); seq != 6 {
		t.Errorf("last sequence %d, want 6", seq)
	}
}

func TestStoreCompactsAndGroupCommits(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Concurrent writers share fsyncs; enough writes to force compactions.
	var wg sync.WaitGroup
	const sessions, writes = 8, 4000
	pad := make([]byte, 300)
	for i := range pad {
		pad[i] = 'x'
	}
	start := time.Now()
	for i := range sessions {
		wg.Go(func() {
			for seq := int64(1); seq <= writes; seq++ {
				if _, err := s.UpdateSession(fmt.Sprintf("s%d", i), func(r *SessionRecord) bool {
					r.LastSeq, r.Token = seq, string(pad)
					return true
				}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if err := s.DeleteSession("s0"); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	fi, err := os.Stat(filepath.Join(dir, journalFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d durable writes from %d goroutines in %s (%.0f/s); journal %d bytes after compaction", sessions*writes, sessions, took.Round(time.Millisecond),
		float64(sessions*writes)/took.Seconds(), fi.Size())
	if fi.Size() > compactThreshold+1<<20 {
		t.Errorf("journal %d bytes: not compacted", fi.Size())
	}
	s2, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, ok := s2.Session("s0"); ok {
		t.Error("deleted session came back")
	}
	for i := 1; i < sessions; i++ {
		if seq, _ := s2.Load(fmt.Sprintf("s%d", i)); seq != writes {
			t.Errorf("s%d: last sequence %d, want %d", i, seq, writes)
		}
	}
}

func TestStoreInMemory(t *testing.T) {
	s, err := OpenStore("")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save("a", 3); err != nil {
		t.Fatal(err)
	}
	if seq, _ := s.Load("a"); seq != 3 {
		t.Errorf("got %d", seq)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestStoreRecordSessionGroupCommit: RecordSession does not wait; its
// ticket's callbacks run after the fsync that covers it, in order; a record
// written many times before its batch is taken is durable in its latest
// state; a delete between two writes keeps its order.
func TestStoreRecordSessionGroupCommit(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		got []int64
	)
	var last *Ticket
	for seq := int64(1); seq <= 200; seq++ {
		for _, sid := range []string{"a", "b"} {
			_, tk := s.RecordSession(sid, func(r *SessionRecord) bool { r.LastSeq = seq; return true })
			if sid == "a" {
				tk.Then(func(err error) {
					if err != nil {
						t.Error(err)
					}
					mu.Lock()
					got = append(got, seq)
					mu.Unlock()
				})
			}
			last = tk
		}
	}
	if r, _ := s.Session("a"); r.LastSeq != 200 {
		t.Fatalf("in memory: %d", r.LastSeq)
	}
	if err := last.Wait(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(got) != 200 {
		t.Errorf("%d callbacks ran, want 200", len(got))
	}
	for i, seq := range got {
		if seq != int64(i+1) {
			t.Fatalf("callback %d for sequence %d: out of order", i, seq)
		}
	}
	mu.Unlock()
	// Write, delete, write again, without waiting in between.
	s.RecordSession("c", func(r *SessionRecord) bool { r.LastSeq = 1; return true })
	if err := s.DeleteSession("c"); err != nil {
		t.Fatal(err)
	}
	_, tk := s.RecordSession("c", func(r *SessionRecord) bool { r.LastSeq = 7; return true })
	s.RecordSession("c", func(r *SessionRecord) bool { r.LastSeq = 8; return true })
	if err := tk.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for sid, want := range map[string]int64{"a": 200, "b": 200, "c": 8} {
		if r, ok := s2.Session(sid); !ok || r.LastSeq != want {
			t.Errorf("after reopen %s: %d (found %v), want %d", sid, r.LastSeq, ok, want)
		}
	}
}

// TestTaskForSession: a task is found by the session id it expects, by
// the one its task_accepted named instead, and by its legacy session id;
// not by a session id it no longer has, nor once deleted; and the same
// after the journal is replayed.
func TestTaskForSession(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	legacy := topology.LegacySessionID("lab", "m1")
	for _, id := range []string{"m1", "m2"} {
		if _, err := s.UpdateTask(id, func(r *TaskRecord) bool {
			r.CalleeID, r.SessionID = "lab", "expected-"+id
			return true
		}); err != nil {
			t.Fatal(err)
		}
	}
	found := func(s *Store, sid, want string) {
		t.Helper()
		got, ok := s.TaskForSession(sid)
		switch {
		case want == "" && ok:
			t.Errorf("session %s: found task %s, want none", sid, got.MessageID)
		case want != "" && (!ok || got.MessageID != want):
			t.Errorf("session %s: found %q (%v), want task %s", sid, got.MessageID, ok, want)
		}
	}
	found(s, "expected-m1", "m1")
	found(s, "expected-m2", "m2")
	found(s, legacy, "m1")
	// task_accepted names another session id.
	if _, err := s.UpdateTask("m1", func(r *TaskRecord) bool { r.SessionID = "accepted-m1"; return true }); err != nil {
		t.Fatal(err)
	}
	found(s, "expected-m1", "")
	found(s, "accepted-m1", "m1")
	found(s, legacy, "m1")
	if err := s.DeleteTask("m2"); err != nil {
		t.Fatal(err)
	}
	found(s, "expected-m2", "")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	found(s2, "accepted-m1", "m1")
	found(s2, legacy, "m1")
	found(s2, "expected-m1", "")
	found(s2, "expected-m2", "")
}
