// Package wal is the callee sidecar's write-ahead log of its sessions: for
// each session it runs, the harness task it handed over, every message it
// published that the broker has not confirmed yet (the encoded envelope,
// in publish order), the highest event sequence it assigned, the session's
// L2 state after the last state_changed, and the idempotency keys the
// harness sent with its events. A session this pod took over from another
// owner is opened with the last sequence used before it (Adopt), and what
// the log held of an earlier ownership is dropped.
//
// A record is written before its message is published, the records of one
// publish (a message, or every event of one harness request) in one
// write(2) call.
// A sidecar that restarts in the same pod (a crash, an OOM kill, a SIGKILL)
// reads the log back and so continues every session it owned with the next
// sequence number, republishes what may not have reached the broker (the
// caller deduplicates by sequence), and answers a harness that retries an
// event with the sequence it already got.
//
// Why no fsync: the log lives in the pod's emptyDir, which outlives a
// container restart but not the pod. A process crash leaves every write(2)
// that returned in the page cache, where the restarted process reads it;
// a machine crash takes the pod (and its emptyDir) away, and the session
// is then handed over from the HCPSession and its checkpoint instead (see
// docs/reliability.md). An fsync would cost a disk flush per event and
// protect nothing more.
//
// Records are framed as [length uint32][crc32c uint32][payload]; a torn
// last record (a crash in the middle of a write) fails its checksum and is
// dropped: its write had not returned, so nothing was published on its
// strength. The log is compacted (rewritten with the live state, then
// renamed over) when it grows past a threshold.
package wal

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// FileName is the log's name inside the state directory.
const FileName = "callee-sessions.wal"

// DefaultCompactAt is the size past which the log is compacted.
const DefaultCompactAt = 16 << 20

// MaxKeys bounds the idempotency keys remembered per session (oldest go
// first).
const MaxKeys = 4096

// Message is one published message of a session.
type Message struct {
	// Index orders the session's messages (1, 2, ...).
	Index int64
	// Seq is the event sequence (0 for task results).
	Seq int64
	// Key is the harness's idempotency key ("" for none).
	Key string
	// RoutingKey the message was published with.
	RoutingKey string
	// State is the session's L2 state after this message.
	State string
	// Body is the encoded envelope.
	Body []byte
}

// Session is what the log knows of one open session.
type Session struct {
	ID string
	// Task is the harness task the session was started with (JSON).
	Task []byte
	// LastSeq is the highest event sequence assigned (for a session
	// taken over, at first the last one used before).
	LastSeq int64
	// LastIndex is the index of the last message.
	LastIndex int64
	// Confirmed: every message with Index <= Confirmed was confirmed.
	Confirmed int64
	// State is the L2 state after the last message ("" before any).
	State string
	// Pending are the messages not known to be confirmed, in order.
	Pending []Message
	// Keys maps idempotency keys to their sequence.
	Keys Keys
	// written is the last Confirmed the file has (MarkConfirmed).
	written int64
}

// Keys remembers the last MaxKeys idempotency keys and their sequences.
type Keys struct {
	m     map[string]int64
	order []string
}

// Get returns the sequence a key was given.
func (k *Keys) Get(key string) (int64, bool) {
	seq, ok := k.m[key]
	return seq, ok
}

// Len is the number of keys remembered.
func (k *Keys) Len() int { return len(k.m) }

// Put remembers a key, forgetting the oldest beyond MaxKeys.
func (k *Keys) Put(key string, seq int64) {
	if k.m == nil {
		k.m = map[string]int64{}
	}
	if _, ok := k.m[key]; !ok {
		k.order = append(k.order, key)
	}
	k.m[key] = seq
	if len(k.order) > MaxKeys {
		delete(k.m, k.order[0])
		k.order = k.order[1:]
	}
}

func (k Keys) clone() Keys {
	c := Keys{m: make(map[string]int64, len(k.m)), order: slices.Clone(k.order)}
	for key, v := range k.m {
		c.m[key] = v
	}
	return c
}

func (s *Session) clone() *Session {
	c := *s
	c.Task = slices.Clone(s.Task)
	c.Pending = slices.Clone(s.Pending)
	c.Keys = s.Keys.clone()
	return &c
}

func (s *Session) apply(m Message) {
	s.LastIndex = max(s.LastIndex, m.Index)
	s.LastSeq = max(s.LastSeq, m.Seq)
	if m.State != "" {
		s.State = m.State
	}
	if m.Index > s.Confirmed {
		s.Pending = append(s.Pending, m)
	}
	if m.Key != "" {
		s.Keys.Put(m.Key, m.Seq)
	}
}

func (s *Session) confirm(index int64) {
	if index <= s.Confirmed {
		return
	}
	s.Confirmed = index
	i := 0
	for i < len(s.Pending) && s.Pending[i].Index <= index {
		i++
	}
	// Reslice, not delete: the rest stays in place (a confirm costs what it
	// confirms, not the window behind it); append moves the live part to a
	// new array once the old one is used up.
	clear(s.Pending[:i])
	s.Pending = s.Pending[i:]
}

// Record kinds.
const (
	kindOpen    byte = 'O'
	kindMessage byte = 'M'
	kindConfirm byte = 'C'
	kindClose   byte = 'X'
)

// Log is the write-ahead log. The zero directory keeps nothing (tests and
// sidecars without a state directory): every method succeeds and Open
// returns no sessions.
type Log struct {
	path      string
	compactAt int64

	mu       sync.Mutex
	f        *os.File
	size     int64
	sessions map[string]*Session
	buf      []byte
	// messageWrites counts the writes of Append (see MessageWrites).
	messageWrites int64
}

