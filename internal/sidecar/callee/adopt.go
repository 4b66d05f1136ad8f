package callee

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// DefaultResumeWait bounds how long a session waits PAUSED for a harness to
// take it back (a restarting harness, a replica becoming ready).
const DefaultResumeWait = 2 * time.Minute

// released reports whether a session was handed over at a drain and waits
// for another replica.
func released(hs *v1alpha1.HCPSession) bool {
	return hs.Status.PodName == "" && hs.Status.State == v1alpha1.SessionPaused && hs.Status.Reason == reasonHarnessMoved
}

func (s *Sidecar) draining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shuttingDn
}

func (s *Sidecar) readSession(ctx context.Context, id string) (*v1alpha1.HCPSession, error) {
	var hs v1alpha1.HCPSession
	if err := s.reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: id}, &hs); err != nil {
		return nil, err
	}
	return &hs, nil
}

// readopt continues the sessions a previous incarnation of this sidecar in
// the same pod left in the write-ahead log (a crash, an OOM kill): each
// goes on with the next sequence number, what may not have reached the
// broker is republished (the caller deduplicates), and the harness, which
// usually still runs the task, keeps reporting to the same session. A
// session another replica took over meanwhile is only stopped here.
func (s *Sidecar) readopt(ctx context.Context) {
	for id, ws := range s.walSessions {
		log := s.log.WithValues("session", id)
		hs, err := s.readSession(ctx, id)
		switch {
		case apierrors.IsNotFound(err):
			_ = s.wal.Close(id)
			continue
		case err != nil:
			log.Error(err, "Failed to read a session to re-adopt; the sweep retries")
			continue
		}
		// Claim it again (a higher owner epoch): whatever the previous
		// incarnation may still have in flight is older.
		epoch, mine, err := s.reclaim(ctx, hs)
		if err != nil {
			log.Error(err, "Failed to claim a session to re-adopt; the sweep retries")
			continue
		}
		if !mine {
			log.Info("A session of the previous incarnation moved to another replica; stopping it here", "owner", hs.Status.PodName)
			_ = s.wal.Close(id)
			go s.harnessAbort(id, codeOwnershipLost)
			continue
		}
		if tr := terminalOf(hs); tr != nil && !hs.Status.State.IsTerminal() {
			// Ended, maybe not published: from the record, not the log.
			_ = s.wal.Close(id)
			if err := s.replayTerminal(ctx, hs, tr, epoch); err != nil {
				log.Error(err, "Failed to replay the terminal record of a re-adopted session; the sweep retries")
			}
			continue
		}
		claims, err := sessionClaims(s.id, hs)
		if err != nil {
			log.Info("Skipped a session whose times cannot be derived", "error", err.Error())
			continue
		}
		tsk, err := s.loggedTask(ctx, hs, ws)
		if err != nil {
			// Not continued here: the recovery sweep right after takes it
			// over (resumed from a verified checkpoint, or ended).
			log.Error(err, "Cannot re-adopt a session without its task; it is taken over instead")
			continue
		}
		ss := s.restoreSession(hs, claims, ws.LastSeq, true)
		ss.epoch = epoch
		ss.task, ss.keys, ss.index = tsk, ws.Keys, ws.LastIndex
		if st, err := session.ParseState(ws.State); err == nil && ws.State != "" {
			if m, err := session.Restore(st, hs.CreationTimestamp.Time, s.clk.Now()); err == nil {
				ss.machine = m
			}
		}
		s.st.Seed(hs.Name, hs.Status, s.clk.Now())
		if hs.Status.State == "" && admittedAtCreation(hs) {
			// Admitted at creation; the previous incarnation ended before
			// it wrote the state.
			s.st.Update(hs.Name, func(st *v1alpha1.HCPSessionStatus) {
				st.State, st.PodName, st.Reason = v1alpha1.SessionState(ss.machine.State()), s.pod, "accepted"
			})
		}
		s.register(ss)
		_ = ss.acquire(ctx)
		for _, m := range ws.Pending {
			if m.Seq > 0 { // every event before the first unconfirmed one was confirmed
				ss.confirmed.Store(m.Seq - 1)
				break
			}
		}
		for _, m := range ws.Pending {
			if _, err := ss.republishLocked(m); err != nil {
				log.Error(err, "Failed to republish a message of a re-adopted session", "sequence", m.Seq)
			}
		}
		if ss.machine.IsTerminal() || hs.Status.State.IsTerminal() {
			ss.leaveLocked() // ended before the crash: only its last messages were owed
			ss.release()
			continue
		}
		ss.armTimersLocked()
		ss.delivered.Store(true) // the harness had it; the watchdog checks
		midHandOver := pausedToResume(ss.machine.State(), hs)
		ss.release()
		log.Info("Re-adopted a session after a sidecar restart", "state", ss.machine.State(), "lastSequence", ws.LastSeq, "republished", len(ws.Pending), "resuming", midHandOver)
		if midHandOver {
			// The previous incarnation paused it to hand the task over
			// (a takeover, a recovery) and died before it logged PAUSED →
			// RUNNING: maybe before the harness got the task, maybe just
			// after (the harness then runs it, and would report the whole
			// run into a PAUSED session whose completion is refused).
			// Hand it over again now rather than after the watchdog's
			// checks: a harness that has it answers so, and the session
			// goes RUNNING either way.
			go ss.recoverHarness("re-adopted PAUSED in the middle of a hand-over (the sidecar restarted)")
		}
	}
	s.walSessions = nil
	s.adopting.Store(false)
}

