package wal

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func msg(i int64, key string) Message {
	return Message{Index: i, Seq: i, Key: key, RoutingKey: "alpha.s.event", State: "RUNNING", Body: []byte(fmt.Sprintf(`{"n":%d}`, i))}
}

func reopen(t *testing.T, dir string) map[string]*Session {
	t.Helper()
	l, ss, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	return ss
}

func TestReplayKeepsUnconfirmedMessagesAndKeys(t *testing.T) {
	dir := t.TempDir()
	l, ss, err := Open(dir)
	if err != nil || len(ss) != 0 {
		t.Fatalf("fresh log: %v %v", ss, err)
	}
	must(t, l.Open("s1", []byte(`{"task":1}`)))
	for i := int64(1); i <= 5; i++ {
		must(t, l.Append("s1", msg(i, fmt.Sprintf("k%d", i))))
	}
	must(t, l.Confirm("s1", 3))
	must(t, l.Open("s2", nil))
	must(t, l.Append("s2", msg(1, "")))
	must(t, l.Close("s2"))
	must(t, l.Release())

	got := reopen(t, dir)
	if len(got) != 1 {
		t.Fatalf("sessions after replay: %d, want 1 (s2 was closed)", len(got))
	}
	s := got["s1"]
	if string(s.Task) != `{"task":1}` || s.LastSeq != 5 || s.Confirmed != 3 || s.State != "RUNNING" {
		t.Fatalf("replayed %+v", s)
	}
	if len(s.Pending) != 2 || s.Pending[0].Seq != 4 || string(s.Pending[1].Body) != `{"n":5}` {
		t.Fatalf("pending %+v", s.Pending)
	}
	if get(s, "k2") != 2 || get(s, "k5") != 5 {
		t.Fatalf("keys: %d", s.Keys.Len())
	}
}

func TestTornTailIsDropped(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir)
	must(t, err)
	must(t, l.Open("s1", nil))
	must(t, l.Append("s1", msg(1, "")))
	must(t, l.Append("s1", msg(2, "")))
	must(t, l.Release())
	path := filepath.Join(dir, FileName)
	fi, err := os.Stat(path)
	must(t, err)
	must(t, os.Truncate(path, fi.Size()-3)) // a crash in the middle of the last write
	l, ss, err := Open(dir)
	must(t, err)
	if s := ss["s1"]; s == nil || s.LastSeq != 1 || len(s.Pending) != 1 {
		t.Fatalf("after a torn tail: %+v", ss["s1"])
	}
	// New records follow the last good one.
	must(t, l.Append("s1", msg(2, "again")))
	must(t, l.Release())
	if s := reopen(t, dir)["s1"]; s.LastSeq != 2 || get(s, "again") != 2 {
		t.Fatalf("append after truncation: %+v", s)
	}
}

func TestCompactionKeepsTheLiveState(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir)
	must(t, err)
	l.SetCompactAt(4 << 10)
	must(t, l.Open("s1", []byte("task")))
	for i := int64(1); i <= 500; i++ {
		must(t, l.Append("s1", msg(i, fmt.Sprintf("k%d", i))))
		if i%10 == 0 {
			must(t, l.Confirm("s1", i-2))
		}
	}
	must(t, l.Release())
	fi, err := os.Stat(filepath.Join(dir, FileName))
	must(t, err)
	if fi.Size() > 64<<10 {
		t.Fatalf("log not compacted: %d bytes", fi.Size())
	}
	s := reopen(t, dir)["s1"]
	if s == nil || string(s.Task) != "task" || s.LastSeq != 500 || s.Confirmed != 498 || len(s.Pending) != 2 || s.Pending[0].Seq != 499 {
		t.Fatalf("after compaction: %+v", s)
	}
	if get(s, "k500") != 500 || get(s, "k1") != 1 {
		t.Fatalf("keys after compaction: %d keys", s.Keys.Len())
	}
}

