package caller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/tracing"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// SubmitRequest is the body of POST /hcp/v1/tasks: a task_submit payload
// without caller_id (the sidecar sets its own id; the callee checks it
// against the broker-validated user_id) plus an optional message_id, which
// makes the request idempotent: posting the same message_id again returns
// the task already submitted instead of submitting a second one.
type SubmitRequest struct {
	MessageID    string           `json:"message_id,omitempty"`
	CalleeID     string           `json:"callee_id"`
	Capability   string           `json:"capability"`
	Intent       string           `json:"intent"`
	Inputs       json.RawMessage  `json:"inputs,omitempty"`
	Constraints  task.Constraints `json:"constraints"`
	OutputFormat json.RawMessage  `json:"output_format,omitempty"`
	ExpiresAt    *task.Timestamp  `json:"expires_at,omitempty"`
	Metadata     json.RawMessage  `json:"metadata,omitempty"`

	// trace is the app's W3C trace context (the traceparent and tracestate
	// headers of its request).
	trace tracing.Context
}

// codeNotFound is the API error code of an unknown task or session.
const codeNotFound = "not_found"

// apiError is an error with its HTTP status and machine-readable code.
type apiError struct {
	status int
	code   string
	msg    string
	fields []*task.FieldError
}

func (e *apiError) Error() string { return e.code + ": " + e.msg }

func badRequest(msg string, fields ...*task.FieldError) *apiError {
	return &apiError{status: 400, code: "invalid_request", msg: msg, fields: fields}
}

// submitResult is the outcome of an accepted POST /hcp/v1/tasks.
type submitResult struct {
	rec TaskRecord
	// existing: the message_id was submitted before; nothing was published.
	existing bool
	// publishErr says why the broker did not confirm the publish; the task
	// is republished regardless.
	publishErr error
}

// task is the task_submit payload a request asks callerID to send,
// validated.
func (req *SubmitRequest) task(callerID string) (task.TaskSubmit, *apiError) {
	p := task.TaskSubmit{
		CallerID:     callerID,
		CalleeID:     req.CalleeID,
		Capability:   req.Capability,
		Intent:       req.Intent,
		Inputs:       req.Inputs,
		Constraints:  req.Constraints,
		OutputFormat: req.OutputFormat,
		ExpiresAt:    req.ExpiresAt,
		Metadata:     req.Metadata,
	}
	if len(p.Inputs) == 0 {
		p.Inputs = json.RawMessage("{}")
	}
	if err := p.Validate(); err != nil {
		var ve *task.ValidationError
		if errors.As(err, &ve) {
			return p, badRequest("invalid task", ve.Fields...)
		}
		return p, badRequest(err.Error())
	}
	return p, nil
}

