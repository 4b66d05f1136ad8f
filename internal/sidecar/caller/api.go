package caller

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/sidecar/tracing"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// maxRequestBytes bounds request bodies of the local API (a task_submit
// envelope is at most envelope.MaxEnvelopeBytes).
const maxRequestBytes = envelope.MaxEnvelopeBytes + 64<<10

// TaskView is a task as the local API shows it.
type TaskView struct {
	MessageID  string    `json:"message_id"`
	CalleeID   string    `json:"callee_id"`
	Capability string    `json:"capability"`
	Status     TaskState `json:"status"`
	// SessionID is the session the callee created (status accepted) or is
	// expected to create (topology.SessionID of callee and message id).
	SessionID     string          `json:"session_id,omitempty"`
	Attempts      int             `json:"attempts"`
	SubmittedAt   *task.Timestamp `json:"submitted_at,omitempty"`
	LastAttemptAt *task.Timestamp `json:"last_attempt_at,omitempty"`
	AnsweredAt    *task.Timestamp `json:"answered_at,omitempty"`
	RiskLevel     string          `json:"risk_level,omitempty"`
	ReasonCode    string          `json:"reason_code,omitempty"`
	Message       string          `json:"message,omitempty"`
	// DeliveredToApp: the answer was POSTed to the app and acknowledged.
	DeliveredToApp bool `json:"delivered_to_app"`
	// Warning, on POST, says the broker has not confirmed the first
	// publish; the task is republished until answered.
	Warning string `json:"warning,omitempty"`
}

// SessionView is a session as the local API shows it.
type SessionView struct {
	SessionID     string `json:"session_id"`
	CalleeID      string `json:"callee_id"`
	TaskMessageID string `json:"task_message_id,omitempty"`
	Capability    string `json:"capability,omitempty"`
	// State is the L2 state as the messages delivered to the app say.
	State string `json:"state,omitempty"`
	// LastSequence is last_processed_sequence: the last event the app
	// acknowledged.
	LastSequence int64 `json:"last_sequence"`
	// Buffered counts events received out of order, waiting for a gap.
	Buffered          int             `json:"buffered"`
	RiskLevel         string          `json:"risk_level,omitempty"`
	TokenExpiresAt    *task.Timestamp `json:"token_expires_at,omitempty"`
	AcceptedDelivered bool            `json:"accepted_delivered"`
	Terminal          string          `json:"terminal,omitempty"`
	// Finished: the app has received the session's terminal message
	// (task_completed, task_failed or task_rejected).
	Finished bool `json:"finished"`
	// Closed: the app has received the session_closed event (the callee
	// sidecar publishes it right after task_completed / task_failed).
	Closed bool `json:"closed"`
	// Unverified: the session's callee was learnt from its first message,
	// no task or HCPSession named it.
	Unverified       bool            `json:"unverified,omitempty"`
	AbortRequestedAt *task.Timestamp `json:"abort_requested_at,omitempty"`
	UpdatedAt        *task.Timestamp `json:"updated_at,omitempty"`
}

// AbortRequest is the optional body of POST /hcp/v1/sessions/{id}/abort.
type AbortRequest struct {
	Reason string `json:"reason,omitempty"`
}

// AbortResponse answers an abort.
type AbortResponse struct {
	SessionID string `json:"session_id"`
	MessageID string `json:"message_id"`
}

// ErrorResponse is the body of every error answer, the same on both
// sidecars' local APIs: {"error": {"code": ..., "message": ..., "fields": [...]}}.
type ErrorResponse struct {
	Error server.Error `json:"error"`
}

// Handler serves the local app API (see docs/openapi/caller-sidecar.yaml).
func (s *Sidecar) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hcp/v1/tasks", s.handleSubmit)
	mux.HandleFunc("GET /hcp/v1/tasks", s.handleListTasks)
	mux.HandleFunc("GET /hcp/v1/tasks/{id}", s.handleGetTask)
	mux.HandleFunc("GET /hcp/v1/sessions", s.handleListSessions)
	mux.HandleFunc("GET /hcp/v1/sessions/{id}", s.handleGetSession)
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/abort", s.handleAbort)
	return mux
}

func (s *Sidecar) handleSubmit(w http.ResponseWriter, r *http.Request) {
	var req SubmitRequest
	if aerr := decodeBody(r, &req, false); aerr != nil {
		writeError(w, aerr)
		return
	}
	// The app's trace context, if any, goes with the task (a malformed
	// one is ignored).
	req.trace = tracing.FromHTTP(r.Header)
	res, aerr := s.submit(r.Context(), req)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	v := taskView(res.rec)
	status := http.StatusAccepted
	switch {
	case res.existing:
		status = http.StatusOK
	case res.publishErr != nil:
		v.Warning = "not yet confirmed by the broker (" + res.publishErr.Error() + "); the task is republished until answered"
	}
	w.Header().Set("Location", "/hcp/v1/tasks/"+v.MessageID)
	writeJSON(w, status, v)
}

