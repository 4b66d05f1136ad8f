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
package samplecallee

import (
	"bytes"
	"context"
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
}

// Harness is the sample callee harness. Create it with New and serve
// Handler on the harness port.
type Harness struct {
	sidecar string
	http    *http.Client
	log     logr.Logger

	mu       sync.Mutex
	sessions map[string]*run
	started  int // tasks started, for tests
	wg       sync.WaitGroup
}

type run struct {
	abort chan struct{}
	once  sync.Once
	done  chan struct{}
	// crashed stops the task without reporting anything (Crash).
	crashed bool
}

// New returns a harness that reports to the sidecar at sidecarURL (for
// example http://127.0.0.1:9090).
func New(sidecarURL string, log logr.Logger) *Harness {
	return &Harness{
		sidecar:  strings.TrimRight(sidecarURL, "/"),
		http:     &http.Client{Timeout: 30 * time.Second},
		log:      log,
		sessions: map[string]*run{},
	}
}

// Started returns how many tasks the harness has started (a repeated POST
// of a running session does not count).
func (h *Harness) Started() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.started
}

// Wait waits for every task to finish.
func (h *Harness) Wait() { h.wg.Wait() }

// Handler serves the harness side of the local API.
func (h *Harness) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hcp/v1/tasks", h.handleTask)
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/abort", h.handleAbort)
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
	h.mu.Lock()
	if _, ok := h.sessions[t.SessionID]; ok {
		h.mu.Unlock()
		writeJSON(w, http.StatusOK, status{"already running"})
		return
	}
	rn := &run{abort: make(chan struct{}), done: make(chan struct{})}
	h.sessions[t.SessionID] = rn
	h.started++
	h.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.wg.Done()
		defer close(rn.done)
		h.execute(t, in, rn)
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
		rn.crashed = true
		rn.once.Do(func() { close(rn.abort) })
	}
	h.sessions = map[string]*run{}
	h.mu.Unlock()
}

func (h *Harness) handleAbort(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	h.mu.Lock()
	rn := h.sessions[id]
	h.mu.Unlock()
	if rn == nil {
		writeError(w, http.StatusNotFound, "not_found", "no such session")
		return
	}
	rn.once.Do(func() { close(rn.abort) })
	writeJSON(w, http.StatusAccepted, status{"aborting"})
}

// execute runs the simulated task, reporting through the sidecar. Any
// answer other than 2xx from the sidecar (the session was aborted, timed
// out or is unknown) ends the task.
func (h *Harness) execute(t Task, in Inputs, rn *run) {
	id := t.SessionID
	log := h.log.WithValues("session", id)
	start := time.Now()
	sleep := func(ms int) bool { // false when aborted
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			return true
		case <-rn.abort:
			return false
		}
	}
	aborted := func() {
		h.mu.Lock()
		crashed := rn.crashed
		h.mu.Unlock()
		if crashed {
			return
		}
		log.Info("Aborting task")
		if in.IgnoreAbort {
			return
		}
		time.Sleep(time.Duration(in.AbortCleanupMS) * time.Millisecond)
		_ = h.post(id, "aborted", reason{"cleanup finished"})
	}
	for step := 1; step <= in.Steps; step++ {
		if !sleep(in.StepMS) {
			aborted()
			return
		}
		pct := float64(step) * 100 / float64(in.Steps)
		if err := h.post(id, "events", event{"progress", progress{Stage: fmt.Sprintf("step %d/%d", step, in.Steps), Percent: pct, Message: "working"}}); err != nil {
			log.Info("Stopped: the sidecar refused an event", "error", err.Error())
			return
		}
		if in.LogEvery > 0 && step%in.LogEvery == 0 {
			if err := h.post(id, "events", event{"log", logData{Level: "info", Message: fmt.Sprintf("step %d done", step)}}); err != nil {
				return
			}
		}
		if in.CheckpointEvery > 0 && step%in.CheckpointEvery == 0 {
			if err := h.post(id, "checkpoint", map[string]any{
				"checkpoint_id": fmt.Sprintf("ckpt-%03d", step), "description": fmt.Sprintf("after step %d", step), "resumable": true,
			}); err != nil {
				return
			}
		}
		if in.FailAt == step {
			_ = h.post(id, "fail", failure{Code: "simulated_failure", Message: fmt.Sprintf("failed at step %d as asked", step)})
			return
		}
		if in.PauseAt == step {
			if err := h.post(id, "pause", reason{"pause_at"}); err != nil {
				return
			}
			if !sleep(in.PauseMS) {
				aborted()
				return
			}
			if err := h.post(id, "resume", reason{"pause over"}); err != nil {
				return
			}
		}
	}
	result := in.Result
	if len(result) == 0 {
		result, _ = json.Marshal(map[string]any{"steps": in.Steps, "capability": t.Capability})
	}
	if err := h.post(id, "complete", map[string]any{
		"result":  result,
		"summary": map[string]any{"duration": fmt.Sprintf("PT%.3fS", time.Since(start).Seconds())},
	}); err != nil {
		log.Info("Completion refused", "error", err.Error())
	}
}

func (h *Harness) post(id, action string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.sidecar+"/hcp/v1/sessions/"+id+"/"+action, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.http.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s: %s", action, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// Bodies of the local API (see docs/openapi/callee-sidecar.yaml).
type (
	status struct {
		Status string `json:"status"`
	}
	reason struct {
		Reason string `json:"reason"`
	}
	event struct {
		EventType string `json:"event_type"`
		Data      any    `json:"data"`
	}
	progress struct {
		Stage   string  `json:"stage"`
		Percent float64 `json:"percent"`
		Message string  `json:"message"`
	}
	logData struct {
		Level   string `json:"level"`
		Message string `json:"message"`
	}
	failure struct {
		Code        string `json:"code"`
		Message     string `json:"message"`
		Recoverable bool   `json:"recoverable"`
	}
	apiError struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
)

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
