package callee

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// start publishes task_accepted (unless reply is nil: published before
// the session was recorded, accept.go), session_created and state_changed
// (PENDING → RUNNING), and arms the max-duration timer. It returns the
// pending task_accepted (nil without reply), whose confirm acknowledges
// the command.
func (ss *sess) start(reply *amqp.Publishing, abortRequested bool) *pending {
	_ = ss.acquire(context.Background())
	defer ss.release()
	ctx := ss.sc.life
	ss.gauge(session.StatePending, 1)
	if err := ss.sc.wal.Open(ss.id, ss.task); err != nil {
		ss.log().Error(err, "Failed to record the session in the write-ahead log")
	}
	var accepted *pending
	if reply != nil {
		var err error
		if accepted, err = ss.publishLocked(ctx, envelope.TypeTaskAccepted, *reply, 0, ""); err != nil {
			ss.log().Error(err, "Failed to publish task_accepted")
		}
	}
	// The session is created PENDING (the L3 decision is recorded), and
	// the state_changed right after it takes it to RUNNING: the two agree.
	if _, err := ss.emitTyped(ctx, &session.SessionCreatedData{State: session.StatePending, RiskLevel: ss.risk, SessionToken: ss.token}); err != nil {
		ss.log().Error(err, "Failed to publish session_created")
	}
	ss.token = "" // said; the harness's task carries it (ss.task)
	if _, err := ss.transitionLocked(ctx, session.StateRunning, "accepted"); err != nil {
		ss.log().Error(err, "Failed to publish state_changed")
	}
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) { st.PodName = ss.sc.pod })
	ss.timeout = ss.sc.clk.AfterFunc(ss.expiresAt.Sub(ss.sc.clk.Now()), ss.onTimeout)
	if abortRequested || ss.abortRequested {
		ss.toAbortingLocked(ctx, "abort requested before the session started")
	}
	return accepted
}

// transitionLocked applies a non-terminal transition and emits its
// state_changed event. Called with lock.
func (ss *sess) transitionLocked(ctx context.Context, to session.State, reason string) (*pending, error) {
	from := ss.machine.State()
	m, err := ss.machine.Apply(to, reason, ss.sc.clk.Now())
	if err != nil {
		return nil, err
	}
	ss.machine = m
	ss.gauge(from, -1)
	ss.gauge(to, 1)
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) {
		st.State = v1alpha1.SessionState(to)
		st.Reason = reason
		if from != session.StatePending {
			st.Message = "" // PENDING → RUNNING keeps the admission message
		}
	})
	return ss.emitTyped(ctx, &session.StateChangedData{FromState: from, ToState: to, Reason: reason})
}

// outcome is what ends a session.
type outcome struct {
	final     session.State
	reason    string
	message   string
	completed *task.TaskCompleted
	failed    *task.TaskFailed
}

// finishLocked ends the session: the terminal record first (conditional on
// the owner epoch; nothing changes if it cannot be written: the error is
// returned), then state_changed, task_completed or task_failed (if any) and
// session_closed, published from it; the timers stop, the confirm queue
// closes, and the terminal status is written once the broker confirmed
// them (terminal.go). Called with lock.
func (ss *sess) finishLocked(ctx context.Context, o outcome) ([]*pending, error) {
	from := ss.machine.State()
	now := ss.sc.clk.Now()
	if err := session.Transition(from, o.final); err != nil {
		return nil, err
	}
	if err := ss.sc.fence(ss); err != nil {
		return nil, err
	}
	ss.ending.Store(true) // the harness waits for this outcome: keep it (fenceWatch)
	rec, err := ss.buildTerminalLocked(from, o, now)
	if err != nil {
		return nil, err
	}
	if err := ss.recordTerminal(ctx, rec); err != nil {
		return nil, err
	}
	m, err := ss.machine.Apply(o.final, o.reason, now)
	if err != nil {
		return nil, err
	}
	ss.machine = m
	ss.gauge(from, -1)
	ps, err := ss.publishRecordLocked(ctx, rec)
	if err != nil {
		// Recorded: the record is replayed (statusAfterConfirms does not
		// write the terminal status without every confirm).
		ss.log().Error(err, "Failed to publish the end of the session; its terminal record is replayed")
	}
	if ss.timeout != nil {
		ss.timeout.Stop()
	}
	if ss.abortTimer != nil {
		ss.abortTimer.Stop()
	}
	if err != nil {
		ps = append(ps, &pending{done: closedChan, err: err})
	}
	ss.terminal.Store(true)
	ss.endedAt.Store(now.UnixNano())
	ss.closeConfirms()
	ss.endTrace(string(o.final), o.reason, o.final != session.StateCompleted)
	ss.log().Info("Session ended", "state", o.final, "reason", o.reason, "events", ss.events)
	ss.recordEnd(o, now)
	ss.sc.m.SessionEnded(ss.capability, string(o.final), o.reason, now.Sub(ss.startedAt)) // hcp_sessions_total, hcp_session_duration_seconds
	// Keep the session in memory for a while, so late harness calls get a
	// clear 409 instead of 404; then forget it.
	ss.sc.forgetLater(ss)
	go ss.statusAfterConfirms(ps, rec.Status)
	return ps, nil
}

// closedChan is a closed channel (a pending that is already done).
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// requestAbort starts an abort (RUNNING or PAUSED → ABORTING); a no-op in
// any other state.
func (ss *sess) requestAbort(reason string) {
	if ss.terminal.Load() || !ss.abortSeen.CompareAndSwap(false, true) {
		return
	}
	_ = ss.acquire(context.Background())
	defer ss.release()
	ss.abortRequested = true
	ss.toAbortingLocked(ss.sc.life, reason)
}

