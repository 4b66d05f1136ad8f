package callee

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// harnessTask is the body of POST {harness}/hcp/v1/tasks.
type harnessTask struct {
	SessionID          string           `json:"session_id"`
	TaskMessageID      string           `json:"task_message_id"`
	SessionToken       string           `json:"session_token"`
	CallerID           string           `json:"caller_id"`
	CalleeID           string           `json:"callee_id"`
	Capability         string           `json:"capability"`
	Intent             string           `json:"intent"`
	Inputs             json.RawMessage  `json:"inputs"`
	Constraints        task.Constraints `json:"constraints"`
	OutputFormat       json.RawMessage  `json:"output_format,omitempty"`
	Metadata           json.RawMessage  `json:"metadata,omitempty"`
	RiskLevel          task.RiskLevel   `json:"risk_level"`
	DataClassification task.DataClass   `json:"data_classification"`
	MaxDuration        task.Duration    `json:"max_duration"`
	ExpiresAt          task.Timestamp   `json:"expires_at"`
	SafetyEnvelope     json.RawMessage  `json:"safety_envelope,omitempty"`
	// SessionURL is where the harness reports this session's events and
	// state changes (the sidecar's API), for harnesses that do not
	// configure the sidecar's address themselves.
	SessionURL string `json:"session_url,omitempty"`
	// Resume is set when the session is handed to this harness to be
	// resumed (another replica ran it, or this harness restarted).
	Resume *resumeInfo `json:"resume,omitempty"`
}

// resumeInfo tells a harness where to resume a session.
type resumeInfo struct {
	// CheckpointID is the checkpoint to resume from.
	CheckpointID string `json:"checkpoint_id"`
	// State is the checkpoint's opaque state (base64 in JSON).
	State []byte `json:"state,omitempty"`
	// Sequence is the last event sequence when the checkpoint was taken.
	Sequence int64 `json:"sequence"`
	// Reason: harness_moved or harness_restarted.
	Reason string `json:"reason"`
}

// harnessFresh is how long a harness that answered a request counts as
// reachable without another connection.
const harnessFresh = time.Second

// harnessReachable is the gate's last check: a TCP connection to the
// harness port, unless the harness answered a request within harnessFresh.
// It asks nothing of the harness beyond listening, so any harness passes
// it, and a harness that is down (crashed, restarting, not started yet)
// gets the task rejected with harness_unavailable instead of accepted and
// then failed.
func (s *Sidecar) harnessReachable(ctx context.Context) error {
	if at := s.harnessAnswered.Load(); at != 0 && s.clk.Since(time.Unix(0, at)) < harnessFresh {
		return nil
	}
	host := s.harness.Host
	if s.harness.Port() == "" {
		if s.harness.Scheme == "https" {
			host = net.JoinHostPort(s.harness.Hostname(), "443")
		} else {
			host = net.JoinHostPort(s.harness.Hostname(), "80")
		}
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return err
	}
	return c.Close()
}

// taskBody encodes the harness task of a new session.
func (s *Sidecar) taskBody(sid, msgID, tok, callerID string, risk task.RiskLevel, startedAt, expiresAt time.Time, ts *task.TaskSubmit) ([]byte, error) {
	body := harnessTask{
		SessionID: sid, TaskMessageID: msgID, SessionToken: tok,
		CallerID: callerID, CalleeID: s.id, Capability: ts.Capability, Intent: ts.Intent,
		Inputs: ts.Inputs, Constraints: ts.Constraints, OutputFormat: ts.OutputFormat, Metadata: ts.Metadata,
		RiskLevel: risk, DataClassification: ts.Constraints.DataClassification,
		MaxDuration: task.Duration(expiresAt.Sub(startedAt)), ExpiresAt: task.NewTimestamp(expiresAt),
		SessionURL: s.sessionURL(sid),
	}
	if cl, err := s.callee(s.life); err == nil {
		for _, c := range cl.Spec.Capabilities {
			if c.Name == ts.Capability && c.SafetyEnvelope != nil {
				body.SafetyEnvelope = c.SafetyEnvelope.Raw
			}
		}
	}
	return json.Marshal(body)
}

// deliver hands the task to the harness; the session fails when the
// harness cannot take it: harness_unavailable (recoverable) after retries of
// connection errors and 5xx/429, harness_refused for another 4xx. 409 means
// the harness already has the session (a repeated hand-over): success.
func (ss *sess) deliver() {
	if err := ss.handTask(ss.task, DefaultHarnessAttempts); err != nil {
		ss.log().Info("The harness could not take the task", "error", err.msg)
		ss.terminate(err.code, err.msg, err.code == codeHarnessUnavailable)
	}
}

type handError struct{ code, msg string }

// handTask posts a task body to the harness, up to attempts times for
// transient failures (backoff 250 ms, ×4 each time, at most 5 s).
func (ss *sess) handTask(raw []byte, attempts int) *handError {
	s := ss.sc
	var lastErr string
	backoff := 250 * time.Millisecond
	for attempt := 1; attempt <= attempts; attempt++ {
		if ss.ended() {
			return nil
		}
		status, msg, err := s.callHarness(withTrace(s.life, ss.trace.ctx), "/hcp/v1/tasks", raw)
		switch {
		case err == nil && (status/100 == 2 || status == http.StatusConflict):
			ss.delivered.Store(true)
			s.countApp("ok")
			ss.log().V(1).Info("Handed the task to the harness", "status", status)
			return nil
		case err == nil && status/100 == 4 && status != http.StatusTooManyRequests:
			s.countApp("error")
			ss.log().Info("The harness refused the task", "status", status, "message", msg)
			return &handError{codeHarnessRefused, fmt.Sprintf("the harness refused the task (HTTP %d): %s", status, msg)}
		case err != nil:
			lastErr = err.Error()
		default:
			lastErr = fmt.Sprintf("HTTP %d: %s", status, msg)
		}
		s.countApp("error")
		if attempt < attempts {
			select {
			case <-s.life.Done():
				return nil
			case <-s.clk.After(backoff):
			}
			backoff = min(backoff*4, 5*time.Second)
		}
	}
	return &handError{codeHarnessUnavailable, "the harness could not take the task: " + oneLine(lastErr, 500)}
}