// submit validates req, records the task durably and publishes it.
func (s *Sidecar) submit(ctx context.Context, req SubmitRequest) (submitResult, *apiError) {
	now := s.clk.Now()
	p, aerr := req.task(s.cfg.ID)
	if aerr != nil {
		return submitResult{}, aerr
	}
	if p.Expired(now) {
		return submitResult{}, badRequest("the task's expires_at or deadline has already passed")
	}
	env, err := envelope.NewAt(now, envelope.TypeTaskSubmit, "", p)
	if err != nil {
		return submitResult{}, badRequest(err.Error())
	}
	if req.MessageID != "" {
		if !envelope.IsUUIDv4(req.MessageID) {
			return submitResult{}, badRequest("message_id must be a UUID v4", &task.FieldError{Field: "message_id", Message: "not a UUID v4"})
		}
		env.MessageID = strings.ToLower(req.MessageID)
	}
	body, err := envelope.Encode(env)
	if err != nil {
		return submitResult{}, badRequest(err.Error())
	}
	if len(body) > envelope.MaxEnvelopeBytes {
		return submitResult{}, &apiError{status: 413, code: "too_large",
			msg: fmt.Sprintf("the task_submit envelope is %d bytes, more than the %d a callee accepts; reference large inputs by URI", len(body), envelope.MaxEnvelopeBytes)}
	}
	expires := time.Time{}
	for _, t := range []*task.Timestamp{p.ExpiresAt, p.Constraints.Deadline} {
		if t != nil && (expires.IsZero() || t.Before(expires)) {
			expires = t.Time
		}
	}

	// With tracing on, the submit is a span of the app's trace and the
	// task_submit carries the span's context; off, it carries the app's.
	span, trace := tracing.StartSpan("hcp.task_submit", oteltrace.SpanKindProducer, req.trace,
		attribute.String("hcp.message_id", env.MessageID), attribute.String("hcp.callee_id", p.CalleeID),
		attribute.String("hcp.capability", p.Capability), attribute.String("hcp.caller_id", s.cfg.ID))
	defer span.End()

	if _, ok := s.store.Task(env.MessageID); !ok && req.MessageID != "" {
		// The app may repeat a submit after this caller's pod moved: if the
		// callee has decided it, its HCPSession says so, and publishing it
		// again would only make the callee answer twice.
		s.adoptTaskByID(ctx, env.MessageID, p.CalleeID)
	}
	s.submitMu.Lock()
	if old, ok := s.store.Task(env.MessageID); ok {
		s.submitMu.Unlock()
		if old.CalleeID != p.CalleeID || old.Capability != p.Capability {
			return submitResult{}, &apiError{status: 409, code: "conflict",
				msg: "message_id " + env.MessageID + " was already used for another task"}
		}
		span.AddEvent("already submitted")
		return submitResult{rec: old, existing: true}, nil
	}
	if err := s.store.err(); err != nil { // the journal failed earlier: publish nothing
		s.submitMu.Unlock()
		span.Fail(err.Error())
		return submitResult{}, &apiError{status: 503, code: "state_unavailable", msg: err.Error()}
	}
	// Recorded as if published, and published while the record's group
	// commit is under way: the app is answered once both are done. A crash
	// in between leaves the app unanswered, as a crash after a publish
	// always could; its retry with the same message_id is deduplicated by
	// the callee, and an answer to a submit without a record is delivered
	// all the same (as one to a submit of an earlier pod).
	rec, stored := s.store.RecordTask(env.MessageID, func(t *TaskRecord) bool {
		*t = TaskRecord{
			MessageID:     env.MessageID,
			CalleeID:      p.CalleeID,
			Capability:    p.Capability,
			State:         TaskPending,
			SessionID:     topology.SessionID(p.CalleeID, s.cfg.ID, env.MessageID),
			Envelope:      body,
			Attempts:      1,
			SubmittedAt:   now,
			LastAttemptAt: now,
			ExpiresAt:     expires,
			Traceparent:   trace.Parent,
			Tracestate:    trace.State,
		}
		return true
	})
	s.submitMu.Unlock()
	stored.Hurry()
	perr := s.publishSubmit(ctx, rec)
	if err := stored.Wait(); err != nil {
		span.Fail(err.Error())
		return submitResult{}, &apiError{status: 503, code: "state_unavailable",
			msg: "the task could not be recorded (" + err.Error() + "); it may have been sent: retry with the same message_id"}
	}
	if perr != nil {
		span.Fail(perr.Error())
	}
	if errors.Is(perr, transport.ErrUnroutable) {
		// Nothing can receive it: no command queue is bound for that callee.
		if derr := s.store.DeleteTask(rec.MessageID); derr != nil {
			s.log.Error(derr, "Failed to forget an undeliverable task", "task", rec.MessageID)
		}
		return submitResult{}, &apiError{status: 404, code: "unknown_callee",
			msg: fmt.Sprintf("no command queue is bound for callee %q in vhost %q (is the Callee Ready?)", p.CalleeID, s.cfg.Vhost)}
	}
	s.log.Info("Submitted a task", "task", rec.MessageID, "callee", rec.CalleeID, "capability", rec.Capability, "confirmed", perr == nil)
	return submitResult{rec: rec, publishErr: perr}, nil
}

// publishSubmit publishes the stored task_submit (the identical envelope
// every time, so the callee deduplicates it by message_id).
func (s *Sidecar) publishSubmit(ctx context.Context, t TaskRecord) error {
	env, err := envelope.Decode(t.Envelope)
	if err != nil {
		return fmt.Errorf("stored task_submit %s does not decode: %w", t.MessageID, err)
	}
	pub := envelope.ToPublishing(env, t.Envelope, s.cfg.Username)
	pub.Headers = tracing.Parse(t.Traceparent, t.Tracestate).AMQPHeaders()
	pctx, cancel := context.WithTimeout(ctx, s.o.PublishTimeout)
	defer cancel()
	err = s.o.Publisher.Publish(pctx, topology.CommandsExchange, topology.CommandRoutingKey(t.CalleeID), pub)
	if err == nil {
		s.m.MessagesOut.WithLabelValues(string(envelope.TypeTaskSubmit)).Inc()
	}
	return err
}

// retryLoop republishes pending task_submits whose answer is overdue.
func (s *Sidecar) retryLoop(ctx context.Context) {
	every := min(max(s.o.SubmitRetry.Timeout/4, 20*time.Millisecond), time.Second)
	t := s.clk.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			s.retryDue(ctx)
		}
	}
}

