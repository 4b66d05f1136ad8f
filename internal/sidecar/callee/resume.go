package callee

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// Resuming a session's task on the harness: from its checkpoint after the
// harness lost it, and the task itself, which a re-adopted session takes
// from its log (or, logged by an earlier release, from its checkpoint
// record).

// loggedTask is the task of a session to re-adopt, from its log. A log of
// an earlier release holds none for a session it took over (it recorded
// the task of the sessions it started only): the task is then the one the
// session's checkpoint record holds, verified as a takeover does
// (loadVerified), and is recorded in the log now. A session that ended
// before the restart needs none.
func (s *Sidecar) loggedTask(ctx context.Context, hs *v1alpha1.HCPSession, ws *wal.Session) ([]byte, error) {
	if st, _ := session.ParseState(ws.State); len(ws.Task) > 0 || st.IsTerminal() {
		return ws.Task, nil
	}
	rec, err := s.ckpt.Load(ctx, ckptOwner(hs))
	rec, err = s.loadVerified(rec, err, hs)
	switch {
	case err != nil:
		return nil, fmt.Errorf("its log holds no task, and its checkpoint record: %w", err)
	case rec == nil || len(rec.Task) == 0:
		return nil, errors.New("its log holds no task, and it has no checkpoint record")
	}
	if err := s.wal.SetTask(hs.Name, rec.Task); err != nil {
		s.log.Error(err, "Failed to record a re-adopted session's task in the write-ahead log", "session", hs.Name)
	}
	return rec.Task, nil
}

// recoverHarness handles a harness that lost a running session (it
// restarted, or stopped answering): with a checkpoint the session goes
// RUNNING → PAUSED (harness_restarted) and is resumed from it; without
// one it ends FAILED harness_lost. A PAUSED session is resumed the same
// way: the harness that paused it lost it, or this sidecar paused it to
// resume it (a takeover, a recovery) and restarted before it handed the
// task over.
func (ss *sess) recoverHarness(why string) {
	s := ss.sc
	if ss.ended() || !ss.recovering.CompareAndSwap(false, true) {
		return
	}
	defer ss.recovering.Store(false)
	owner, err := ss.ckptOwner()
	var rec *checkpoint.Record
	if err == nil {
		rec, err = s.ckpt.Load(s.life, owner)
	}
	if unverified(err) {
		ss.log().Error(err, "Refused the session's checkpoint; failing it without resuming", "reason", codeCheckpointRejected)
		s.sessionEvent(ss.id, ss.uid, corev1.EventTypeWarning, EventCheckpointRejected, "%s", truncate(err.Error(), 900))
		ss.terminate(codeCheckpointRejected, truncate(why+"; its stored checkpoint was refused, nothing was resumed: "+err.Error(), 1024), false)
		return
	}
	if err != nil || rec == nil || rec.Checkpoint == nil {
		if err != nil {
			why += "; its checkpoint could not be read: " + err.Error()
		} else {
			why += "; the session has no checkpoint to resume from"
		}
		ss.terminate(codeHarnessLost, why, true)
		return
	}
	_ = ss.acquire(context.Background())
	switch ss.machine.State() {
	case session.StateRunning:
		if _, err := ss.transitionLocked(s.life, session.StatePaused, reasonHarnessRestarted); err != nil {
			ss.log().Error(err, "Failed to publish state_changed to PAUSED")
		}
	case session.StatePaused:
	default:
		ss.release()
		return
	}
	ss.delivered.Store(false)
	ss.release()
	ss.log().Info("The harness lost the session; resuming it from its checkpoint", "why", why, "checkpoint", rec.Checkpoint.ID)
	ss.resumeFrom(reasonHarnessRestarted, rec.Checkpoint)
}

// resumeFrom hands the task and the checkpoint to the harness (retrying while
// it is unreachable, up to DefaultResumeWait), then emits PAUSED → RUNNING
// (recovered_from_checkpoint).
func (ss *sess) resumeFrom(reason string, cp *checkpoint.Checkpoint) {
	var body harnessTask
	if err := json.Unmarshal(ss.task, &body); err != nil || body.SessionID == "" {
		ss.terminate(codeHarnessLost, "the session's task record cannot be read; it cannot be resumed", true)
		return
	}
	body.Resume = &resumeInfo{CheckpointID: cp.ID, State: cp.State, Sequence: cp.Sequence, Reason: reason}
	raw, err := json.Marshal(body)
	if err != nil {
		ss.terminate(string(task.ReasonInternal), "the task could not be encoded for the harness: "+err.Error(), false)
		return
	}
	attempts := int(DefaultResumeWait/(5*time.Second)) + 3
	if herr := ss.handTask(raw, attempts); herr != nil {
		ss.terminate(herr.code, herr.msg, herr.code == codeHarnessUnavailable)
		return
	}
	_ = ss.acquire(context.Background())
	defer ss.release()
	if ss.machine.State() != session.StatePaused {
		return // aborted or ended meanwhile
	}
	if _, err := ss.transitionLocked(ss.sc.life, session.StateRunning, reasonRecovered); err != nil {
		ss.log().Error(err, "Failed to publish state_changed to RUNNING")
	}
}
