// Package samplecallee is the sample callee harness: a program that
// executes HCP tasks using nothing but the hcp-sidecar's local HTTP API
// (docs/harness-api.md), as a harness in any language would. It simulates a
// task as a number of steps and can be driven down every path of the
// session lifecycle through the task's inputs:
//
//	{
//	  "steps": 5,             number of steps (default 3)
//	  "step_ms": 100,         duration of one step in milliseconds (default 50)
//	  "fail_at": 0,           step at which the task fails (task_failed); 0: never
//	  "checkpoint_every": 0,  emit a checkpoint every N steps; 0: never
//	  "pause_at": 0,          step after which the task pauses; 0: never
//	  "pause_ms": 100,        how long it stays paused (default 100)
//	  "abort_cleanup_ms": 0,  time spent cleaning up after an abort
//	  "ignore_abort": false,  never report /aborted (the sidecar's abort timeout ends the session)
//	  "log_every": 0,         emit a log event every N steps; 0: never
//	  "result": {...}         returned as task_completed.result (default a summary)
//	}
//
// Tasks are idempotent by session id: a repeated POST /hcp/v1/tasks for a
// session the harness already runs is answered 200 without starting it
// again. GET /hcp/v1/tasks lists the running tasks, so the sidecar notices
// sessions lost in a harness restart.
//
// Durability: with checkpoint_every set, each checkpoint carries the state
// {"step": N}; a task handed over with "resume" (another replica ran it,
// or this harness restarted) continues after that step. POST
// /hcp/v1/sessions/{id}/drain (the sidecar's hand-over at a drain) stops
// the task after the step in progress and answers with a checkpoint of the
// last step reported. Every event carries an idempotency key derived from
// its step, and calls are retried while the sidecar is unreachable or
// answers 503 (a sidecar restart, a lapsed Lease), so a retry never
// duplicates an event; complete, fail and checkpoint are retried without a
// deadline (the sidecar records an outcome before it publishes it, and
// answers 503 fenced while it cannot). A stop request with reason
// ownership_lost (the session moved to another replica) ends the task at
// once, reporting nothing.
//
// Its log says why each run of a task ended (completed, failed as asked,
// aborted, handed over, moved away, or the sidecar's refusal of a call,
// with its answer), and when a call to the sidecar is being retried.
package samplecallee

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// Inputs are the task inputs the sample harness understands.
type Inputs struct {
	Steps           int             `json:"steps"`
	StepMS          int             `json:"step_ms"`
	FailAt          int             `json:"fail_at"`
	CheckpointEvery int             `json:"checkpoint_every"`
	PauseAt         int             `json:"pause_at"`
	PauseMS         int             `json:"pause_ms"`
	AbortCleanupMS  int             `json:"abort_cleanup_ms"`
	IgnoreAbort     bool            `json:"ignore_abort"`
	LogEvery        int             `json:"log_every"`
	Result          json.RawMessage `json:"result,omitempty"`
}

// Task is the part of the sidecar's POST /hcp/v1/tasks body the harness
// reads.
type Task struct {
	SessionID  string          `json:"session_id"`
	Capability string          `json:"capability"`
	Intent     string          `json:"intent"`
	Inputs     json.RawMessage `json:"inputs"`
	Resume     *Resume         `json:"resume,omitempty"`
}

// Resume is the checkpoint a handed-over task continues from.
type Resume struct {
	CheckpointID string `json:"checkpoint_id"`
	State        []byte `json:"state"`
	Sequence     int64  `json:"sequence"`
	Reason       string `json:"reason"`
}

// checkpointState is what the sample harness checkpoints.
type checkpointState struct {
	Step int `json:"step"`
}

// Harness is the sample callee harness. Create it with New and serve
// Handler on the harness port.
type Harness struct {
	sidecar string
	http    *http.Client
	log     logr.Logger

	// steps, when set, records every step executed (SetStepLog).
	steps *StepLog

	mu       sync.Mutex
	sessions map[string]*run
	started  int            // tasks started, for tests
	starts   map[string]int // starts per session (resumes count)
	stops    map[string][]string
}

type run struct {
	abort chan struct{}
	once  sync.Once
	done  chan struct{}
	// quiet says why the task stops without reporting anything to the
	// sidecar (Crash, a drain, ownership_lost); "" when it reports.
	quiet string
	// why is the reason of the stop request that aborted it.
	why string
	// lastDone is the last step whose progress event the sidecar took.
	lastDone int
}

// New returns a harness that reports to the sidecar at sidecarURL (for
// example http://127.0.0.1:9090).
func New(sidecarURL string, log logr.Logger) *Harness {
	return &Harness{
		sidecar:  strings.TrimRight(sidecarURL, "/"),
		http:     &http.Client{Timeout: 30 * time.Second},
		log:      log,
		sessions: map[string]*run{},
		starts:   map[string]int{},
		stops:    map[string][]string{},
	}
}

// SetStepLog makes the harness record its steps and resumptions in l.
func (h *Harness) SetStepLog(l *StepLog) { h.steps = l }

// Started returns how many tasks the harness has started (a repeated POST
// of a running session does not count).
func (h *Harness) Started() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.started
}

