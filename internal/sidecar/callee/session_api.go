package callee

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// apiError is an error answer of the local API.
type apiError struct {
	status int
	body   *server.Error
}

func (e *apiError) Error() string { return e.body.Error() }

func conflict(state session.State, format string, args ...any) *apiError {
	return &apiError{http.StatusConflict, &server.Error{Code: server.CodeInvalidTransition, Message: fmt.Sprintf(format, args...), State: string(state)}}
}

func badRequest(err error) *apiError {
	e := &server.Error{Code: server.CodeBadRequest, Message: err.Error()}
	var ve *task.ValidationError
	if errors.As(err, &ve) {
		for _, f := range ve.Fields {
			e.Fields = append(e.Fields, server.FieldError{Field: f.Field, Message: f.Message})
		}
	}
	return &apiError{http.StatusBadRequest, e}
}

func transitionConflict(err error, state session.State) *apiError {
	return &apiError{http.StatusConflict, &server.Error{Code: server.CodeInvalidTransition, Message: err.Error(), State: string(state)}}
}

// lockFor acquires the lock for an API call.
func (ss *sess) lockFor(ctx context.Context) *apiError {
	if err := ss.acquire(ctx); err != nil {
		return &apiError{http.StatusServiceUnavailable, &server.Error{Code: server.CodeUnavailable, Message: "the session is busy (publishing is blocked): " + err.Error()}}
	}
	return nil
}

// events publishes harness events (already validated, data as sent) with
// consecutive sequence numbers.
func (ss *sess) publishEvents(ctx context.Context, evs []harnessEvent) ([]*pending, []int64, *apiError) {
	if e := ss.lockFor(ctx); e != nil {
		return nil, nil, e
	}
	defer ss.release()
	switch st := ss.machine.State(); st {
	case session.StateRunning, session.StatePaused, session.StateAborting:
	default:
		return nil, nil, conflict(st, "events are accepted while the session is RUNNING, PAUSED or ABORTING; it is %s", st)
	}
	// Before the key table: a retry's 200 tells the harness to go on, which
	// only an owner may (a zombie's harness would run its next step beside
	// the new owner's).
	if err := ss.sc.fence(ss); err != nil {
		return nil, nil, fencedError(err)
	}
	var ps []*pending
	seqs := make([]int64, 0, len(evs))
	// The status records the batch once: its last sequence and the last
	// progress in it (one status update per request, not two per event).
	var progress *v1alpha1.SessionProgress
	defer func() {
		if len(ps) > 0 {
			ss.noteEventsLocked(ps[len(ps)-1], progress)
		}
	}()
	// The events are sequenced first, then written to the log together
	// (one write for the request) and published.
	var (
		batch   = make([]outgoing, 0, len(evs))
		batched map[string]int64 // the keys of this request
		retried []*pending       // retries of events not confirmed yet
		err     error
	)
	for _, ev := range evs {
		if key := ev.IdempotencyKey; key != "" {
			seq, ok := ss.keys.Get(key)
			if !ok {
				seq, ok = batched[key]
			}
			if ok {
				// A retry: already published, and answered once it is
				// confirmed, as the first call would have been.
				seqs = append(seqs, seq)
				if p := ss.unconfirmed(seq); p != nil {
					retried = append(retried, p)
				}
				continue
			}
		}
		var o outgoing
		if o, err = ss.sequenceHarnessEventLocked(&ev); err != nil {
			break // what is sequenced already is still published
		}
		batch = append(batch, o)
		seqs = append(seqs, o.seq)
		if ev.IdempotencyKey != "" {
			if batched == nil {
				batched = map[string]int64{}
			}
			batched[ev.IdempotencyKey] = o.seq
		}
		if d, ok := ev.decoded.(*session.ProgressData); ok {
			progress = statusProgress(d)
		}
	}
	if len(batch) > 0 {
		var perr error
		if ps, perr = ss.publishEventsLocked(ss.sc.life, batch); perr != nil {
			err = perr
		}
	}
	if err != nil {
		return ps, seqs, fencedError(err)
	}
	// Not in ps itself: the deferred status note takes ps's last event.
	return append(ps[:len(ps):len(ps)], retried...), seqs, nil
}

// unconfirmed returns the publish of event seq while its confirm is
// awaited, else nil (confirmed, or given up: the session then fails).
func (ss *sess) unconfirmed(seq int64) *pending {
	if seq <= ss.confirmed.Load() {
		return nil
	}
	return ss.confirms.find(seq)
}

