package samplecallee

import (
	"encoding/json"
	"os"
	"sync"
	"time"
)

// StepLog appends a record of every step the harness executes, and of
// every resumption, to a file outside its pod (a hostPath the chaos suite
// mounts), one JSON line each: the harness's own account of what ran
// where, which test/checker compares with the wire and the app. Lines are
// written with one write(2) each on an O_APPEND file, so the harnesses of
// several pods on one node can share the file.
//
//	{"kind":"step","session":"…","step":3,"pod":"…","start":"…","end":"…"}
//	{"kind":"resume","session":"…","after_step":2,"pod":"…","at":"…"}
type StepLog struct {
	mu  sync.Mutex
	f   *os.File
	pod string
}

// OpenStepLog opens (creating) the file at path for appending; pod names
// this harness's pod in every record.
func OpenStepLog(path, pod string) (*StepLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o666)
	if err != nil {
		return nil, err
	}
	return &StepLog{f: f, pod: pod}, nil
}

type stepRecord struct {
	Kind      string     `json:"kind"`
	Session   string     `json:"session"`
	Step      int        `json:"step,omitempty"`
	AfterStep *int       `json:"after_step,omitempty"`
	Pod       string     `json:"pod"`
	Start     *time.Time `json:"start,omitempty"`
	End       *time.Time `json:"end,omitempty"`
	At        *time.Time `json:"at,omitempty"`
}

// Step records that step of session ran from start to end on this pod
// (also a step cut short by an abort or a stop: it ran).
func (l *StepLog) Step(session string, step int, start, end time.Time) {
	if l == nil {
		return
	}
	l.write(stepRecord{Kind: "step", Session: session, Step: step, Pod: l.pod, Start: &start, End: &end})
}

// Resumed records that this pod resumed session after step afterStep.
func (l *StepLog) Resumed(session string, afterStep int, at time.Time) {
	if l == nil {
		return
	}
	l.write(stepRecord{Kind: "resume", Session: session, AfterStep: &afterStep, Pod: l.pod, At: &at})
}

func (l *StepLog) write(r stepRecord) {
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.f.Write(append(b, '\n'))
}
