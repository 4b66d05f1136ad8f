package callee

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// Reasons of the hand-over transitions.
const (
	reasonHarnessMoved     = "harness_moved"
	reasonRecovered        = "recovered_from_checkpoint"
	reasonHarnessRestarted = "harness_restarted"
)

// Drain hands this replica's sessions over before its pod goes away (the
// preStop hook of the harness containers calls it through the probe
// server's /drain, before the harness gets SIGTERM; Run calls it at
// shutdown too). It stops consuming commands (new tasks go to other
// replicas), then, for every running session: asks the harness to stop it
// and return a checkpoint (POST {harness}/hcp/v1/sessions/{id}/drain),
// stores the checkpoint, emits RUNNING → PAUSED (harness_moved), waits for
// the confirms and releases the session (status.podName cleared, exact
// lastSequence) for another replica to resume. A session with no
// checkpoint at all keeps running here until the shutdown drain ends it.
// Drain is idempotent; later calls wait for the first.
func (s *Sidecar) Drain(ctx context.Context) error {
	s.drainOnce.Do(func() {
		go func() {
			defer close(s.drained)
			s.drain(context.WithoutCancel(ctx))
		}()
	})
	select {
	case <-s.drained:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Sidecar) drain(ctx context.Context) {
	log := s.log.WithValues("pod", s.pod)
	s.mu.Lock()
	s.shuttingDn = true
	stop := s.stopConsume
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	waitTimeout(&s.inflight, s.t.ShutdownDrain)
	active := s.active()
	log.Info("Draining: handing sessions over to other replicas", "sessions", len(active))
	var wg sync.WaitGroup
	for _, ss := range active {
		wg.Go(func() {
			if err := ss.handOver(ctx); err != nil {
				ss.log().Info("Session not handed over; it keeps running here until shutdown", "reason", err.Error())
			}
		})
	}
	wg.Wait()
}

// drainAnswer is the harness's answer to a drain request.
type drainAnswer struct {
	CheckpointID string `json:"checkpoint_id"`
	Description  string `json:"description"`
	// State is the opaque checkpoint (base64 in JSON).
	State []byte `json:"state"`
}

// handOver moves one session off this replica.
func (ss *sess) handOver(ctx context.Context) error {
	s := ss.sc
	owner, err := ss.ckptOwner()
	if err != nil {
		return err
	}
	rec, err := s.ckpt.Load(ctx, owner)
	if err != nil && !unverified(err) {
		return err
	}
	// A stored record that does not verify (an unsigned one of an earlier
	// release) is no checkpoint to fall back on; the harness may give one.
	haveCkpt := err == nil && rec != nil && rec.Checkpoint != nil
	ans, asked := s.askDrain(ctx, ss.id)
	switch {
	case asked && ans.CheckpointID != "":
		if _, e := ss.checkpoint(ctx, &session.CheckpointCreatedData{
			CheckpointID: ans.CheckpointID, Description: orDefault(ans.Description, "taken for a hand-over"),
			Resumable: true, CreatedAt: task.NewTimestamp(s.clk.Now()),
		}, ans.State); e != nil {
			return e
		}
	case haveCkpt:
		// The harness cannot checkpoint on request: stop it; the next
		// replica resumes from the last checkpoint.
		s.harnessAbort(ss.id, reasonHarnessMoved)
	default:
		return fmt.Errorf("the session has no checkpoint and the harness did not give one")
	}
	if err := ss.acquire(ctx); err != nil {
		return err
	}
	st := ss.machine.State()
	if st != session.StateRunning && st != session.StatePaused {
		ss.release()
		return fmt.Errorf("the session is %s", st)
	}
	var ps []*pending
	if st == session.StateRunning {
		p, err := ss.transitionLocked(s.life, session.StatePaused, reasonHarnessMoved)
		if err != nil {
			ss.release()
			return err
		}
		ps = append(ps, p)
	}
	ss.moved.Store(true)
	last, events := ss.seq.Last(), ss.events
	ss.leaveLocked()
	ss.release()
	if err := waitAll(ctx, ps); err != nil {
		return fmt.Errorf("the PAUSED transition was not confirmed: %w", err)
	}
	<-ss.confirmDone
	return s.releaseStatus(ctx, ss, last, events)
}

// askDrain asks the harness to stop a session and return a checkpoint. ok
// is false when the harness does not implement it (or failed).
func (s *Sidecar) askDrain(ctx context.Context, id string) (drainAnswer, bool) {
	status, body, err := s.callHarnessRaw(ctx, "/hcp/v1/sessions/"+id+"/drain", []byte(`{"reason":"`+reasonHarnessMoved+`"}`))
	var a drainAnswer
	if err != nil || status/100 != 2 || json.Unmarshal(body, &a) != nil {
		return drainAnswer{}, false
	}
	return a, true
}

// releaseStatus records the hand-over: PAUSED (harness_moved), no owner,
// the exact last sequence. The status writer forgets the session first,
// so nothing it still holds can overwrite the release.
func (s *Sidecar) releaseStatus(ctx context.Context, ss *sess, last, events int64) error {
	s.st.Forget(ss.id)
	backoff := 200 * time.Millisecond
	for {
		hs, err := s.readSession(ctx, ss.id)
		if err == nil && s.lostTo(ss, hs) {
			// Claimed by another replica meanwhile: not ours to release.
			ss.log().Info("Not releasing the session: another replica claimed it", "epoch", ss.epoch, "storedEpoch", hs.Status.OwnerEpoch, "owner", hs.Status.PodName)
			return nil
		}
		if err == nil {
			err = s.casStatus(ctx, hs, func(st *v1alpha1.HCPSessionStatus) {
				st.State = v1alpha1.SessionPaused
				st.Reason = reasonHarnessMoved
				st.Message = fmt.Sprintf("handed over by pod %s; another replica resumes it from its checkpoint", s.pod)
				st.PodName = ""
				st.LastSequence = last
				st.EventCount = events
				setCondition(st, metav1.Condition{Type: v1alpha1.ConditionHandover, Status: metav1.ConditionTrue, Reason: "Released",
					Message: "released by pod " + s.pod, LastTransitionTime: metav1.NewTime(s.clk.Now())})
			})
		}
		if err == nil {
			ss.log().Info("Handed the session over", "lastSequence", last)
			s.sessionEvent(ss.id, ss.uid, corev1.EventTypeNormal, EventSessionHandedOver,
				"Released by pod %s at its drain after event %d; another replica resumes it from its checkpoint", s.pod, last)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("releasing the session: %w", err)
		case <-s.clk.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// leaveLocked ends the session's life on this replica without a terminal
// state (it moved): timers stop, nothing more is published, the confirm
// loop finishes what is queued and closes the session in the log. Called
// with lock.
func (ss *sess) leaveLocked() {
	if ss.terminal.Swap(true) {
		return
	}
	if ss.timeout != nil {
		ss.timeout.Stop()
	}
	if ss.abortTimer != nil {
		ss.abortTimer.Stop()
	}
	ss.gauge(ss.machine.State(), -1)
	ss.endedAt.Store(ss.sc.clk.Now().UnixNano())
	ss.closeConfirms()
	ss.endTrace(string(ss.machine.State()), "left_replica", false)
	ss.sc.forgetLater(ss)
}

// leave is leaveLocked for callers without the lock.
func (ss *sess) leave() {
	_ = ss.acquire(context.Background())
	defer ss.release()
	ss.leaveLocked()
	ss.sc.st.Forget(ss.id)
}

// forgetLater drops an ended session from memory after Retention (late
// harness calls get 409 meanwhile, not 404).
func (s *Sidecar) forgetLater(ss *sess) {
	s.clk.AfterFunc(s.t.Retention, func() {
		s.mu.Lock()
		if s.sessions[ss.id] == ss {
			delete(s.sessions, ss.id)
		}
		s.mu.Unlock()
	})
}

// callHarnessRaw is callHarness returning the whole body (up to 1 MiB).
func (s *Sidecar) callHarnessRaw(ctx context.Context, path string, body []byte) (int, []byte, error) {
	resp, err := s.postHarness(ctx, path, body)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, checkpoint.MaxState*2+(64<<10)))
	return resp.StatusCode, b, err
}