func (s *Sidecar) retryDue(ctx context.Context) {
	for _, t := range s.store.Tasks() {
		if ctx.Err() != nil {
			return
		}
		if t.State != TaskPending || s.isAnswered(t.MessageID) || len(t.Envelope) == 0 {
			// Adopted tasks (submitted by an earlier pod) have no envelope
			// to republish.
			continue
		}
		now := s.clk.Now()
		if now.Before(t.LastAttemptAt.Add(s.o.SubmitRetry.wait(max(t.Attempts, 1)))) {
			continue
		}
		switch {
		case !t.ExpiresAt.IsZero() && !now.Before(t.ExpiresAt):
			s.setTaskState(t.MessageID, TaskExpired)
			s.log.Info("A task expired without an answer; no longer republishing it", "task", t.MessageID, "attempts", t.Attempts)
			continue
		case t.Attempts >= s.o.SubmitRetry.MaxAttempts:
			s.setTaskState(t.MessageID, TaskUnanswered)
			s.log.Info("WARNING: a task got no answer after every attempt; giving up", "task", t.MessageID, "callee", t.CalleeID, "attempts", t.Attempts)
			continue
		}
		attempt := t.Attempts + 1
		if _, err := s.store.UpdateTask(t.MessageID, func(r *TaskRecord) bool {
			if r.State != TaskPending {
				return false
			}
			r.Attempts, r.LastAttemptAt = attempt, now
			return true
		}); err != nil {
			s.log.Error(err, "Failed to record a republish", "task", t.MessageID)
			continue
		}
		err := s.publishSubmit(ctx, t)
		if err != nil {
			s.log.Error(err, "Failed to republish a task_submit; will retry", "task", t.MessageID, "attempt", attempt)
			continue
		}
		s.log.Info("Republished an unanswered task_submit with the same message_id", "task", t.MessageID, "callee", t.CalleeID, "attempt", attempt)
	}
}

func (s *Sidecar) setTaskState(id string, st TaskState) {
	if _, err := s.store.UpdateTask(id, func(r *TaskRecord) bool {
		if r.State != TaskPending {
			return false
		}
		r.State = st
		return true
	}); err != nil {
		s.log.Error(err, "Failed to record a task's state", "task", id, "state", st)
	}
}

func (s *Sidecar) markAnswered(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answered[id] = true
}

func (s *Sidecar) isAnswered(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.answered[id]
}

// abort publishes an abort for session sid with the token learnt from its
// task_accepted, to the session's callee.
func (s *Sidecar) abort(ctx context.Context, sid, reason string) (string, *apiError) {
	rec, ok := s.store.Session(sid)
	switch {
	case !ok:
		return "", &apiError{status: 404, code: codeNotFound, msg: "no session " + sid + " is known to this sidecar"}
	case rec.over() || rec.State == string(v1alpha1.SessionAborted):
		return "", &apiError{status: 409, code: "session_finished", msg: "the session has already ended (" + rec.State + ")"}
	case rec.Token == "":
		return "", &apiError{status: 409, code: "no_token", msg: "the session's task_accepted (and its token) has not been received yet"}
	case !rec.TokenExpiresAt.IsZero() && !s.clk.Now().Before(rec.TokenExpiresAt):
		return "", &apiError{status: 409, code: "token_expired", msg: "the session token expired at " + task.FormatTimestamp(rec.TokenExpiresAt)}
	}
	p := task.Abort{SessionToken: rec.Token, Reason: reason}
	env, err := envelope.NewAt(s.clk.Now(), envelope.TypeAbort, sid, p)
	if err != nil {
		return "", &apiError{status: 500, code: "internal", msg: err.Error()}
	}
	pub, err := envelope.EncodePublishing(env, s.cfg.Username)
	if err != nil {
		return "", &apiError{status: 500, code: "internal", msg: err.Error()}
	}
	pctx, cancel := context.WithTimeout(ctx, s.o.PublishTimeout)
	defer cancel()
	err = s.o.Publisher.Publish(pctx, topology.CommandsExchange, topology.CommandRoutingKey(rec.CalleeID), pub)
	switch {
	case errors.Is(err, transport.ErrUnroutable):
		return "", &apiError{status: 502, code: "unknown_callee", msg: fmt.Sprintf("no command queue is bound for callee %q", rec.CalleeID)}
	case err != nil:
		return "", &apiError{status: 503, code: "broker_unavailable", msg: "abort not confirmed by the broker, retry: " + err.Error()}
	}
	s.m.MessagesOut.WithLabelValues(string(envelope.TypeAbort)).Inc()
	now := s.clk.Now()
	if _, err := s.store.UpdateSession(sid, func(r *SessionRecord) bool {
		r.AbortRequestedAt = now
		return true
	}); err != nil {
		s.log.Error(err, "Failed to record an abort request", "session", sid)
	}
	s.log.Info("Sent an abort", "session", sid, "callee", rec.CalleeID, "messageID", env.MessageID)
	return env.MessageID, nil
}