// pausedToResume reports whether a re-adopted session is PAUSED by a
// sidecar to be resumed (harness_moved, harness_restarted), not by its
// harness (which resumes it itself).
func pausedToResume(st session.State, hs *v1alpha1.HCPSession) bool {
	return st == session.StatePaused && (hs.Status.Reason == reasonHarnessMoved || hs.Status.Reason == reasonHarnessRestarted)
}

// republishLocked publishes a logged message again. Called with lock.
func (ss *sess) republishLocked(m wal.Message) (*pending, error) {
	env, err := envelope.Decode(m.Body)
	if err != nil {
		return nil, err
	}
	pub := envelope.ToPublishing(env, m.Body, ss.sc.username)
	return ss.enqueueLocked(ss.sc.life, m.Index, env.Type, m.RoutingKey, pub, m.Seq)
}

// armTimersLocked starts the max-duration timer (and the abort timer of an
// ABORTING session). Called with lock.
func (ss *sess) armTimersLocked() {
	ss.timeout = ss.sc.clk.AfterFunc(ss.expiresAt.Sub(ss.sc.clk.Now()), ss.onTimeout)
	if ss.machine.State() == session.StateAborting {
		ss.abortTimer = ss.sc.clk.AfterFunc(ss.abortTimeout, ss.onAbortTimeout)
	}
}