// statusProgress is a progress event as the HCPSession's status shows it.
func statusProgress(d *session.ProgressData) *v1alpha1.SessionProgress {
	p := &v1alpha1.SessionProgress{Stage: truncate(d.Stage, 256), Message: truncate(d.Message, 512)}
	if d.Percent != nil && !math.IsNaN(*d.Percent) {
		v := int32(math.Round(max(0, min(100, *d.Percent))))
		p.Percent = &v
	}
	return p
}

func unavailable(err error) *apiError {
	return &apiError{http.StatusServiceUnavailable, &server.Error{Code: server.CodeUnavailable, Message: "the event could not be published: " + err.Error()}}
}

// pause: RUNNING → PAUSED.
func (ss *sess) pause(ctx context.Context, reason string) ([]*pending, *apiError) {
	return ss.simpleTransition(ctx, session.StatePaused, orDefault(reason, "paused by the harness"))
}

// resume: PAUSED → RUNNING.
func (ss *sess) resume(ctx context.Context, reason string) ([]*pending, *apiError) {
	return ss.simpleTransition(ctx, session.StateRunning, orDefault(reason, "resumed by the harness"))
}

func (ss *sess) simpleTransition(ctx context.Context, to session.State, reason string) ([]*pending, *apiError) {
	if e := ss.lockFor(ctx); e != nil {
		return nil, e
	}
	defer ss.release()
	st := ss.machine.State()
	if err := session.Transition(st, to); err != nil {
		return nil, transitionConflict(err, st)
	}
	p, err := ss.transitionLocked(ss.sc.life, to, reason)
	if err != nil {
		return nil, fencedError(err)
	}
	return []*pending{p}, nil
}

// checkpoint stores the harness's checkpoint (with the task, so another
// replica can resume the session) and emits checkpoint_created (RUNNING or
// PAUSED). The store write comes first and outside the lock: the event
// announces a checkpoint that exists.
func (ss *sess) checkpoint(ctx context.Context, d *session.CheckpointCreatedData, state []byte) ([]*pending, *apiError) {
	if st := ss.currentState(); st != session.StateRunning && st != session.StatePaused {
		return nil, conflict(st, "checkpoints are accepted while the session is RUNNING or PAUSED; it is %s", st)
	}
	if d.CreatedAt.IsZero() {
		d.CreatedAt = task.NewTimestamp(ss.sc.clk.Now())
	}
	// The store is shared state: write it only as the session's owner,
	// confirmed just now (the fence, then the stored epoch re-read).
	if e := ss.ownerNow(ctx); e != nil {
		return nil, e
	}
	if len(state) > 0 || d.Resumable {
		owner, err := ss.ckptOwner()
		if err == nil {
			// Conditional on this replica's epoch: a record written by a
			// later owner is never overwritten (ErrStaleEpoch).
			err = ss.sc.ckpt.Save(ctx, owner, ss.epoch, ss.task, checkpoint.Checkpoint{
				ID: d.CheckpointID, Description: d.Description, Resumable: d.Resumable,
				Sequence: ss.seq.Last(), CreatedAt: d.CreatedAt.Time, State: state,
			})
		}
		if errors.Is(err, checkpoint.ErrStaleEpoch) {
			return nil, ownershipLostError()
		}
		if errors.Is(err, checkpoint.ErrTooLarge) {
			return nil, &apiError{http.StatusRequestEntityTooLarge, &server.Error{Code: server.CodeTooLarge, Message: err.Error()}}
		}
		if err != nil {
			return nil, unavailable(err)
		}
	}
	if e := ss.lockFor(ctx); e != nil {
		return nil, e
	}
	defer ss.release()
	st := ss.machine.State()
	if st != session.StateRunning && st != session.StatePaused {
		return nil, conflict(st, "checkpoints are accepted while the session is RUNNING or PAUSED; it is %s", st)
	}
	p, err := ss.emitTyped(ss.sc.life, d)
	if err != nil {
		return nil, fencedError(err)
	}
	cp := &v1alpha1.SessionCheckpoint{ID: truncate(d.CheckpointID, 253), Description: truncate(d.Description, 512), Resumable: d.Resumable, CreatedAt: &metav1.Time{Time: d.CreatedAt.Time}}
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) { st.LastCheckpoint = cp })
	return []*pending{p}, nil
}

