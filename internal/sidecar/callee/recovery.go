package callee

import (
	"context"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

var podGVK = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}

// recover ends the sessions a previous incarnation of this sidecar (same
// pod name: a container restart) left behind, before any new command is
// consumed. A session must never stay RUNNING with nobody running it.
func (s *Sidecar) recover(ctx context.Context) {
	s.sweep(ctx, true)
}

// sweepLoop periodically ends the sessions of replicas that vanished (their
// pod no longer exists): RUNNING/PAUSED → FAILED harness_lost, ABORTING →
// ABORTED; PENDING records are deleted, so the redelivered command is
// decided anew. The status write that claims an orphan is an
// optimistic-lock write, so one replica wins when several sweep at once.
func (s *Sidecar) sweepLoop(ctx context.Context) {
	t := s.clk.NewTicker(s.t.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			s.sweep(ctx, false)
		}
	}
}

func (s *Sidecar) sweep(ctx context.Context, startup bool) {
	var list v1alpha1.HCPSessionList
	// At startup read the API server: the cache may not have synced.
	var r client.Reader = s.c
	if startup {
		r = s.reader
	}
	if err := r.List(ctx, &list, client.InNamespace(s.ns), client.MatchingLabels{v1alpha1.LabelCalleeID: s.id}); err != nil {
		s.log.Error(err, "Failed to list HCPSessions for recovery")
		return
	}
	alive := map[string]bool{}
	for i := range list.Items {
		hs := &list.Items[i]
		st := hs.Status.State
		if st.IsTerminal() || s.isLocal(hs.Name) {
			continue
		}
		owner := hs.Status.PodName
		orphan := false
		switch owner {
		case s.pod:
			orphan = true // not in memory: a previous incarnation's
		case "":
			// Created, not even PENDING recorded yet: orphaned once old.
			orphan = s.clk.Since(hs.CreationTimestamp.Time) > s.t.PendingWait
		default:
			a, ok := alive[owner]
			if !ok {
				a = s.podAlive(ctx, owner)
				alive[owner] = a
			}
			orphan = !a
		}
		if orphan {
			s.closeOrphan(ctx, hs)
		}
	}
}

func (s *Sidecar) isLocal(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, deciding := s.deciding[id]
	_, running := s.sessions[id]
	return deciding || running
}

// closeOrphan ends a session nobody runs any more.
func (s *Sidecar) closeOrphan(ctx context.Context, hs *v1alpha1.HCPSession) {
	log := s.log.WithValues("session", hs.Name, "owner", hs.Status.PodName, "state", hs.Status.State)
	st := hs.Status.State
	if st == "" || st == v1alpha1.SessionPending {
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
	prev := hs.Status.PodName
	msg := fmt.Sprintf("the replica running the session (pod %s) is gone; closed by pod %s", prev, s.pod)
	if prev == s.pod {
		msg = fmt.Sprintf("the callee sidecar (pod %s) restarted while the session ran", s.pod)
	}
	// Claim it: only the winner of this optimistic-lock write closes it.
	if err := s.casStatus(ctx, hs, func(st *v1alpha1.HCPSessionStatus) {
		st.PodName = s.pod
		st.Message = truncate(msg, 1024)
	}); err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			log.Error(err, "Failed to claim an orphaned session")
		}
		return
	}
	s.st.Seed(hs.Name, hs.Status, s.clk.Now())
	ss := s.restoreSession(hs, claims)
	s.register(ss)
	log.Info("Closing an orphaned session", "reason", codeHarnessLost)
	ss.terminate(codeHarnessLost, msg, true)
	if prev == s.pod {
		// Our own harness may still run it: tell it to stop.
		go s.harnessAbort(hs.Name, codeHarnessLost)
	}
}

// restoreSession rebuilds a session from its HCPSession to close it. The
// sequence resumes after the reserved ceiling, never reusing a number the
// caller may have seen. Its times are the token's (sessionClaims), not the
// status's.
func (s *Sidecar) restoreSession(hs *v1alpha1.HCPSession, claims token.Claims) *sess {
	ceiling, err := strconv.ParseInt(hs.Annotations[AnnotationSequenceCeiling], 10, 64)
	if err != nil || ceiling < hs.Status.LastSequence {
		ceiling = hs.Status.LastSequence + DefaultSequenceBlock
	}
	m, err := session.Restore(session.State(hs.Status.State), hs.CreationTimestamp.Time, s.clk.Now())
	if err != nil {
		m, _ = session.Restore(session.StateRunning, hs.CreationTimestamp.Time, s.clk.Now())
	}
	ss := &sess{
		sc:           s,
		id:           hs.Name,
		callerID:     hs.Spec.CallerID,
		capability:   hs.Spec.Capability,
		taskMsgID:    hs.Spec.TaskMessageID,
		risk:         task.RiskLevel(hs.Spec.RiskLevel),
		startedAt:    claims.IssuedAt,
		expiresAt:    claims.ExpiresAt,
		uid:          hs.UID,
		log:          s.log.WithValues("session", hs.Name, "caller", hs.Spec.CallerID),
		abortTimeout: DefaultAbortTimeout,
		lock:         make(chan struct{}, 1),
		machine:      m,
		events:       hs.Status.EventCount,
		confirmQ:     make(chan *pending, confirmQueueSize),
	}
	ss.seq = session.NewReservingSequencer(ceiling, DefaultSequenceBlock, ss.reserver(0))
	ss.gauge(m.State(), 1)
	return ss
}
