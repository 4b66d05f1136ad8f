package caller

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TaskState is what the caller sidecar knows about one submitted task.
type TaskState string

// Task states.
const (
	// TaskPending: published (or about to be), no task_accepted or
	// task_rejected yet; republished with the same message_id until one
	// arrives or the attempts run out.
	TaskPending TaskState = "pending"
	// TaskAccepted: the callee accepted the task (its session runs).
	TaskAccepted TaskState = "accepted"
	// TaskRejected: the callee rejected the task.
	TaskRejected TaskState = "rejected"
	// TaskUnanswered: every attempt timed out without an answer. A late
	// answer still moves the task to accepted or rejected.
	TaskUnanswered TaskState = "unanswered"
	// TaskExpired: the task's expires_at or deadline passed before it was
	// answered; it is no longer republished. A late answer still counts.
	TaskExpired TaskState = "expired"
)

// answered reports whether the callee has answered.
func (s TaskState) answered() bool { return s == TaskAccepted || s == TaskRejected }

// TaskRecord is the durable record of one task_submit.
type TaskRecord struct {
	MessageID  string    `json:"message_id"`
	CalleeID   string    `json:"callee_id"`
	Capability string    `json:"capability"`
	State      TaskState `json:"state"`
	// SessionID is the session the callee is expected to create
	// (topology.SessionID) until task_accepted names the real one.
	SessionID string `json:"session_id,omitempty"`
	// Envelope is the encoded task_submit, kept while the task is pending
	// so that a restarted sidecar republishes the identical message.
	Envelope      json.RawMessage `json:"envelope,omitempty"`
	Attempts      int             `json:"attempts"`
	SubmittedAt   time.Time       `json:"submitted_at"`
	LastAttemptAt time.Time       `json:"last_attempt_at,omitzero"`
	AnsweredAt    time.Time       `json:"answered_at,omitzero"`
	// ExpiresAt is the earlier of the task's expires_at and deadline.
	ExpiresAt     time.Time `json:"expires_at,omitzero"`
	RiskLevel     string    `json:"risk_level,omitempty"`
	ReasonCode    string    `json:"reason_code,omitempty"`
	ReasonMessage string    `json:"reason_message,omitempty"`
	// Delivered is set once the answer was handed to the app (2xx).
	Delivered bool `json:"delivered,omitempty"`
	// Adopted: the task was submitted by an earlier pod of this caller
	// (whose state directory is gone) and learnt from its HCPSession. It has
	// no Envelope and is never republished.
	Adopted bool `json:"adopted,omitempty"`
	// Traceparent and Tracestate are the W3C trace context the task_submit
	// carries in its AMQP headers (every republish the same), kept with the
	// Envelope.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
}

// SessionRecord is the durable per-session state of the caller sidecar.
// LastSeq is L2's last_processed_sequence: the highest sequence the app
// acknowledged with a 2xx. It is the deduplication source after a restart.
type SessionRecord struct {
	SessionID     string `json:"session_id"`
	CalleeID      string `json:"callee_id"`
	TaskMessageID string `json:"task_message_id,omitempty"`
	Capability    string `json:"capability,omitempty"`
	// LastSeq is last_processed_sequence.
	LastSeq int64 `json:"last_seq"`
	// State is the L2 state as the event stream delivered to the app says.
	State          string    `json:"state,omitempty"`
	RiskLevel      string    `json:"risk_level,omitempty"`
	Token          string    `json:"token,omitempty"`
	TokenExpiresAt time.Time `json:"token_expires_at,omitzero"`
	// AcceptedDelivered: task_accepted was handed to the app.
	AcceptedDelivered bool `json:"accepted_delivered,omitempty"`
	// Terminal is task_completed or task_failed once delivered to the app.
	Terminal string `json:"terminal,omitempty"`
	// Closed: the session_closed event was delivered to the app.
	Closed bool `json:"closed,omitempty"`
	// Unverified: the session's callee was bound on first use (no task,
	// task_accepted or HCPSession named it).
	Unverified bool `json:"unverified,omitempty"`
	// AbortRequestedAt is when the app last asked to abort the session.
	AbortRequestedAt time.Time `json:"abort_requested_at,omitzero"`
	UpdatedAt        time.Time `json:"updated_at"`
}

// finished reports whether the app has received the session's end.
func (r *SessionRecord) finished() bool { return r.Terminal != "" }

// over reports whether the session has ended: a terminal answer or result,
// or session_closed (an aborted session has no result).
func (r *SessionRecord) over() bool { return r.finished() || r.Closed }

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

// Store is the caller sidecar's durable state: tasks and sessions. It is a
// journal of full records (one JSON line each, CRC-32C protected), appended
// with group commit (one write+fsync covers every change queued since the
// previous one, of any record, so events and sessions share the cost; the
// Update methods wait for it, RecordSession returns its Ticket) and
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
	// in its latest state), ticket the batch's completion.
	wmu     sync.Mutex
	cond    *sync.Cond
	queue   []pendingWrite
	keyIdx  map[string]int
	ticket  *Ticket
	closed  bool
	stopped chan struct{}
	file    *os.File
	lock    *os.File
	size    int64
	failErr error // sticky: a failed fsync leaves the file in an unknown state
}

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

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// OpenStore opens (creating it if needed) the state in dir and loads it.
func OpenStore(dir string) (*Store, error) {
	s := &Store{
		dir:       dir,
		tasks:     map[string]*TaskRecord{},
		sessions:  map[string]*SessionRecord{},
		bySession: map[string]string{},
		stopped:   make(chan struct{}),
		keyIdx:    map[string]int{},
	}
	s.cond = sync.NewCond(&s.wmu)
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

// Close flushes pending writes and releases the directory.
func (s *Store) Close() error {
	s.wmu.Lock()
	if s.closed {
		s.wmu.Unlock()
		return nil
	}
	s.closed = true
	s.cond.Signal()
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
	s.mu.Lock()
	cur, ok := s.tasks[id]
	next := TaskRecord{MessageID: id}
	if ok {
		next = *cur
	}
	if !fn(&next) {
		s.mu.Unlock()
		return next, nil
	}
	next.MessageID = id
	rec := next
	s.putTask(&rec)
	// Encode under mu: lines reach the journal in the order of the
	// in-memory changes, so the last line of a record is its latest state.
	done := s.enqueue(journalLine{Task: &rec})
	s.mu.Unlock()
	return next, wait(done)
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

func wait(t *Ticket) error { return t.Wait() }

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