// ownerNow answers whether this replica may write the session's shared
// state now: the fence is open and the HCPSession, read from the API
// server, still shows this replica's epoch. 503 fenced (retry) when it
// cannot tell, 409 ownership_lost when another replica claimed it.
func (ss *sess) ownerNow(ctx context.Context) *apiError {
	if err := ss.sc.fence(ss); err != nil {
		return fencedError(err)
	}
	mine, err := ss.sc.checkOwner(ctx, ss)
	switch {
	case err != nil:
		return fencedError(fmt.Errorf("%w: %w", errFenced, err))
	case !mine:
		return ownershipLostError()
	}
	return nil
}

// currentState reads the state without waiting for a busy session.
func (ss *sess) currentState() session.State {
	if err := ss.acquire(context.Background()); err != nil {
		return ""
	}
	defer ss.release()
	return ss.machine.State()
}

// complete: RUNNING → COMPLETED with task_completed. While ABORTING the
// abort wins: the session ends ABORTED and the result is not forwarded.
func (ss *sess) complete(ctx context.Context, tc *task.TaskCompleted) ([]*pending, *apiError) {
	if e := ss.lockFor(ctx); e != nil {
		return nil, e
	}
	defer ss.release()
	switch st := ss.machine.State(); st {
	case session.StateRunning:
		ps, err := ss.finishLocked(ss.sc.life, outcome{final: session.StateCompleted, reason: "completed", completed: tc})
		if err != nil {
			return nil, terminalError(err)
		}
		return ps, nil
	case session.StateAborting:
		if _, err := ss.finishLocked(ss.sc.life, outcome{final: session.StateAborted, reason: reasonAborted, message: "the harness completed the task while it was being aborted; the result was discarded"}); err != nil {
			return nil, terminalError(err)
		}
		return nil, conflict(session.StateAborted, "the session was being aborted: it is now ABORTED and the result was not forwarded")
	case session.StatePaused:
		return nil, conflict(st, "the session is PAUSED: resume it before completing it (L2 has no PAUSED -> COMPLETED)")
	default:
		return nil, conflict(st, "the session is %s", st)
	}
}

// fail: RUNNING → FAILED with task_failed (from PAUSED through RUNNING,
// since L2 has no PAUSED → FAILED). While ABORTING the abort wins.
func (ss *sess) fail(ctx context.Context, tf *task.TaskFailed) ([]*pending, *apiError) {
	if e := ss.lockFor(ctx); e != nil {
		return nil, e
	}
	defer ss.release()
	switch st := ss.machine.State(); st {
	case session.StatePaused, session.StateRunning:
		var ps []*pending
		if st == session.StatePaused {
			p, err := ss.transitionLocked(ss.sc.life, session.StateRunning, "resumed to fail: "+tf.Code)
			if err != nil {
				return nil, unavailable(err)
			}
			ps = append(ps, p)
		}
		more, err := ss.finishLocked(ss.sc.life, outcome{final: session.StateFailed, reason: tf.Code, message: tf.Message, failed: tf})
		if err != nil {
			return ps, terminalError(err)
		}
		return append(ps, more...), nil
	case session.StateAborting:
		if _, err := ss.finishLocked(ss.sc.life, outcome{final: session.StateAborted, reason: reasonAborted, message: "the harness reported a failure while the task was being aborted: " + tf.Message}); err != nil {
			return nil, terminalError(err)
		}
		return nil, conflict(session.StateAborted, "the session was being aborted: it is now ABORTED")
	default:
		return nil, conflict(st, "the session is %s", st)
	}
}

// aborted: ABORTING → ABORTED (the harness finished its cleanup).
func (ss *sess) aborted(ctx context.Context, reason string) ([]*pending, *apiError) {
	if e := ss.lockFor(ctx); e != nil {
		return nil, e
	}
	defer ss.release()
	st := ss.machine.State()
	if st != session.StateAborting {
		if err := session.Transition(st, session.StateAborted); err != nil {
			return nil, transitionConflict(err, st)
		}
	}
	ps, err := ss.finishLocked(ss.sc.life, outcome{final: session.StateAborted, reason: reasonAborted, message: orDefault(reason, "the harness finished cleaning up")})
	if err != nil {
		return nil, terminalError(err)
	}
	return ps, nil
}
