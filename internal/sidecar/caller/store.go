package caller

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Store is the caller sidecar's durable state: tasks and sessions. It is a
// journal of full records (one JSON line each, CRC-32C protected), appended
// with group commit (one write+fsync covers every change queued since the
// previous one, of any record, so events and sessions share the cost; a
// batch lingers for more changes, see SetCommitLinger; the Update methods
// wait for it without the linger, RecordSession returns its Ticket) and
// compacted by rewriting it atomically (temporary file, fsync, rename,
// fsync of the directory). A torn last line, from a crash in the middle of an append, is
// detected by its checksum and discarded: its write had not returned, so
// nothing was acknowledged on the strength of it.
//
// With an empty directory the Store keeps everything in memory (tests, or a
// caller that accepts redelivered duplicates after a restart).
//
// A lock file (flock) keeps two sidecars from sharing one directory.
type Store struct {
	dir string

	mu       sync.Mutex
	tasks    map[string]*TaskRecord
	sessions map[string]*SessionRecord
	// bySession indexes the tasks by the session ids that name them (see
	// TaskForSession): session id → message id.
	bySession map[string]string

	// Group commit: queue holds the lines written since the committer took
	// the last batch, keyIdx the position in queue of each record's line
	// (a record updated twice before its batch is taken is written once,
	// in its latest state), ticket the batch's completion, since when the
	// first of them waits, urgent whether the batch was hurried (see
	// linger). kick wakes the committer.
	wmu     sync.Mutex
	queue   []pendingWrite
	keyIdx  map[recordKey]int
	ticket  *Ticket
	since   time.Time
	urgent  bool
	linger  time.Duration
	kick    chan struct{}
	closed  bool
	stopped chan struct{}
	file    *os.File
	buf     []byte // the committer's write buffer
	// fsync is (*os.File).Sync of the journal (tests watch it).
	fsync   func(*os.File) error
	lock    *os.File
	size    int64
	failErr error // sticky: a failed fsync leaves the file in an unknown state
}

// OpenStore opens (creating it if needed) the state in dir and loads it.
func OpenStore(dir string) (*Store, error) {
	s := &Store{
		dir:       dir,
		tasks:     map[string]*TaskRecord{},
		sessions:  map[string]*SessionRecord{},
		bySession: map[string]string{},
		stopped:   make(chan struct{}),
		keyIdx:    map[recordKey]int{},
		linger:    DefaultCommitLinger,
		fsync:     (*os.File).Sync,
		kick:      make(chan struct{}, 1),
	}
	if dir == "" {
		close(s.stopped)
		return s, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("caller state: create %s: %w", dir, err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("caller state: %w", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = lf.Close()
		return nil, fmt.Errorf("caller state: %s is in use by another process (flock: %w); each caller sidecar needs its own state directory", dir, err)
	}
	s.lock = lf
	path := filepath.Join(dir, journalFile)
	valid, err := s.load(path)
	if err != nil {
		_ = lf.Close()
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		_ = lf.Close()
		return nil, fmt.Errorf("caller state: %w", err)
	}
	// Drop a torn tail so that appends start on a line boundary.
	if err := f.Truncate(valid); err != nil {
		_ = f.Close()
		_ = lf.Close()
		return nil, fmt.Errorf("caller state: truncate torn journal tail: %w", err)
	}
	if _, err := f.Seek(valid, io.SeekStart); err != nil {
		_ = f.Close()
		_ = lf.Close()
		return nil, fmt.Errorf("caller state: %w", err)
	}
	s.file, s.size = f, valid
	go s.committer()
	return s, nil
}

// load replays the journal and returns the length of its valid prefix.
func (s *Store) load(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("caller state: read %s: %w", path, err)
	}
	var valid int64
	r := bufio.NewReader(bytes.NewReader(data))
	for {
		raw, err := r.ReadBytes('\n')
		if err != nil { // EOF: a line without its newline is torn
			break
		}
		l, ok := parseLine(raw)
		if !ok {
			break // torn or corrupt: nothing after it was acknowledged either
		}
		valid += int64(len(raw))
		s.apply(l)
	}
	return valid, nil
}

func (s *Store) apply(l journalLine) {
	switch {
	case l.Task != nil:
		s.putTask(l.Task)
	case l.Session != nil:
		s.sessions[l.Session.SessionID] = l.Session
	case l.DeleteTask != "":
		s.removeTask(l.DeleteTask)
	case l.DeleteSession != "":
		delete(s.sessions, l.DeleteSession)
	}
}

// Close flushes pending writes and releases the directory.
func (s *Store) Close() error {
	s.wmu.Lock()
	if s.closed {
		s.wmu.Unlock()
		return nil
	}
	s.closed = true
	s.wake()
	s.wmu.Unlock()
	<-s.stopped
	var errs []error
	if s.file != nil {
		errs = append(errs, s.file.Close())
	}
	if s.lock != nil {
		errs = append(errs, s.lock.Close()) // releases the flock
	}
	return errors.Join(errs...)
}

// Task returns a copy of a task record.
func (s *Store) Task(id string) (TaskRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[id]
	if !ok {
		return TaskRecord{}, false
	}
	return *t, true
}

// TaskForSession returns a copy of the task that session sid belongs to:
// the task whose SessionID is sid (the session the callee is expected to
// create, then the one its task_accepted named), or whose legacy session
// id (topology.LegacySessionID, from a callee of an earlier version) is.
// An index lookup: a session's stream asks once as it starts, and a scan
// of every task made starting N sessions cost O(N²).
func (s *Store) TaskForSession(sid string) (TaskRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.bySession[sid]
	if !ok {
		return TaskRecord{}, false
	}
	return *s.tasks[id], true
}

// putTask stores t and indexes it by its session ids; s.mu is held.
func (s *Store) putTask(t *TaskRecord) {
	if old, ok := s.tasks[t.MessageID]; ok {
		s.unindexTask(old)
	}
	s.tasks[t.MessageID] = t
	for _, sid := range taskSessionIDs(t) {
		s.bySession[sid] = t.MessageID
	}
}

// removeTask forgets task id and its index entries; s.mu is held.
func (s *Store) removeTask(id string) {
	if old, ok := s.tasks[id]; ok {
		s.unindexTask(old)
		delete(s.tasks, id)
	}
}

func (s *Store) unindexTask(t *TaskRecord) {
	for _, sid := range taskSessionIDs(t) {
		if s.bySession[sid] == t.MessageID {
			delete(s.bySession, sid)
		}
	}
}

// taskSessionIDs are the session ids that name t.
func taskSessionIDs(t *TaskRecord) []string {
	legacy := topology.LegacySessionID(t.CalleeID, t.MessageID)
	if t.SessionID == "" || t.SessionID == legacy {
		return []string{legacy}
	}
	return []string{t.SessionID, legacy}
}

// Tasks returns copies of every task record, oldest first.
func (s *Store) Tasks() []TaskRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]TaskRecord, 0, len(s.tasks))
	for _, t := range sortedTasks(s.tasks) {
		out = append(out, *t)
	}
	return out
}