// A takeover's open record replaces what the log held for the session (an
// earlier ownership's messages and keys) and carries the last sequence
// used before it, through replay and compaction, until its own messages
// follow.
func TestAdoptStartsAfterTheEarlierOwner(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir)
	must(t, err)
	l.SetCompactAt(4 << 10)
	must(t, l.Open("s1", []byte("task-1")))
	must(t, l.Append("s1", msg(1, "k1"), msg(2, "k2")))
	must(t, l.Adopt("s1", []byte("task-2"), 1007))
	must(t, l.Adopt("s2", []byte("task-3"), 40))
	must(t, l.Release())
	got := reopen(t, dir)
	s := got["s1"]
	if string(s.Task) != "task-2" || s.LastSeq != 1007 || s.LastIndex != 0 || len(s.Pending) != 0 || s.Keys.Len() != 0 || s.State != "" {
		t.Fatalf("after Adopt: %+v", s)
	}
	l, _, err = Open(dir)
	must(t, err)
	l.SetCompactAt(4 << 10)
	must(t, l.Append("s1", Message{Index: 1, Seq: 1008, Key: "k", RoutingKey: "alpha.s1.event", State: "PAUSED", Body: []byte("{}")}))
	for i := int64(1); i <= 200; i++ { // compacted many times over
		must(t, l.Append("s3", msg(i, "")))
		must(t, l.Confirm("s3", i))
	}
	must(t, l.Release())
	got = reopen(t, dir)
	if s := got["s1"]; s.LastSeq != 1008 || s.LastIndex != 1 || s.State != "PAUSED" || len(s.Pending) != 1 || get(s, "k") != 1008 {
		t.Fatalf("s1 after its first message and compactions: %+v", s)
	}
	if s := got["s2"]; string(s.Task) != "task-3" || s.LastSeq != 40 || s.LastIndex != 0 {
		t.Fatalf("s2 (nothing logged after Adopt) after compactions: %+v", s)
	}
}

// SetTask gives a session logged without a task its task and keeps its
// messages, keys, confirms and state.
func TestSetTaskKeepsTheSession(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir)
	must(t, err)
	must(t, l.Append("s1", msg(1, "k1"), msg(2, "k2"), msg(3, "")))
	must(t, l.Confirm("s1", 1))
	must(t, l.SetTask("s1", []byte("task")))
	must(t, l.Append("s1", msg(4, "k4")))
	must(t, l.Release())
	s := reopen(t, dir)["s1"]
	if string(s.Task) != "task" || s.LastSeq != 4 || s.LastIndex != 4 || s.Confirmed != 1 || s.State != "RUNNING" {
		t.Fatalf("after SetTask: %+v", s)
	}
	if len(s.Pending) != 3 || s.Pending[0].Seq != 2 || s.Pending[2].Seq != 4 || get(s, "k1") != 1 || get(s, "k4") != 4 {
		t.Fatalf("pending %+v, %d keys", s.Pending, s.Keys.Len())
	}
}