func (s *Sidecar) handleListTasks(w http.ResponseWriter, _ *http.Request) {
	tasks := s.store.Tasks()
	out := make([]TaskView, 0, len(tasks))
	for _, t := range tasks {
		out = append(out, taskView(t))
	}
	writeJSON(w, http.StatusOK, map[string]any{"tasks": out})
}

func (s *Sidecar) handleGetTask(w http.ResponseWriter, r *http.Request) {
	id := strings.ToLower(r.PathValue("id"))
	t, ok := s.store.Task(id)
	if !ok {
		// Submitted by an earlier pod of this caller? Its HCPSession says.
		t, ok = s.adoptTaskByID(r.Context(), id, "")
	}
	if !ok {
		writeError(w, &apiError{status: 404, code: codeNotFound, msg: "no task " + id + " is known to this sidecar"})
		return
	}
	writeJSON(w, http.StatusOK, taskView(t))
}

func (s *Sidecar) handleListSessions(w http.ResponseWriter, _ *http.Request) {
	sessions := s.store.Sessions()
	out := make([]SessionView, 0, len(sessions))
	for _, r := range sessions {
		out = append(out, s.sessionView(r))
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessions": out})
}

func (s *Sidecar) handleGetSession(w http.ResponseWriter, r *http.Request) {
	id := strings.ToLower(r.PathValue("id"))
	rec, ok := s.store.Session(id)
	if !ok {
		writeError(w, &apiError{status: 404, code: codeNotFound, msg: "no session " + id + " is known to this sidecar"})
		return
	}
	writeJSON(w, http.StatusOK, s.sessionView(rec))
}

func (s *Sidecar) handleAbort(w http.ResponseWriter, r *http.Request) {
	id := strings.ToLower(r.PathValue("id"))
	var req AbortRequest
	if aerr := decodeBody(r, &req, true); aerr != nil {
		writeError(w, aerr)
		return
	}
	mid, aerr := s.abort(r.Context(), id, req.Reason)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	writeJSON(w, http.StatusAccepted, AbortResponse{SessionID: id, MessageID: mid})
}

func taskView(t TaskRecord) TaskView {
	return TaskView{
		MessageID:      t.MessageID,
		CalleeID:       t.CalleeID,
		Capability:     t.Capability,
		Status:         t.State,
		SessionID:      t.SessionID,
		Attempts:       t.Attempts,
		SubmittedAt:    ts(t.SubmittedAt),
		LastAttemptAt:  ts(t.LastAttemptAt),
		AnsweredAt:     ts(t.AnsweredAt),
		RiskLevel:      t.RiskLevel,
		ReasonCode:     t.ReasonCode,
		Message:        t.ReasonMessage,
		DeliveredToApp: t.Delivered,
	}
}

func (s *Sidecar) sessionView(r SessionRecord) SessionView {
	v := SessionView{
		SessionID:         r.SessionID,
		CalleeID:          r.CalleeID,
		TaskMessageID:     r.TaskMessageID,
		Capability:        r.Capability,
		State:             r.State,
		LastSequence:      r.LastSeq,
		RiskLevel:         r.RiskLevel,
		TokenExpiresAt:    ts(r.TokenExpiresAt),
		AcceptedDelivered: r.AcceptedDelivered,
		Terminal:          r.Terminal,
		Finished:          r.finished(),
		Closed:            r.Closed,
		Unverified:        r.Unverified,
		AbortRequestedAt:  ts(r.AbortRequestedAt),
		UpdatedAt:         ts(r.UpdatedAt),
	}
	s.mu.Lock()
	var tr *session.Tracker[*item]
	if w := s.streams[r.SessionID]; w != nil {
		tr = w.tracker
	}
	s.mu.Unlock()
	if tr != nil {
		v.Buffered = tr.Buffered()
	}
	return v
}

func ts(t time.Time) *task.Timestamp {
	if t.IsZero() {
		return nil
	}
	return task.TimestampPtr(t)
}

// decodeBody decodes a JSON request body, refusing unknown fields (a typo in
// a field name should fail loudly, not submit a different task).
func decodeBody(r *http.Request, v any, optional bool) *apiError {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBytes+1))
	if err != nil {
		return badRequest("reading the body: " + err.Error())
	}
	if len(body) > maxRequestBytes {
		return &apiError{status: 413, code: "too_large", msg: "request body too large"}
	}
	if optional && len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var fe *task.FieldError
		if errors.As(err, &fe) {
			return badRequest("invalid JSON body", fe)
		}
		return badRequest("invalid JSON body: " + err.Error())
	}
	if dec.More() {
		return badRequest("trailing data after the JSON body")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	body := &server.Error{Code: e.code, Message: e.msg}
	for _, f := range e.fields {
		body.Fields = append(body.Fields, server.FieldError{Field: f.Field, Message: f.Message})
	}
	if body.Message == "" {
		body.Message = http.StatusText(e.status)
	}
	server.WriteError(w, e.status, body)
}