// takeOver claims a session nobody runs: its replica is gone (Lease
// expired), it was released at a drain, or a previous incarnation of this
// sidecar left it without a log. With a checkpoint it is resumed here
// (RUNNING → PAUSED harness_moved → the harness gets the task and the
// checkpoint → RUNNING recovered_from_checkpoint); without one it ends
// FAILED harness_lost. PENDING records are removed so their command is
// decided anew.
func (s *Sidecar) takeOver(ctx context.Context, hs *v1alpha1.HCPSession) {
	end, ok := s.claiming(hs.Name)
	if !ok {
		return // being claimed or run here already
	}
	defer end()
	st := hs.DecidedState()
	log := s.log.WithValues("session", hs.Name, "owner", hs.Status.PodName, "state", st)
	if undecided(hs) {
		// No reply was sent and the harness never saw the task: remove
		// the record so the command, unacknowledged and so redelivered, is
		// decided anew.
		err := s.c.Delete(ctx, hs, client.Preconditions{UID: &hs.UID, ResourceVersion: &hs.ResourceVersion})
		if err == nil {
			log.Info("Removed an orphaned PENDING session; its command will be decided anew")
		} else if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			log.Error(err, "Failed to remove an orphaned PENDING session")
		}
		return
	}
	claims, err := sessionClaims(s.id, hs)
	if err != nil {
		log.Info("Skipped an orphaned session whose times cannot be derived", "error", err.Error())
		return
	}
	rec, err := s.ckpt.Load(ctx, ckptOwner(hs))
	rec, err = s.loadVerified(rec, err, hs)
	var refused error // a record that failed verification: nothing in it is used
	if unverified(err) {
		refused, rec, err = err, nil, nil
	}
	if err != nil {
		log.Error(err, "Failed to read the checkpoint of an orphaned session; the sweep retries")
		return
	}
	prev, wasReleased := hs.Status.PodName, released(hs)
	if prev == "" && !wasReleased {
		prev = decidingPod(hs) // admitted at creation, no status written
	}
	resumable := rec != nil && rec.Checkpoint != nil && st != v1alpha1.SessionAborting
	msg := fmt.Sprintf("the replica running the session (pod %s) is gone; taken over by pod %s", prev, s.pod)
	switch {
	case wasReleased:
		msg = fmt.Sprintf("handed over by its replica; resumed by pod %s", s.pod)
	case prev == s.pod:
		msg = fmt.Sprintf("the callee sidecar (pod %s) restarted without its session log", s.pod)
	}
	// Claim it: only the winner of this optimistic-lock write goes on,
	// with the next owner epoch.
	epoch := storedEpoch(hs) + 1
	if err := s.casStatus(ctx, hs, func(stored *v1alpha1.HCPSessionStatus) {
		stored.State = st // RUNNING when admitted at creation and not written since
		stored.PodName = s.pod
		stored.OwnerEpoch = epoch
		stored.Message = truncate(msg, 1024)
		setCondition(stored, metav1.Condition{Type: v1alpha1.ConditionHandover, Status: metav1.ConditionTrue, Reason: "TakenOver",
			Message: truncate(msg, 512), LastTransitionTime: metav1.NewTime(s.clk.Now())})
	}); err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			log.Error(err, "Failed to claim an orphaned session")
		}
		return
	}
	s.st.Seed(hs.Name, hs.Status, s.clk.Now())
	if tr := terminalOf(hs); tr != nil {
		// It ended (its outcome recorded), maybe unpublished: publish
		// the record again; the task never runs again.
		if err := s.replayTerminal(ctx, hs, tr, epoch); err != nil {
			log.Error(err, "Failed to replay the terminal record of a session; the sweep retries")
		}
		return
	}
	typ := corev1.EventTypeWarning
	if wasReleased {
		typ = corev1.EventTypeNormal
	}
	s.sessionEvent(hs.Name, hs.UID, typ, EventSessionTakenOver, "%s", msg)
	// A released session's lastSequence is exact (written after its last
	// confirm); otherwise continue after the reserved ceiling, never
	// reusing a number the caller may have seen.
	ss := s.restoreSession(hs, claims, hs.Status.LastSequence, wasReleased)
	ss.epoch = epoch
	if rec != nil {
		ss.task = rec.Task
	}
	// In the log with its task, before anything is published: a restart
	// of this sidecar re-adopts it (readopt) with the task and after the
	// last sequence used before. Anything the log held of an earlier
	// ownership by this pod belongs to an older epoch and is dropped.
	if err := s.wal.Adopt(hs.Name, ss.task, ss.seq.Last()); err != nil {
		log.Error(err, "Failed to record a session taken over in the write-ahead log")
	}
	s.register(ss)
	if refused != nil {
		log.Error(refused, "Refused the checkpoint of an orphaned session; failing it without running anything", "reason", codeCheckpointRejected)
		s.sessionEvent(hs.Name, hs.UID, corev1.EventTypeWarning, EventCheckpointRejected, "%s", truncate(refused.Error(), 900))
		ss.terminate(codeCheckpointRejected, truncate(msg+"; its stored checkpoint was refused, nothing was resumed: "+refused.Error(), 1024), false)
		if prev == s.pod {
			go s.harnessAbort(hs.Name, codeCheckpointRejected)
		}
		return
	}
	if !resumable {
		log.Info("Closing an orphaned session: nothing to resume from", "reason", codeHarnessLost)
		ss.terminate(codeHarnessLost, msg+"; the session has no checkpoint to resume from", true)
		if prev == s.pod {
			go s.harnessAbort(hs.Name, codeHarnessLost)
		}
		return
	}
	_ = ss.acquire(ctx)
	ss.armTimersLocked()
	if ss.machine.State() == session.StateRunning {
		if _, err := ss.transitionLocked(s.life, session.StatePaused, reasonHarnessMoved); err != nil {
			log.Error(err, "Failed to publish state_changed to PAUSED")
		}
	}
	ss.release()
	log.Info("Took over a session; resuming it from its checkpoint", "checkpoint", rec.Checkpoint.ID, "released", wasReleased)
	go ss.resumeFrom(reasonHarnessMoved, rec.Checkpoint)
}