func TestKeysAreBounded(t *testing.T) {
	l, _, err := Open("")
	must(t, err)
	for i := int64(1); i <= MaxKeys+10; i++ {
		must(t, l.Append("s", msg(i, fmt.Sprintf("k%d", i))))
	}
	s := l.sessions["s"]
	if s.Keys.Len() != MaxKeys || get(s, "k1") != 0 || get(s, fmt.Sprintf("k%d", MaxKeys+10)) == 0 {
		t.Fatalf("keys: %d", s.Keys.Len())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func get(s *Session, key string) int64 {
	seq, _ := s.Keys.Get(key)
	return seq
}

// TestAppendBatchIsOneWrite: messages appended together are one write and
// replay as the messages they are; a log without a directory writes
// nothing.
func TestAppendBatchIsOneWrite(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	must(t, l.Open("s1", nil))
	must(t, l.Append("s1", msg(1, "a"), msg(2, ""), msg(3, "c")))
	must(t, l.Append("s1", msg(4, "")))
	if n := l.MessageWrites(); n != 2 {
		t.Errorf("%d writes for two appends", n)
	}
	must(t, l.Release())
	s := reopen(t, dir)["s1"]
	if s == nil || len(s.Pending) != 4 || s.LastSeq != 4 || get(s, "a") != 1 || get(s, "c") != 3 {
		t.Fatalf("replayed %+v", s)
	}
	mem, _, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	must(t, mem.Append("s1", msg(1, "")))
	if n := mem.MessageWrites(); n != 0 {
		t.Errorf("a log without a directory wrote %d times", n)
	}
}

// TestMarkConfirmedWritesEveryConfirmEvery: a session whose 200 events
// are each confirmed alone (a paced stream) writes a confirm record once
// per ConfirmEvery of them, not once per event; in memory none is left
// pending, and a restart from the file republishes fewer than
// ConfirmEvery.
func TestMarkConfirmedWritesEveryConfirmEvery(t *testing.T) {
	const n = 200
	size := func(mark bool) (int64, *Log, string) {
		dir := t.TempDir()
		l, _, err := Open(dir)
		must(t, err)
		must(t, l.Open("s1", nil))
		for i := int64(1); i <= n; i++ {
			must(t, l.Append("s1", msg(i, "")))
			if mark {
				must(t, l.MarkConfirmed("s1", i))
			}
		}
		fi, err := os.Stat(filepath.Join(dir, FileName))
		must(t, err)
		return fi.Size(), l, dir
	}
	bare, l0, _ := size(false)
	must(t, l0.Release())
	marked, l, dir := size(true)
	if p := l.sessions["s1"].Pending; len(p) != 0 {
		t.Fatalf("%d messages pending in memory after every confirm; want none", len(p))
	}
	must(t, l.Release())
	record := int64(len(frame(nil, func(b []byte) []byte { return appendConfirm(b, "s1", n) })))
	if writes := (marked - bare) / record; writes > n/ConfirmEvery+1 {
		t.Fatalf("%d confirm records for %d events confirmed one by one; want at most %d (one per %d)", writes, n, n/ConfirmEvery+1, ConfirmEvery)
	}
	s := reopen(t, dir)["s1"]
	if s.Confirmed < n-ConfirmEvery || int64(len(s.Pending)) != n-s.Confirmed {
		t.Fatalf("after a restart: confirmed %d, %d pending; want at least %d confirmed and the rest pending", s.Confirmed, len(s.Pending), n-ConfirmEvery)
	}
}

// The log keeps the task it is given, not a copy: the callee's session
// holds the same bytes (a session's largest field, some 900 bytes with
// its token), and neither changes them.
func TestOpenKeepsTheTaskItIsGiven(t *testing.T) {
	l, _, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release() }()
	for _, tc := range []struct {
		name string
		do   func(id string, task []byte) error
	}{
		{"open", l.Open},
		{"adopt", func(id string, task []byte) error { return l.Adopt(id, task, 7) }},
		{"set", func(id string, task []byte) error {
			if err := l.Open(id, nil); err != nil {
				return err
			}
			return l.SetTask(id, task)
		}},
	} {
		task := []byte(`{"capability":"analyze"}`)
		must(t, tc.do(tc.name, task))
		if got := l.sessions[tc.name].Task; len(got) == 0 || &got[0] != &task[0] {
			t.Errorf("%s: the log holds a copy of the task", tc.name)
		}
	}
}

// TestConfirmingTheHeadLeavesTheRestInPlace: a confirm drops the head of
// the pending messages without moving the rest (each confirm costs what
// it confirms, not the window behind it) and lets go of the bodies it
// dropped.
func TestConfirmingTheHeadLeavesTheRestInPlace(t *testing.T) {
	var s Session
	for i := int64(1); i <= 1000; i++ {
		s.apply(msg(i, ""))
	}
	second := &s.Pending[1]
	head := s.Pending[:1]
	s.confirm(1)
	if len(s.Pending) != 999 || s.Pending[0].Index != 2 {
		t.Fatalf("pending after confirming 1: %d messages from %d; want 999 from 2", len(s.Pending), s.Pending[0].Index)
	}
	if &s.Pending[0] != second {
		t.Errorf("confirming one message moved the 999 behind it")
	}
	if head[0].Body != nil {
		t.Errorf("the confirmed message's body is still held")
	}
}

// BenchmarkConfirmWindow is a steady window of 1,000 unconfirmed
// messages: each op appends one and confirms the oldest.
func BenchmarkConfirmWindow(b *testing.B) {
	var s Session
	for i := int64(1); i <= 1000; i++ {
		s.apply(msg(i, ""))
	}
	m := msg(0, "")
	b.ResetTimer()
	for i := range int64(b.N) {
		m.Index, m.Seq = 1001+i, 1001+i
		s.apply(m)
		s.confirm(1 + i)
	}
}