// Handler serves the harness side of the local API.
func (h *Harness) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hcp/v1/tasks", h.handleTask)
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/abort", h.handleAbort)
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/drain", h.handleDrain)
	mux.HandleFunc("GET /hcp/v1/tasks", h.handleList)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, status{"ok"}) })
	return mux
}

func (h *Harness) handleTask(w http.ResponseWriter, r *http.Request) {
	var t Task
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&t); err != nil || t.SessionID == "" {
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("want a task with a session_id: %v", err))
		return
	}
	in := Inputs{Steps: 3, StepMS: 50, PauseMS: 100}
	if len(t.Inputs) > 0 {
		if err := json.Unmarshal(t.Inputs, &in); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_inputs", err.Error())
			return
		}
	}
	first := 1
	if t.Resume != nil && len(t.Resume.State) > 0 {
		var cs checkpointState
		if err := json.Unmarshal(t.Resume.State, &cs); err != nil {
			writeError(w, http.StatusBadRequest, "bad_checkpoint", err.Error())
			return
		}
		first = cs.Step + 1
	}
	h.mu.Lock()
	if old, ok := h.sessions[t.SessionID]; ok {
		select {
		case <-old.done:
			if t.Resume == nil {
				h.mu.Unlock()
				writeJSON(w, http.StatusOK, status{"already ran"})
				return
			}
		default:
			h.mu.Unlock()
			writeJSON(w, http.StatusOK, status{"already running"})
			return
		}
	}
	rn := &run{abort: make(chan struct{}), done: make(chan struct{}), lastDone: first - 1}
	h.sessions[t.SessionID] = rn
	h.started++
	h.starts[t.SessionID]++
	h.mu.Unlock()
	go func() {
		defer close(rn.done)
		h.execute(t, in, rn, first)
	}()
	writeJSON(w, http.StatusAccepted, status{"started"})
}

// handleList answers GET /hcp/v1/tasks with the tasks still running,
// which lets the sidecar notice sessions a restarted harness lost.
func (h *Harness) handleList(w http.ResponseWriter, _ *http.Request) {
	h.mu.Lock()
	out := []map[string]string{}
	for id, rn := range h.sessions {
		select {
		case <-rn.done:
		default:
			out = append(out, map[string]string{"session_id": id})
		}
	}
	h.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"tasks": out})
}

// Crash simulates a harness restart: every task stops without a word to
// the sidecar, and the harness forgets them.
func (h *Harness) Crash() {
	h.mu.Lock()
	for _, rn := range h.sessions {
		rn.quiet = "the harness crashed (simulated): its tasks are lost"
		rn.once.Do(func() { close(rn.abort) })
	}
	h.sessions = map[string]*run{}
	h.mu.Unlock()
}

// handleDrain stops a task for a hand-over: after the step in progress,
// without a word to the sidecar, answering with a checkpoint of the last
// step the sidecar took.
func (h *Harness) handleDrain(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	h.mu.Lock()
	rn := h.sessions[id]
	if rn != nil {
		rn.quiet = "handed over at a drain: the sidecar passes the checkpoint of the last step on"
	}
	h.mu.Unlock()
	if rn == nil {
		writeError(w, http.StatusNotFound, "not_found", "no such session")
		return
	}
	rn.once.Do(func() { close(rn.abort) })
	<-rn.done
	h.mu.Lock()
	step := rn.lastDone
	h.mu.Unlock()
	state, _ := json.Marshal(checkpointState{Step: step})
	writeJSON(w, http.StatusOK, map[string]any{
		"checkpoint_id": fmt.Sprintf("drain-%03d", step), "description": fmt.Sprintf("drained after step %d", step), "state": state,
	})
}

// Stops returns the reasons of the stop requests (POST .../abort) the
// harness got for a session.
func (h *Harness) Stops(id string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.stops[id]...)
}

// Starts returns how many times the harness started (or resumed) a
// session, and whether it runs it now.
func (h *Harness) Starts(id string) (starts int, running bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rn := h.sessions[id]
	if rn != nil {
		select {
		case <-rn.done:
		default:
			running = true
		}
	}
	return h.starts[id], running
}

// OwnershipLost is the reason of a stop request from a sidecar that lost
// the session to another replica: stop at once and report nothing (the
// new owner resumes the task).
const OwnershipLost = "ownership_lost"

func (h *Harness) handleAbort(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var body reason
	_ = json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&body)
	h.mu.Lock()
	rn := h.sessions[id]
	h.stops[id] = append(h.stops[id], body.Reason)
	if rn != nil {
		rn.why = body.Reason
		if body.Reason == OwnershipLost {
			rn.quiet = "the session moved to another replica (ownership_lost): not this harness's to report on any more"
		}
	}
	h.mu.Unlock()
	if rn == nil {
		writeError(w, http.StatusNotFound, "not_found", "no such session")
		return
	}
	rn.once.Do(func() { close(rn.abort) })
	writeJSON(w, http.StatusAccepted, status{"aborting"})
}

func writeError(w http.ResponseWriter, code int, c, msg string) {
	var e apiError
	e.Error.Code, e.Error.Message = c, msg
	writeJSON(w, code, e)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