// restoreSession rebuilds a session from its HCPSession. With exact, last
// is the last sequence used; otherwise the sequence resumes after the
// reserved ceiling, never reusing a number the caller may have seen. Its
// times are the token's (sessionClaims), not the status's.
func (s *Sidecar) restoreSession(hs *v1alpha1.HCPSession, claims token.Claims, last int64, exact bool) *sess {
	ceiling, err := strconv.ParseInt(hs.Annotations[AnnotationSequenceCeiling], 10, 64)
	if err != nil || ceiling < hs.Status.LastSequence {
		ceiling = hs.Status.LastSequence + DefaultSequenceBlock
	}
	// Every sequence up to an exact last is one published event.
	events := last
	if !exact {
		last, events = ceiling, hs.Status.EventCount
	}
	m, err := session.Restore(session.State(hs.Status.State), hs.CreationTimestamp.Time, s.clk.Now())
	if err != nil {
		m, _ = session.Restore(session.StateRunning, hs.CreationTimestamp.Time, s.clk.Now())
	}
	abortTimeout := DefaultAbortTimeout
	if cl, err := s.callee(s.life); err == nil {
		abortTimeout = policy.CalleeDuration(cl.Spec.Sessions.AbortTimeout, DefaultAbortTimeout)
	}
	tok, _ := token.Issue(s.keys.signer(), claims)
	ss := &sess{
		sc:             s,
		id:             hs.Name,
		callerID:       hs.Spec.CallerID,
		capability:     hs.Spec.Capability,
		taskMsgID:      hs.Spec.TaskMessageID,
		risk:           task.RiskLevel(hs.Spec.RiskLevel),
		token:          tok,
		startedAt:      claims.IssuedAt,
		expiresAt:      claims.ExpiresAt,
		uid:            hs.UID,
		abortTimeout:   abortTimeout,
		abortRequested: hs.Spec.AbortRequested,
		lock:           make(chan struct{}, 1),
		machine:        m,
		events:         events,
		confirmDone:    make(chan struct{}),
	}
	ss.confirmedUnder() // restored right after its claim
	ss.seq = session.ResumeSequencer(last, ceiling, DefaultSequenceBlock, ss.reserver(ceiling))
	ss.seq.ReserveAhead() // the ceiling patch off the events' path
	// Up to last, every event is in the queue or, published by a replica
	// that is gone without confirming it, lost for good: no caller should
	// wait for it. (A re-adopted session lowers this to its first
	// unconfirmed event, which it republishes.)
	ss.confirmed.Store(last)
	ss.gauge(m.State(), 1)
	ss.startTrace(hs, true)
	return ss
}