func (ss *sess) toAbortingLocked(ctx context.Context, reason string) {
	st := ss.machine.State()
	if st != session.StateRunning && st != session.StatePaused {
		return
	}
	if _, err := ss.transitionLocked(ctx, session.StateAborting, reason); err != nil {
		ss.log().Error(err, "Failed to publish state_changed to ABORTING")
	}
	ss.log().Info("Aborting session", "reason", reason)
	now := metav1.NewTime(ss.sc.clk.Now())
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) {
		setCondition(st, metav1.Condition{Type: v1alpha1.ConditionAbortRequested, Status: metav1.ConditionTrue, Reason: "AbortRequested", Message: truncate(reason, 512), LastTransitionTime: now})
	})
	ss.abortTimer = ss.sc.clk.AfterFunc(ss.abortTimeout, ss.onAbortTimeout)
	ss.notifyHarnessAbortLocked(reason)
}

// notifyHarnessAbortLocked tells the harness to stop, once, in the
// background. Called with lock.
func (ss *sess) notifyHarnessAbortLocked(reason string) {
	if ss.abortSent {
		return
	}
	ss.abortSent = true
	go ss.sc.harnessAbort(ss.id, reason)
}

func (ss *sess) onAbortTimeout() {
	_ = ss.acquire(context.Background())
	defer ss.release()
	if ss.machine.State() != session.StateAborting {
		return
	}
	msg := fmt.Sprintf("the harness did not report the end of its cleanup within the abort timeout %s", task.FormatDuration(ss.abortTimeout))
	if _, err := ss.finishLocked(ss.sc.life, outcome{final: session.StateAborted, reason: reasonAbortTimeout, message: msg}); err != nil {
		ss.retryEnd(err, reasonAbortTimeout, msg, false)
	}
}

// onTimeout fails the session that exceeded its max duration (resuming it
// first when PAUSED) and tells the harness to stop.
func (ss *sess) onTimeout() {
	_ = ss.acquire(context.Background())
	defer ss.release()
	st := ss.machine.State()
	if st != session.StateRunning && st != session.StatePaused {
		return
	}
	msg := fmt.Sprintf("the session exceeded its maximum duration (%s, until %s)", task.FormatDuration(ss.expiresAt.Sub(ss.startedAt)), ss.expiresAt.Format(time.RFC3339))
	ss.failLocked(codeTimeout, msg, false)
	ss.notifyHarnessAbortLocked("timeout")
}

// failLocked ends a RUNNING or PAUSED session FAILED, or an ABORTING one
// ABORTED. Called with lock.
func (ss *sess) failLocked(code, msg string, recoverable bool) {
	ctx := ss.sc.life
	switch ss.machine.State() {
	case session.StatePaused:
		if _, err := ss.transitionLocked(ctx, session.StateRunning, code); err != nil {
			ss.log().Error(err, "Failed to publish state_changed")
		}
		fallthrough
	case session.StateRunning:
		if _, err := ss.finishLocked(ctx, outcome{final: session.StateFailed, reason: code, message: msg,
			failed: &task.TaskFailed{Code: code, Message: msg, Recoverable: recoverable}}); err != nil {
			ss.retryEnd(err, code, msg, recoverable)
		}
	case session.StateAborting:
		if _, err := ss.finishLocked(ctx, outcome{final: session.StateAborted, reason: code, message: msg}); err != nil {
			ss.retryEnd(err, code, msg, recoverable)
		}
	}
}

// endRetry is the delay before an outcome of the sidecar's own (a timeout,
// a lost harness) that could not be recorded is tried again.
const endRetry = 5 * time.Second

// retryEnd tries an outcome of the sidecar's own again later, until it is
// recorded or the session is lost to another replica. Called with lock.
func (ss *sess) retryEnd(err error, code, msg string, recoverable bool) {
	if errors.Is(err, errOwnershipLost) || ss.ended() {
		return
	}
	ss.log().Error(err, "Failed to end the session; retrying", "reason", code, "in", endRetry.String())
	ss.sc.clk.AfterFunc(endRetry, func() {
		if ss.sc.life.Err() == nil {
			ss.terminate(code, msg, recoverable)
		}
	})
}

// terminate ends the session from outside (harness unreachable, shutdown).
func (ss *sess) terminate(code, msg string, recoverable bool) {
	_ = ss.acquire(context.Background())
	defer ss.release()
	ss.failLocked(code, msg, recoverable)
}

// recordEnd records the session's end as Events: on the Callee always, and
// on the HCPSession too when it did not complete.
func (ss *sess) recordEnd(o outcome, now time.Time) {
	took := now.Sub(ss.startedAt).Round(time.Second)
	switch o.final {
	case session.StateCompleted:
		ss.sc.event(corev1.EventTypeNormal, EventSessionCompleted, "Session %s of caller %s (capability %q) completed after %s, %d events",
			ss.id, ss.callerID, ss.capability, took, ss.events)
	case session.StateFailed, session.StateAborted:
		reason := EventSessionFailed
		if o.final == session.StateAborted {
			reason = EventSessionAborted
		}
		msg := oneLine(o.message, 300)
		ss.sc.event(corev1.EventTypeWarning, reason, "Session %s of caller %s (capability %q) ended %s after %s: %s: %s",
			ss.id, ss.callerID, ss.capability, o.final, took, o.reason, msg)
		ss.sc.sessionEvent(ss.id, ss.uid, corev1.EventTypeWarning, reason, "Ended %s after %s, %d events: %s: %s",
			o.final, took, ss.events, o.reason, msg)
	}
}