// Session returns a copy of a session record.
func (s *Store) Session(id string) (SessionRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.sessions[id]
	if !ok {
		return SessionRecord{}, false
	}
	return *r, true
}

// Sessions returns copies of every session record, by last update.
func (s *Store) Sessions() []SessionRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SessionRecord, 0, len(s.sessions))
	for _, r := range sortedSessions(s.sessions) {
		out = append(out, *r)
	}
	return out
}

// UpdateTask applies fn to the task (a zero record with MessageID id when
// absent, created only if fn returns true) and writes it durably.
func (s *Store) UpdateTask(id string, fn func(*TaskRecord) bool) (TaskRecord, error) {
	next, t := s.RecordTask(id, fn)
	return next, t.Wait()
}

// RecordTask is UpdateTask without the wait, as RecordSession is for
// sessions: visible at once, durable once the ticket is done.
func (s *Store) RecordTask(id string, fn func(*TaskRecord) bool) (TaskRecord, *Ticket) {
	s.mu.Lock()
	cur, ok := s.tasks[id]
	next := TaskRecord{MessageID: id}
	if ok {
		next = *cur
	}
	if !fn(&next) {
		s.mu.Unlock()
		return next, doneTicket(nil)
	}
	next.MessageID = id
	rec := next
	s.putTask(&rec)
	// Encode under mu: lines reach the journal in the order of the
	// in-memory changes, so the last line of a record is its latest state.
	t := s.enqueue(journalLine{Task: &rec})
	s.mu.Unlock()
	return next, t
}

// UpdateSession is UpdateTask for sessions.
func (s *Store) UpdateSession(id string, fn func(*SessionRecord) bool) (SessionRecord, error) {
	next, t := s.RecordSession(id, fn)
	return next, t.Wait()
}

// RecordSession is UpdateSession without the wait: the change is visible to
// readers of the Store at once, and durable once the returned ticket is
// done (the next group commit). A crash before that loses it, so nothing
// may be acknowledged on its strength before the ticket is done.
func (s *Store) RecordSession(id string, fn func(*SessionRecord) bool) (SessionRecord, *Ticket) {
	s.mu.Lock()
	cur, ok := s.sessions[id]
	next := SessionRecord{SessionID: id}
	if ok {
		next = *cur
	}
	if !fn(&next) {
		s.mu.Unlock()
		return next, doneTicket(nil)
	}
	next.SessionID = id
	rec := next
	s.sessions[id] = &rec
	t := s.enqueue(journalLine{Session: &rec})
	s.mu.Unlock()
	return next, t
}

// DeleteTask forgets a task.
func (s *Store) DeleteTask(id string) error {
	s.mu.Lock()
	s.removeTask(id)
	done := s.enqueue(journalLine{DeleteTask: id})
	s.mu.Unlock()
	return wait(done)
}

// DeleteSession forgets a session.
func (s *Store) DeleteSession(id string) error {
	s.mu.Lock()
	delete(s.sessions, id)
	done := s.enqueue(journalLine{DeleteSession: id})
	s.mu.Unlock()
	return wait(done)
}

// Load implements session.Store: the last processed sequence of a session.
func (s *Store) Load(sessionID string) (int64, error) {
	r, _ := s.Session(sessionID)
	return r.LastSeq, nil
}

// Save implements session.Store: it raises the session's last processed
// sequence, durably.
func (s *Store) Save(sessionID string, seq int64) error {
	_, err := s.UpdateSession(sessionID, func(r *SessionRecord) bool {
		if seq <= r.LastSeq {
			return false
		}
		r.LastSeq = seq
		return true
	})
	return err
}

func sortedTasks(m map[string]*TaskRecord) []*TaskRecord {
	out := make([]*TaskRecord, 0, len(m))
	for _, t := range m {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].SubmittedAt.Equal(out[j].SubmittedAt) {
			return out[i].SubmittedAt.Before(out[j].SubmittedAt)
		}
		return out[i].MessageID < out[j].MessageID
	})
	return out
}

func sortedSessions(m map[string]*SessionRecord) []*SessionRecord {
	out := make([]*SessionRecord, 0, len(m))
	for _, r := range m {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].UpdatedAt.Equal(out[j].UpdatedAt) {
			return out[i].UpdatedAt.Before(out[j].UpdatedAt)
		}
		return out[i].SessionID < out[j].SessionID
	})
	return out
}
