package caller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
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
}

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

// submit validates req, records the task durably and publishes it.
func (s *Sidecar) submit(ctx context.Context, req SubmitRequest) (submitResult, *apiError) {
	now := s.clk.Now()
	p := task.TaskSubmit{
		CallerID:     s.cfg.ID,
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
			return submitResult{}, badRequest("invalid task", ve.Fields...)
		}
		return submitResult{}, badRequest(err.Error())
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

	s.submitMu.Lock()
	if old, ok := s.store.Task(env.MessageID); ok {
		s.submitMu.Unlock()
		if old.CalleeID != p.CalleeID || old.Capability != p.Capability {
			return submitResult{}, &apiError{status: 409, code: "conflict",
				msg: "message_id " + env.MessageID + " was already used for another task"}
		}
		return submitResult{rec: old, existing: true}, nil
	}
	// Recorded before publishing, as if published: a crash after the publish
	// still leaves a record to match the answer to and to republish from.
	rec, err := s.store.UpdateTask(env.MessageID, func(t *TaskRecord) bool {
		*t = TaskRecord{
			MessageID:     env.MessageID,
			CalleeID:      p.CalleeID,
			Capability:    p.Capability,
			State:         TaskPending,
			SessionID:     topology.SessionID(p.CalleeID, env.MessageID),
			Envelope:      body,
			Attempts:      1,
			SubmittedAt:   now,
			LastAttemptAt: now,
			ExpiresAt:     expires,
		}
		return true
	})
	s.submitMu.Unlock()
	if err != nil {
		return submitResult{}, &apiError{status: 503, code: "state_unavailable", msg: err.Error()}
	}
	perr := s.publishSubmit(ctx, rec)
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
		if t.State != TaskPending || s.isAnswered(t.MessageID) {
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

// taskForSession finds the task whose expected (or accepted) session is sid.
func (s *Sidecar) taskForSession(sid string) (TaskRecord, bool) {
	for _, t := range s.store.Tasks() {
		if t.SessionID == sid {
			return t, true
		}
	}
	return TaskRecord{}, false
}

// abort publishes an abort for session sid with the token learnt from its
// task_accepted, to the session's callee.
func (s *Sidecar) abort(ctx context.Context, sid, reason string) (string, *apiError) {
	rec, ok := s.store.Session(sid)
	switch {
	case !ok:
		return "", &apiError{status: 404, code: "not_found", msg: "no session " + sid + " is known to this sidecar"}
	case rec.finished() || rec.State == string(v1alpha1.SessionAborted):
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

// lookupRetry is how long a missing HCPSession is not looked up again.
const lookupRetry = 10 * time.Second

// lookupSession reads the HCPSession named sid in the sidecar's namespace
// (a hit is kept; a miss is re-checked after lookupRetry: with a cached
// client the session's watch event may simply not have arrived yet).
func (s *Sidecar) lookupSession(sid string) lookup {
	s.mu.Lock()
	l, ok := s.lookups[sid]
	s.mu.Unlock()
	if ok && (l.found || s.clk.Since(l.at) < lookupRetry) {
		return l
	}
	if s.o.Client == nil {
		return lookup{}
	}
	ctx, cancel := context.WithTimeout(s.ctx(), 5*time.Second)
	defer cancel()
	var hs v1alpha1.HCPSession
	err := s.o.Client.Get(ctx, types.NamespacedName{Namespace: s.cfg.Namespace, Name: sid}, &hs)
	switch {
	case err == nil:
		l = lookup{found: true, calleeID: hs.Spec.CalleeID, at: s.clk.Now()}
	case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
		l = lookup{at: s.clk.Now()}
		s.elsewhere.Do(func() {
			s.log.Info("An HCPSession is not readable in this namespace (its callee runs in another namespace, or RBAC does not allow it); callerAckedSequence is recorded only for sessions whose HCPSession is here",
				"namespace", s.cfg.Namespace, "session", sid, "reason", string(apierrors.ReasonForError(err)))
		})
		s.log.V(1).Info("No readable HCPSession for this session in the sidecar's namespace (its callee runs in another namespace, or RBAC does not allow it); callerAckedSequence is not recorded",
			"session", sid, "namespace", s.cfg.Namespace, "reason", string(apierrors.ReasonForError(err)))
	default:
		s.log.Error(err, "Failed to read the HCPSession", "session", sid)
		return lookup{}
	}
	s.mu.Lock()
	s.lookups[sid] = l
	s.mu.Unlock()
	return l
}

// recordAcked records callerAckedSequence through the coalescing status
// writer, when the HCPSession is in this namespace (or no client is given
// to check). It reports false when the HCPSession was not found: the
// session's worker keeps the sequence and calls again (on its next ack or
// tick, and with fresh set at the session's terminal message, at stop and
// before it exits idle), so the last value is not lost to a miss cached
// while the cache had not yet seen a new HCPSession. fresh drops a cached
// miss first.
func (s *Sidecar) recordAcked(sid string, seq int64, fresh bool) bool {
	if s.o.Status == nil {
		return true
	}
	if s.o.Client != nil {
		if fresh {
			s.mu.Lock()
			if l, ok := s.lookups[sid]; ok && !l.found {
				delete(s.lookups, sid)
			}
			s.mu.Unlock()
		}
		if !s.lookupSession(sid).found {
			return false
		}
	}
	s.o.Status.Update(sid, func(st *v1alpha1.HCPSessionStatus) {
		if seq > st.CallerAckedSequence {
			st.CallerAckedSequence = seq
		}
	})
	return true
}

// statusFlusher is implemented by *status.Writer.
type statusFlusher interface {
	Flush(ctx context.Context, name string) error
}

// flushStatus writes sid's pending status now rather than after the
// interval (a session's terminal message), without waiting for it.
func (s *Sidecar) flushStatus(sid string) {
	f, ok := s.o.Status.(statusFlusher)
	if !ok {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.Flush(ctx, sid); err != nil {
			s.log.V(1).Info("Failed to flush callerAckedSequence; the status writer retries", "session", sid, "error", err.Error())
		}
	}()
}
