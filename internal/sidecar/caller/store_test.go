package caller

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
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
