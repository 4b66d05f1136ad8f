package samplecallee

import (
	"encoding/json"
	"fmt"
	"time"
)

// execute runs the simulated task, reporting through the sidecar. Any
// answer other than 2xx from the sidecar (the session was aborted, timed
// out or is unknown) ends the task. Every way a run ends is logged, with
// the sidecar's answer when it is one.
func (h *Harness) execute(t Task, in Inputs, rn *run, first int) {
	id := t.SessionID
	log := h.log.WithValues("session", id)
	// One line per run of a session: kubectl hcp logs shows them, on each
	// pod a session runs on (a resumed run starts past step 1).
	log.Info("Running task", "capability", t.Capability, "fromStep", first, "steps", in.Steps)
	start := time.Now()
	if first > 1 {
		h.steps.Resumed(id, first-1, start)
	}
	sleep := func(ms int) bool { // false when aborted
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			return true
		case <-rn.abort:
			return false
		}
	}
	// stopped logs why the run stops at step before the end of the task.
	stopped := func(step int, why string, err error) {
		if err != nil {
			log.Info("Stopped: "+why, "step", step, "error", err.Error())
			return
		}
		log.Info("Stopped: "+why, "step", step)
	}
	aborted := func(step int) {
		h.mu.Lock()
		quiet, why := rn.quiet, rn.why
		h.mu.Unlock()
		if quiet != "" {
			stopped(step, quiet, nil)
			return
		}
		log.Info("Aborting task", "step", step, "reason", why)
		if in.IgnoreAbort {
			stopped(step, "aborted; not reporting the end of the cleanup (ignore_abort)", nil)
			return
		}
		time.Sleep(time.Duration(in.AbortCleanupMS) * time.Millisecond)
		if err := h.post(id, "aborted", reason{"cleanup finished"}); err != nil {
			stopped(step, "aborted; the sidecar refused the end of the cleanup", err)
			return
		}
		stopped(step, "aborted; cleanup finished and reported", nil)
	}
	for step := first; step <= in.Steps; step++ {
		stepStart := time.Now()
		done := sleep(in.StepMS)
		h.steps.Step(id, step, stepStart, time.Now())
		if !done {
			aborted(step)
			return
		}
		pct := float64(step) * 100 / float64(in.Steps)
		if err := h.post(id, "events", event{"progress", progress{Stage: fmt.Sprintf("step %d/%d", step, in.Steps), Percent: pct, Message: "working"}, fmt.Sprintf("step-%d", step)}); err != nil {
			stopped(step, "the sidecar refused an event", err)
			return
		}
		h.mu.Lock()
		rn.lastDone = step
		h.mu.Unlock()
		if in.LogEvery > 0 && step%in.LogEvery == 0 {
			if err := h.post(id, "events", event{"log", logData{Level: "info", Message: fmt.Sprintf("step %d done", step)}, fmt.Sprintf("log-%d", step)}); err != nil {
				stopped(step, "the sidecar refused a log event", err)
				return
			}
		}
		if in.CheckpointEvery > 0 && step%in.CheckpointEvery == 0 {
			state, _ := json.Marshal(checkpointState{Step: step})
			if err := h.postUntil(id, "checkpoint", map[string]any{
				"checkpoint_id": fmt.Sprintf("ckpt-%03d", step), "description": fmt.Sprintf("after step %d", step), "resumable": true, "state": state,
			}, rn.abort); err != nil {
				stopped(step, "the sidecar refused a checkpoint", err)
				return
			}
		}
		if in.FailAt == step {
			if err := h.postUntil(id, "fail", failure{Code: "simulated_failure", Message: fmt.Sprintf("failed at step %d as asked", step)}, rn.abort); err != nil {
				stopped(step, "failed as asked (fail_at); the sidecar refused the failure", err)
				return
			}
			stopped(step, "failed as asked (fail_at)", nil)
			return
		}
		if in.PauseAt == step {
			if err := h.post(id, "pause", reason{"pause_at"}); err != nil {
				stopped(step, "the sidecar refused the pause", err)
				return
			}
			if !sleep(in.PauseMS) {
				aborted(step)
				return
			}
			if err := h.post(id, "resume", reason{"pause over"}); err != nil {
				stopped(step, "the sidecar refused the resume", err)
				return
			}
		}
	}
	result := in.Result
	if len(result) == 0 {
		result, _ = json.Marshal(map[string]any{"steps": in.Steps, "capability": t.Capability})
	}
	if err := h.postUntil(id, "complete", map[string]any{
		"result":  result,
		"summary": map[string]any{"duration": fmt.Sprintf("PT%.3fS", time.Since(start).Seconds())},
	}, rn.abort); err != nil {
		stopped(in.Steps, "the sidecar refused the completion", err)
		return
	}
	log.Info("Completed task", "steps", in.Steps)
}
