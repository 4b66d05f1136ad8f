package caller

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
)

// journalLine is one line of the journal: a full record (last one wins) or
// a deletion.
type journalLine struct {
	Task          *TaskRecord    `json:"task,omitempty"`
	Session       *SessionRecord `json:"session,omitempty"`
	DeleteTask    string         `json:"delete_task,omitempty"`
	DeleteSession string         `json:"delete_session,omitempty"`
}

// Store file names inside the state directory.
const (
	journalFile = "caller-state.journal"
	lockFile    = "caller-state.lock"
)

// compactThreshold is the journal size above which it is rewritten with
// only the live records.
const compactThreshold = 8 << 20

type pendingWrite struct {
	line []byte
}

// Ticket is the completion of one group commit: it is done once the
// write+fsync of the batch that holds a change (and every change queued
// with it, of any record) has returned. Callbacks registered with Then run
// in registration order, on the committer goroutine, right after that
// fsync; they must be quick and must not call the Store.
type Ticket struct {
	mu   sync.Mutex
	done bool
	err  error
	then []func(error)
	// ch is closed once the callbacks have run.
	ch chan struct{}
}

func newTicket() *Ticket { return &Ticket{ch: make(chan struct{})} }

// doneTicket is a ticket already done with err.
func doneTicket(err error) *Ticket {
	t := newTicket()
	t.finish(err)
	return t
}

// finish marks t done and runs its callbacks.
func (t *Ticket) finish(err error) {
	t.mu.Lock()
	t.done, t.err = true, err
	cbs := t.then
	t.then = nil
	t.mu.Unlock()
	for _, f := range cbs {
		f(err)
	}
	close(t.ch)
}

// Then runs f(err) once t is done: at once, on the calling goroutine, if it
// already is.
func (t *Ticket) Then(f func(error)) {
	t.mu.Lock()
	if !t.done {
		t.then = append(t.then, f)
		t.mu.Unlock()
		return
	}
	err := t.err
	t.mu.Unlock()
	f(err)
}

// Wait blocks until t is done and its callbacks have run.
func (t *Ticket) Wait() error {
	<-t.ch
	return t.err
}

// Done reports whether t is done and its callbacks have run.
func (t *Ticket) Done() bool {
	select {
	case <-t.ch:
		return true
	default:
		return false
	}
}

func wait(t *Ticket) error { return t.Wait() }

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// parseLine checks "crc32c-hex SP json LF".
func parseLine(raw []byte) (journalLine, bool) {
	var l journalLine
	raw = bytes.TrimSuffix(raw, []byte("\n"))
	if len(raw) < 10 || raw[8] != ' ' {
		return l, false
	}
	var sum uint32
	if _, err := fmt.Sscanf(string(raw[:8]), "%08x", &sum); err != nil {
		return l, false
	}
	body := raw[9:]
	if crc32.Checksum(body, crcTable) != sum {
		return l, false
	}
	if err := json.Unmarshal(body, &l); err != nil {
		return l, false
	}
	return l, true
}

func encodeLine(l journalLine) []byte {
	body, err := json.Marshal(l)
	if err != nil {
		panic(fmt.Sprintf("caller state: marshal journal line: %v", err)) // plain structs: cannot fail
	}
	out := make([]byte, 0, len(body)+10)
	out = fmt.Appendf(out, "%08x ", crc32.Checksum(body, crcTable))
	out = append(out, body...)
	return append(out, '\n')
}

// enqueue queues a line for the committer and returns the ticket of the
// batch it joins; called with s.mu held so that the journal order matches
// the order of in-memory changes. A record's line still waiting in the
// queue is replaced by its newer state (the journal is last-wins per
// record); a deletion ends that, so a record deleted and written again
// keeps its order.
func (s *Store) enqueue(l journalLine) *Ticket {
	if s.dir == "" {
		return doneTicket(nil)
	}
	line := encodeLine(l)
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.closed {
		return doneTicket(errors.New("caller state: store closed"))
	}
	if s.ticket == nil {
		s.ticket = newTicket()
	}
	var key string
	switch {
	case l.Task != nil:
		key = "t/" + l.Task.MessageID
	case l.Session != nil:
		key = "s/" + l.Session.SessionID
	case l.DeleteTask != "":
		delete(s.keyIdx, "t/"+l.DeleteTask)
	case l.DeleteSession != "":
		delete(s.keyIdx, "s/"+l.DeleteSession)
	}
	if i, ok := s.keyIdx[key]; ok && key != "" {
		s.queue[i].line = line
		return s.ticket
	}
	if key != "" {
		s.keyIdx[key] = len(s.queue)
	}
	s.queue = append(s.queue, pendingWrite{line: line})
	s.cond.Signal()
	return s.ticket
}

// committer writes queued lines in batches, one fsync per batch.
func (s *Store) committer() {
	defer close(s.stopped)
	for {
		s.wmu.Lock()
		for len(s.queue) == 0 && !s.closed {
			s.cond.Wait()
		}
		batch, ticket := s.queue, s.ticket
		s.queue, s.ticket = nil, nil
		clear(s.keyIdx)
		closed := s.closed
		s.wmu.Unlock()
		if len(batch) > 0 {
			ticket.finish(s.commit(batch))
		}
		if closed && len(batch) == 0 {
			return
		}
	}
}

// err returns the sticky write failure, if any.
func (s *Store) err() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.failErr
}

func (s *Store) fail(err error) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.failErr = err
	return err
}

func (s *Store) commit(batch []pendingWrite) error {
	if err := s.err(); err != nil {
		return err
	}
	var buf bytes.Buffer
	for _, w := range batch {
		buf.Write(w.line)
	}
	if _, err := s.file.Write(buf.Bytes()); err != nil {
		return s.fail(fmt.Errorf("caller state: append to journal: %w", err))
	}
	if err := s.file.Sync(); err != nil {
		// After a failed fsync the page cache may have dropped the data:
		// the file can no longer be trusted (the "fsyncgate" lesson).
		return s.fail(fmt.Errorf("caller state: fsync journal: %w", err))
	}
	s.size += int64(buf.Len())
	if s.size > compactThreshold {
		if err := s.compact(); err != nil {
			// The journal is intact; compaction is retried after the next
			// batch.
			return nil
		}
	}
	return nil
}

// compact rewrites the journal with the live records only. It runs on the
// committer goroutine, so no append interleaves.
func (s *Store) compact() error {
	s.mu.Lock()
	var buf bytes.Buffer
	for _, t := range sortedTasks(s.tasks) {
		buf.Write(encodeLine(journalLine{Task: t}))
	}
	for _, r := range sortedSessions(s.sessions) {
		buf.Write(encodeLine(journalLine{Session: r}))
	}
	s.mu.Unlock()
	path := filepath.Join(s.dir, journalFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(buf.Bytes()); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if err := syncDir(s.dir); err != nil {
		return err
	}
	nf, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return s.fail(fmt.Errorf("caller state: reopen compacted journal: %w", err))
	}
	_ = s.file.Close()
	s.file, s.size = nf, int64(buf.Len())
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	return d.Sync()
}
