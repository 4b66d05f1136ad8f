package callee

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/lease"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
)

// Ownership. A session is run by exactly one replica: the pod named in its
// HCPSession's status.podName. A replica becomes the owner by an
// optimistic-lock status write (decideAndReply, takeOver), so of several
// replicas racing for a session exactly one wins. The owner vouches for
// itself through its pod's Lease (internal/sidecar/lease): it publishes
// nothing while its last renewal is older than the Lease duration minus a
// margin, and another replica takes a session over only once the owner's
// Lease has expired (or the owner released the session at a drain). So a
// paused-but-alive old owner (a partition, a stopped process) has stopped
// emitting before anyone else may start.

// errFenced is returned to a publish while this replica cannot vouch that
// it still owns its sessions, and for a session that moved away.
var errFenced = errors.New("this replica cannot confirm it still owns the session (its Lease could not be renewed, or the session moved to another replica); retry later")

// fence refuses publishing for a session that moved, or while the Lease
// has lapsed.
func (s *Sidecar) fence(ss *sess) error {
	if ss.moved.Load() {
		return errFenced
	}
	if s.lease != nil && !s.lease.Valid() {
		return errFenced
	}
	return nil
}

func fencedError(err error) *apiError {
	if errors.Is(err, errFenced) {
		return &apiError{http.StatusServiceUnavailable, &server.Error{Code: server.CodeUnavailable, Message: err.Error()}}
	}
	return unavailable(err)
}

// ownerAlive reports whether the replica of pod may still run its
// sessions: its Lease is current; or, without a Lease (a sidecar of an
// older version, or a pod deleted with its Lease), its pod exists, or it
// vanished less than Timeouts.LostOwnerGrace ago. The Lease is owned by
// the pod, so garbage collection deletes it with a force-deleted pod whose
// processes may still run on an unreachable node; waiting a Lease duration
// from the moment the loss is seen gives such an owner the time to fence
// itself (it stops publishing before its own Lease would have expired).
func (s *Sidecar) ownerAlive(ctx context.Context, pod string) bool {
	if pod == s.pod {
		return true
	}
	alive, known, err := lease.Alive(ctx, s.reader, s.ns, pod, s.clk.Now())
	if err == nil && known {
		return alive
	}
	if s.podAlive(ctx, pod) {
		return true
	}
	now := s.clk.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	since, seen := s.goneSince[pod]
	if !seen {
		s.goneSince[pod] = now
		s.log.Info("A replica is gone with its Lease; its sessions move once the grace period has passed", "pod", pod, "grace", s.t.LostOwnerGrace.String())
		// Look again right after the grace period, not a sweep interval later.
		s.clk.AfterFunc(s.t.LostOwnerGrace+time.Millisecond, func() {
			if s.life.Err() == nil {
				s.sweep(s.life, false)
			}
		})
		return true
	}
	return now.Sub(since) < s.t.LostOwnerGrace
}

// movedAway handles an HCPSession update showing that a session this
// replica runs is now owned by another pod (it was taken over while this
// replica could not renew its Lease): it stops the local harness's work
// on it and forgets it without publishing anything.
func (s *Sidecar) movedAway(hs *v1alpha1.HCPSession) {
	ss := s.session(hs.Name)
	if ss == nil || ss.ended() || hs.Status.PodName == "" || hs.Status.PodName == s.pod {
		return
	}
	if !ss.moved.CompareAndSwap(false, true) {
		return
	}
	ss.log.Info("The session was taken over by another replica; stopping it here", "owner", hs.Status.PodName)
	go s.harnessAbort(ss.id, "session_moved")
	ss.leave()
}
