package callee

import (
	"context"
	"errors"
	"net/http"

	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
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
	if ss.lost.Load() {
		return errOwnershipLost
	}
	if ss.moved.Load() {
		return errFenced
	}
	if s.lease != nil && (!s.lease.Valid() || ss.leaseGen.Load() != s.lease.Generation()) {
		// Lapsed, or renewed again after a lapse but the session's
		// HCPSession was not re-read since (revalidate).
		return errFenced
	}
	return nil
}

func fencedError(err error) *apiError {
	switch {
	case errors.Is(err, errOwnershipLost):
		return ownershipLostError()
	case errors.Is(err, errFenced):
		return &apiError{http.StatusServiceUnavailable, &server.Error{Code: codeFenced, Message: err.Error()}}
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
	alive, known, err := s.leases.Alive(ctx, s.reader, s.ns, pod)
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
	if ss == nil || ss.uid != hs.UID || ss.lost.Load() || !s.lostTo(ss, hs) {
		return
	}
	s.loseSession(ss, "the session was taken over by another replica", "owner", hs.Status.PodName,
		"epoch", ss.epoch, "storedEpoch", hs.Status.OwnerEpoch)
}

// revalidateLoop re-reads every session this replica holds each time its
// Lease is renewed after a lapse (lease.Keeper.Regained): until a session's
// HCPSession is read back showing this replica's epoch and pod, the fence
// keeps it closed (the renewal proves this pod is alive, not that nobody
// took the session over meanwhile); a session found claimed by another
// replica is lost (loseSession).
func (s *Sidecar) revalidateLoop(ctx context.Context) {
	if s.lease == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.lease.Regained():
		}
		s.revalidate(ctx)
	}
}

func (s *Sidecar) revalidate(ctx context.Context) {
	gen := s.lease.Generation()
	todo := s.active()
	backoff := 200 * time.Millisecond
	for len(todo) > 0 && ctx.Err() == nil && gen == s.lease.Generation() {
		var again []*sess
		for _, ss := range todo {
			mine, err := s.checkOwner(ctx, ss)
			switch {
			case apierrors.IsNotFound(err):
				// Deleted: the HCPSession's deletion aborts it.
			case err != nil:
				again = append(again, ss)
			case mine:
				ss.leaseGen.Store(gen)
				if ss.harnessStopped.CompareAndSwap(true, false) {
					go ss.recoverHarness("the harness was stopped while this replica could not confirm that it owned the session")
				}
			}
		}
		if todo = again; len(todo) == 0 {
			break
		}
		s.log.Info("Could not re-read sessions after the Lease was renewed; they stay fenced until they are read", "sessions", len(todo))
		select {
		case <-ctx.Done():
		case <-s.clk.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// fenceWatch stops the harness's work on every session while the Lease has
// lapsed: by the time another replica may take a session over (a full
// Lease duration after it last saw this Lease change), this replica has
// stopped publishing (the fence) and its harness has stopped executing
// (abort with reason ownership_lost, which the harness answers by stopping
// without a word). When the session is confirmed to be still this
// replica's (revalidate), it is resumed from its checkpoint; a session
// whose outcome is being recorded keeps its harness (it only retries
// complete or fail).
func (s *Sidecar) fenceWatch(ctx context.Context) {
	if s.lease == nil {
		return
	}
	t := s.clk.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		s.stopLapsed()
	}
}

func (s *Sidecar) stopLapsed() {
	if s.lease.Valid() {
		return
	}
	for _, ss := range s.active() {
		if ss.moved.Load() || ss.ending.Load() || !ss.delivered.Load() || !ss.harnessStopped.CompareAndSwap(false, true) {
			continue
		}
		ss.delivered.Store(false) // the watchdog leaves it alone
		ss.log().Info("The Lease lapsed: stopping the harness's work on the session until this replica's ownership is confirmed")
		go s.harnessAbort(ss.id, codeOwnershipLost)
	}
}