// Open opens (or creates) the log in dir and returns the sessions it holds.
func Open(dir string) (*Log, map[string]*Session, error) {
	l := &Log{compactAt: DefaultCompactAt, sessions: map[string]*Session{}}
	if dir == "" {
		return l, map[string]*Session{}, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("wal: %w", err)
	}
	l.path = filepath.Join(dir, FileName)
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("wal: %w", err)
	}
	valid := l.replay(f)
	// Drop a torn tail so new records follow the last good one.
	if err := f.Truncate(valid); err != nil {
		_ = f.Close()
		return nil, nil, fmt.Errorf("wal: %w", err)
	}
	if _, err := f.Seek(valid, io.SeekStart); err != nil {
		_ = f.Close()
		return nil, nil, fmt.Errorf("wal: %w", err)
	}
	l.f, l.size = f, valid
	out := make(map[string]*Session, len(l.sessions))
	for id, s := range l.sessions {
		out[id] = s.clone()
	}
	return l, out, nil
}

// SetCompactAt overrides DefaultCompactAt (tests).
func (l *Log) SetCompactAt(n int64) { l.compactAt = n }

// Open records a new session and the task it runs. The log keeps task,
// not a copy (the session running it holds the same bytes): neither
// changes it afterwards.
func (l *Log) Open(id string, task []byte) error { return l.Adopt(id, task, 0) }

// Adopt records a session this pod takes over (from another replica, or
// from an earlier ownership of its own), the task it runs (kept, as by
// Open) and the last event sequence used before it: its first event here
// is lastSeq+1. Whatever the log held for the session is replaced:
// messages logged under an earlier ownership belong to an older owner
// epoch and are never republished under the new one.
func (l *Log) Adopt(id string, task []byte, lastSeq int64) error {
	return l.write(func(b []byte) []byte { return appendOpen(b, id, task, lastSeq) }, func() {
		l.sessions[id] = &Session{ID: id, Task: task, LastSeq: lastSeq}
	})
}

// SetTask records the task of a session the log holds without one (a log
// of an earlier release, which recorded the task of the sessions it
// started only), keeping everything else it knows of the session; task is
// kept, as by Open.
func (l *Log) SetTask(id string, task []byte) error {
	return l.write(func(b []byte) []byte {
		s := l.sessions[id]
		return appendSnapshot(appendOpen(b, id, s.Task, s.LastSeq), id, s)
	}, func() {
		l.session(id).Task = task
	})
}

// Append records messages of a session about to be published, all of them
// in one write: a caller with several messages to publish passes them
// together.
func (l *Log) Append(id string, ms ...Message) error {
	return l.write(func(b []byte) []byte {
		l.messageWrites++
		for _, m := range ms {
			b = appendMessage(b, id, m)
		}
		return b
	}, func() {
		s := l.session(id)
		for _, m := range ms {
			s.apply(m)
		}
	})
}

// MessageWrites is how many write(2) calls recorded messages (one per
// Append that reached the file, however many messages it carried).
func (l *Log) MessageWrites() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.messageWrites
}

// Confirm records that every message of the session up to index was
// confirmed by the broker.
func (l *Log) Confirm(id string, index int64) error {
	return l.write(func(b []byte) []byte { return appendConfirm(b, id, index) }, func() {
		s := l.session(id)
		s.confirm(index)
		s.written = max(s.written, index)
	})
}

// ConfirmEvery is how many messages a confirm mark written by
// MarkConfirmed may lag behind the confirms.
const ConfirmEvery = 64

// MarkConfirmed records that every message of the session up to index
// was confirmed: at once in memory (the messages no longer count as
// pending), in the file once it is ConfirmEvery or more messages behind.
// At paced rates each event is confirmed alone, and a record per confirm
// was a write(2) per event; a lagging mark only means that a sidecar
// restarting from the file republishes up to ConfirmEvery messages more,
// which the caller deduplicates by sequence.
func (l *Log) MarkConfirmed(id string, index int64) error {
	l.mu.Lock()
	s := l.sessions[id]
	if s == nil || index-s.written >= ConfirmEvery {
		l.mu.Unlock()
		return l.Confirm(id, index)
	}
	s.confirm(index)
	l.mu.Unlock()
	return nil
}

// Close forgets a session (it ended and everything was confirmed, or it was
// handed over).
func (l *Log) Close(id string) error {
	return l.write(func(b []byte) []byte { return appendClose(b, id) }, func() {
		delete(l.sessions, id)
	})
}

// Release closes the file.
func (l *Log) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

func (l *Log) session(id string) *Session {
	s, ok := l.sessions[id]
	if !ok {
		s = &Session{ID: id}
		l.sessions[id] = s
	}
	return s
}

// write frames the records encode produces, writes them in one call, then
// applies them to the in-memory mirror (kept for compaction).
func (l *Log) write(encode func([]byte) []byte, apply func()) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	apply()
	if l.path == "" {
		return nil
	}
	if l.f == nil {
		return errors.New("wal: closed")
	}
	l.buf = encode(l.buf[:0])
	n, err := l.f.Write(l.buf)
	l.size += int64(n)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	if l.size > l.compactAt {
		return l.compact()
	}
	return nil
}

// compact rewrites the log with the live state only. Called with mu.
func (l *Log) compact() error {
	tmp := l.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("wal: compact: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	var b []byte
	var size int64
	for id, s := range l.sessions {
		b = appendOpen(b[:0], id, s.Task, s.LastSeq)
		b = appendSnapshot(b, id, s)
		n, _ := w.Write(b)
		size += int64(n)
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return fmt.Errorf("wal: compact: %w", err)
	}
	if err := os.Rename(tmp, l.path); err != nil {
		_ = f.Close()
		return fmt.Errorf("wal: compact: %w", err)
	}
	_ = l.f.Close()
	l.f, l.size = f, size
	return nil
}
