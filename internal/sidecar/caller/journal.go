package caller

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"time"
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

// pendingWrite is a change waiting for its group commit. The records it
// points to are never modified (every update stores a new copy), so it is
// encoded when its batch is written: once per batch, however often the
// record changed meanwhile.
type pendingWrite struct {
	l journalLine
}

// recordKey names a record in the queue (see enqueue).
type recordKey struct {
	task bool
	id   string
}

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

func encodeLine(l journalLine) []byte { return appendLine(nil, l) }

// appendLine appends l's line to b.
// A session record's body is built by hand (appendSessionLine), anything
// else by encoding/json; the body is appended first and the checksum
// written in front of it, so nothing is copied twice.
func appendLine(b []byte, l journalLine) []byte {
	start := len(b)
	b = append(b, "00000000 "...)
	b, ok := appendSessionLine(b, l)
	if !ok {
		body, err := json.Marshal(l)
		if err != nil {
			panic(fmt.Sprintf("caller state: marshal journal line: %v", err)) // plain structs: cannot fail
		}
		b = append(b, body...)
	}
	sum := crc32.Checksum(b[start+9:], crcTable)
	const hex = "0123456789abcdef"
	for i := 7; i >= 0; i-- {
		b[start+i] = hex[sum&0xf]
		sum >>= 4
	}
	return append(b, '\n')
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
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.closed {
		return doneTicket(errors.New("caller state: store closed"))
	}
	switch {
	case s.ticket == nil:
		s.ticket = newTicket(s)
		s.since = time.Now()
		s.wake()
	case !s.urgent && time.Since(s.since) >= s.linger:
		// The batch has lingered its time: this change carries it, now,
		// while the process is awake anyway (see committer).
		s.urgent = true
		s.wake()
	}
	var key recordKey
	switch {
	case l.Task != nil:
		key = recordKey{task: true, id: l.Task.MessageID}
	case l.Session != nil:
		key = recordKey{id: l.Session.SessionID}
	case l.DeleteTask != "":
		delete(s.keyIdx, recordKey{task: true, id: l.DeleteTask})
	case l.DeleteSession != "":
		delete(s.keyIdx, recordKey{id: l.DeleteSession})
	}
	if i, ok := s.keyIdx[key]; ok && key.id != "" {
		s.queue[i].l = l
		return s.ticket
	}
	if key.id != "" {
		s.keyIdx[key] = len(s.queue)
	}
	s.queue = append(s.queue, pendingWrite{l: l})
	return s.ticket
}

// SetCommitLinger sets how long a group commit gathers changes before it
// is written (see Options.CommitLinger; OpenStore sets
// DefaultCommitLinger); d <= 0 writes each batch as soon as the previous
// one is done.
func (s *Store) SetCommitLinger(d time.Duration) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.linger = max(d, 0)
	s.wake()
}

// wake tells the committer that its batch, or the store, changed; called
// with wmu held.
func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// hurry has t's batch written without waiting out the linger, if t is
// still the batch being gathered (a batch already taken is being written).
func (s *Store) hurry(t *Ticket) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.ticket == t && !s.urgent {
		s.urgent = true
		s.wake()
	}
}

// lingerLimit is how long a batch that no later change carries lingers,
// in lingers.
const lingerLimit = 2

// committer writes queued lines in batches, one write and one fsync per
// batch. A batch is gathered for linger from its first change (so that the
// events of a steady stream share an fsync instead of paying one each);
// then the next change queued ends it (enqueue), so that the write is made
// while that change's delivery or ack has the process awake, not by a
// timer of its own waking an idle one: at 1,000 events/s such a wake-up
// cost the caller sidecar about 11 µs of CPU per event
// (TestLingerEndsWithTheNextChange). A batch no change follows is written
// at lingerLimit lingers. A batch is written at once when it is hurried
// (Ticket.Wait or Hurry) or the store closes.
func (s *Store) committer() {
	defer close(s.stopped)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		s.wmu.Lock()
		if len(s.queue) == 0 && !s.closed {
			s.wmu.Unlock()
			<-s.kick
			continue
		}
		if wait := lingerLimit*s.linger - time.Since(s.since); len(s.queue) > 0 && !s.urgent && !s.closed && wait > 0 {
			s.wmu.Unlock()
			timer.Reset(wait)
			select {
			case <-s.kick:
				timer.Stop()
			case <-timer.C:
			}
			continue
		}
		batch, ticket := s.queue, s.ticket
		s.queue, s.ticket, s.urgent = nil, nil, false
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
	buf := s.buf[:0]
	for _, w := range batch {
		buf = appendLine(buf, w.l)
	}
	if cap(buf) <= 64<<10 {
		s.buf = buf // reused by the next batch (the committer's only)
	}
	if _, err := s.file.Write(buf); err != nil {
		return s.fail(fmt.Errorf("caller state: append to journal: %w", err))
	}
	if err := s.fsync(s.file); err != nil {
		// After a failed fsync the page cache may have dropped the data:
		// the file can no longer be trusted (the "fsyncgate" lesson).
		return s.fail(fmt.Errorf("caller state: fsync journal: %w", err))
	}
	s.size += int64(len(buf))
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