// harnessAbort tells the harness to stop a session (best effort; the abort
// timeout ends the session regardless).
func (s *Sidecar) harnessAbort(id, reason string) {
	raw, _ := json.Marshal(map[string]string{"session_id": id, "reason": reason})
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.life), s.t.HarnessTimeout)
	defer cancel()
	if ss := s.session(id); ss != nil {
		ctx = withTrace(ctx, ss.trace.ctx)
	}
	status, msg, err := s.callHarness(ctx, "/hcp/v1/sessions/"+id+"/abort", raw)
	switch {
	case err != nil:
		s.log.Info("Could not tell the harness to abort", "session", id, "error", err.Error())
	case status/100 != 2 && status != http.StatusNotFound:
		s.log.Info("The harness answered the abort with an error", "session", id, "status", status, "message", msg)
	}
}

func (s *Sidecar) callHarness(ctx context.Context, path string, body []byte) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.t.HarnessTimeout)
	defer cancel()
	resp, err := s.postHarness(ctx, path, body)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, oneLine(string(b), 500), nil
}

// postHarness POSTs a JSON body to the harness, with the session's trace
// context (withTrace) as traceparent and tracestate headers.
func (s *Sidecar) postHarness(ctx context.Context, path string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.harnessURL(path), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	traceOf(ctx).SetHTTP(req.Header)
	return s.harnessDo(req)
}

// harnessDo sends a request to the harness and notes whether it answered
// (harnessReachable).
func (s *Sidecar) harnessDo(req *http.Request) (*http.Response, error) {
	resp, err := s.http.Do(req)
	if err == nil {
		s.harnessAnswered.Store(s.clk.Now().UnixNano())
	} else {
		s.harnessAnswered.Store(0) // the next gate connects again
	}
	return resp, err
}

// sessionURL is the sidecar API URL of a session, when the API address is a
// concrete host:port.
func (s *Sidecar) sessionURL(id string) string {
	addr := s.cfg.APIAddr
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" || port == "0" {
		return ""
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/hcp/v1/sessions/" + id
}

func (s *Sidecar) countApp(result string) {
	if s.m != nil {
		s.m.AppDeliveries.WithLabelValues(result).Inc()
	}
}

// harnessWatchdog recovers the sessions of a harness that died while its
// sidecar lives on (see recoverHarness) (a sidecar restart and a lost pod are handled by
// recovery): a session must not stay RUNNING until its timeout with nobody
// working on it. While sessions run it calls GET {harness}/hcp/v1/tasks
// every Timeouts.HarnessCheck:
//
//   - no connection three times in a row: the harness is down; its sessions
//     are recovered;
//   - a 200 answer {"tasks": [{"session_id": ...}, ...]} (optional for
//     harnesses): a session the harness took but no longer lists, twice in a
//     row, was lost in a harness restart and is recovered;
//   - any other answer (a harness without the endpoint): reachable, nothing
//     more is known.
func (s *Sidecar) harnessWatchdog(ctx context.Context) {
	t := s.clk.NewTicker(s.t.HarnessCheck)
	defer t.Stop()
	down := 0
	missing := map[string]int{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		var watched []*sess
		for _, ss := range s.active() {
			if ss.delivered.Load() {
				watched = append(watched, ss)
			}
		}
		if len(watched) == 0 {
			down = 0
			clear(missing)
			continue
		}
		known, listed, err := s.harnessSessions(ctx)
		if err != nil {
			down++
			s.log.Info("The harness does not answer", "attempt", down, "error", err.Error())
			if down >= 3 {
				for _, ss := range watched {
					go ss.recoverHarness(fmt.Sprintf("the harness has not answered for %s: %s", 3*s.t.HarnessCheck, oneLine(err.Error(), 200)))
				}
				down = 0
			}
			continue
		}
		down = 0
		if !listed {
			continue
		}
		for _, ss := range watched {
			if known[ss.id] {
				delete(missing, ss.id)
				continue
			}
			missing[ss.id]++
			if missing[ss.id] >= 2 {
				delete(missing, ss.id)
				go ss.recoverHarness("the harness no longer runs the session (it restarted)")
			}
		}
	}
}

// harnessSessions asks the harness which sessions it runs. listed is false
// when the harness does not implement the listing.
func (s *Sidecar) harnessSessions(ctx context.Context) (known map[string]bool, listed bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.t.HarnessTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.harnessURL("/hcp/v1/tasks"), nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := s.harnessDo(req)
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, false, nil
	}
	var body struct {
		Tasks []struct {
			SessionID string `json:"session_id"`
		} `json:"tasks"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&body); err != nil || body.Tasks == nil {
		return nil, false, nil
	}
	known = map[string]bool{}
	for _, x := range body.Tasks {
		known[x.SessionID] = true
	}
	return known, true, nil
}
