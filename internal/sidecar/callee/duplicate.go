package callee

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// duplicate answers a task_submit whose HCPSession exists with the original
// reply, rebuilt from the object. depth bounds the re-processing of an
// orphaned PENDING session.
func (s *Sidecar) duplicate(ctx context.Context, c *command, depth int) {
	d, log, callerID, sid, msgID := c.d, c.log, c.callerID, c.sid, c.msgID
	if s.m != nil {
		s.m.Duplicates.WithLabelValues("message_id").Inc()
	}
	var hs v1alpha1.HCPSession
	if err := s.reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: sid}, &hs); err != nil {
		if apierrors.IsNotFound(err) && depth < 3 {
			// Deleted meanwhile (an orphan cleared by recovery): decide anew.
			s.redecide(ctx, c, depth+1)
			return
		}
		log.Error(err, "Failed to read the HCPSession of a duplicate; the command will be retried")
		s.retryLater(ctx, d)
		return
	}
	if hs.Spec.CallerID != callerID {
		// Another caller replays someone else's message_id: it must not get
		// that caller's reply (it holds the session token).
		log.Info("Refused a task_submit reusing another caller's message_id", "sessionCaller", hs.Spec.CallerID)
		s.replyRejected(ctx, d, callerID, sid, msgID, s.clk.Now(), task.ReasonNotAuthorized,
			"message_id "+msgID+" already identifies another caller's task; use a fresh message_id")
		return
	}
	switch st := hs.DecidedState(); {
	case st == v1alpha1.SessionRejected:
		log.Info("Answered a duplicate task_submit with its original rejection")
		s.refuseRecorded(ctx, c, &hs)
	case st == "" || st == v1alpha1.SessionPending: // being decided somewhere, or orphaned
		s.pendingDuplicate(ctx, c, &hs, depth)
	case hs.Spec.MaxDuration != "": // admitted (set at creation only then), and decided
		pub, err := s.acceptedReply(&hs)
		if err != nil {
			log.Error(err, "Failed to rebuild task_accepted")
			s.settle(d, true, false)
			return
		}
		log.Info("Answered a duplicate task_submit with its original acceptance", "state", st)
		s.sendReply(ctx, d, log, callerID, sid, envelope.TypeTaskAccepted, pub)
	default:
		// Past PENDING without having been admitted: only a hand-written
		// status gets here. The immutable spec says the gate refused it.
		log.Info("A session that was never admitted has a non-PENDING state; answering with a rejection", "state", st)
		s.refuseRecorded(ctx, c, &hs)
	}
}

// refuseRecorded answers with the rejection hs records (refuse: with a
// task_failed when the caller may hold an acceptance of the task).
func (s *Sidecar) refuseRecorded(ctx context.Context, c *command, hs *v1alpha1.HCPSession) {
	pub, err := s.rejectedReply(hs)
	if err != nil {
		c.log.Error(err, "Failed to rebuild task_rejected")
		s.settle(c.d, true, false)
		return
	}
	at, code, msg := recordedRejection(hs)
	s.refuse(ctx, c, pub, at, code, msg)
}

// pendingDuplicate handles a duplicate whose session is still PENDING.
func (s *Sidecar) pendingDuplicate(ctx context.Context, c *command, hs *v1alpha1.HCPSession, depth int) {
	d, log, sid := c.d, c.log, c.sid
	s.mu.Lock()
	ch, local := s.deciding[sid]
	s.mu.Unlock()
	if local {
		s.waitThen(ctx, ch, func() { s.duplicate(ctx, c, depth+1) })
		return
	}
	owner := decidingPod(hs)
	if owner != "" && owner != s.pod && s.podAlive(ctx, owner) {
		// Another live replica is deciding it: wait for its decision.
		deadline := s.clk.Now().Add(s.t.PendingWait)
		for s.clk.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return
			case <-s.clk.After(250 * time.Millisecond):
			}
			var cur v1alpha1.HCPSession
			if err := s.reader.Get(ctx, client.ObjectKeyFromObject(hs), &cur); err != nil {
				break
			}
			if !undecided(&cur) {
				s.duplicate(ctx, c, depth+1)
				return
			}
		}
		log.Info("Another replica has not decided a task in time; the command will be retried", "owner", owner)
		s.retryLater(ctx, d)
		return
	}
	// Orphaned: the deciding process is gone before any reply or harness
	// call (both come after PENDING is left). Remove the record, guarded by
	// its uid and resourceVersion, and decide anew.
	if depth >= 2 {
		s.retryLater(ctx, d)
		return
	}
	log.Info("Cleared an orphaned PENDING session; deciding the task anew", "owner", owner)
	if err := s.c.Delete(ctx, hs, client.Preconditions{UID: &hs.UID, ResourceVersion: &hs.ResourceVersion}); err != nil && !apierrors.IsNotFound(err) {
		if apierrors.IsConflict(err) {
			s.duplicate(ctx, c, depth+1)
			return
		}
		log.Error(err, "Failed to delete an orphaned PENDING session")
		s.retryLater(ctx, d)
		return
	}
	s.redecide(ctx, c, depth+1)
}

// redecide decides the task again after its orphaned record was removed.
func (s *Sidecar) redecide(ctx context.Context, c *command, depth int) {
	if depth > 3 {
		s.retryLater(ctx, c.d)
		return
	}
	s.decideTask(ctx, c, depth)
}
