package samplecaller

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// ReceiptLog appends every message the app accepts to a file outside its
// pod (a hostPath the chaos suite mounts), before the app answers the
// sidecar: what an app received survives the app's pod, so a fault that
// replaces the caller pod is judged on everything each app got, not on the
// last answer of a poll of the old app. One JSON line per message, each
// request's lines in one write(2) on an O_APPEND file, so the apps of
// several pods on one node can share the file:
//
//	{"pod":"…","at":"…","message":{…the body the sidecar POSTed…}}
type ReceiptLog struct {
	mu  sync.Mutex
	f   *os.File
	pod string
}

// OpenReceiptLog opens (creating) the file at path for appending; pod
// names this app's pod in every line.
func OpenReceiptLog(path, pod string) (*ReceiptLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o666)
	if err != nil {
		return nil, err
	}
	return &ReceiptLog{f: f, pod: pod}, nil
}

// Close closes the file.
func (l *ReceiptLog) Close() error { return l.f.Close() }

type receipt struct {
	Pod     string    `json:"pod"`
	At      time.Time `json:"at"`
	Message Message   `json:"message"`
}

// append writes ms, received at at, with one write; an error means the app
// must not acknowledge them.
func (l *ReceiptLog) append(ms []Message, at time.Time) error {
	var b []byte
	for _, m := range ms {
		line, err := json.Marshal(receipt{Pod: l.pod, At: at, Message: m})
		if err != nil {
			return err
		}
		b = append(append(b, line...), '\n')
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := l.f.Write(b)
	return err
}

// ReadReceipts replays a receipt log through a new Recorder, each message
// with the time its app received it: what every app that wrote to it got,
// checked as one stream per session (a message received again by the next
// pod's app is a duplicate). keep, when not nil, selects the sessions.
func ReadReceipts(r io.Reader, keep func(sessionID string) bool) (Snapshot, error) {
	rec := NewRecorder()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		var x receipt
		if err := json.Unmarshal(sc.Bytes(), &x); err != nil {
			return Snapshot{}, fmt.Errorf("receipt log line %d: %w", n, err)
		}
		if keep == nil || keep(x.Message.SessionID) {
			rec.RecordAt(x.Message, x.At)
		}
	}
	if err := sc.Err(); err != nil {
		return Snapshot{}, fmt.Errorf("receipt log: %w", err)
	}
	return rec.Snapshot(), nil
}

// SetReceiptLog makes the app append every message to l before it
// acknowledges it; a failed append answers 500 (the sidecar retries).
func (r *Recorder) SetReceiptLog(l *ReceiptLog) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.receipts = l
}
