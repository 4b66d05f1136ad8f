package callee

import (
	"context"
	"errors"
	"net/http"

	amqp "github.com/rabbitmq/amqp091-go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// Owner epochs. Every claim of a session (the decision to RUNNING, a
// takeover, a re-adoption after a sidecar restart) writes
// status.ownerEpoch = the stored epoch + 1 with a resourceVersion
// precondition, so exactly one replica holds each epoch, and a later
// claim always holds a higher one. The replica remembers the epoch it
// claimed (sess.epoch); every message it publishes for the session
// carries it (envelope.HeaderOwnerEpoch), and every write it makes to the
// session's shared state is conditional on it (the status writer's JSON
// patch tests it, the sequence ceiling's patch too, the release at a
// drain reads it first). A replica that sees a higher epoch has lost the
// session: it publishes nothing more and stops its harness (reason
// ownership_lost); the harness's calls answer 409 ownership_lost.

// Codes the harness sees when this replica may not act for a session.
const (
	// codeOwnershipLost: another replica claimed the session (a higher
	// owner epoch); the harness stops working on it. Also the reason of
	// the stop request (POST {harness}/hcp/v1/sessions/{id}/abort).
	codeOwnershipLost = "ownership_lost"
	// codeFenced: this replica cannot confirm right now that it still
	// owns the session (its Lease lapsed, or it has not re-read the
	// session since); retry.
	codeFenced = "fenced"
)

// errOwnershipLost: the session was claimed by another replica.
var errOwnershipLost = errors.New("this replica lost the session: another replica claimed it (a higher owner epoch); stop working on it")

// storedEpoch is the owner epoch the stored HCPSession records: its
// status.ownerEpoch, or 1 for a decided session whose status does not
// carry one yet (admitted at creation: the create was the first claim; or
// written by a sidecar before epochs).
func storedEpoch(hs *v1alpha1.HCPSession) int64 {
	if hs.Status.OwnerEpoch > 0 {
		return hs.Status.OwnerEpoch
	}
	if undecided(hs) {
		return 0
	}
	return 1
}

// withEpoch returns pub's headers with the owner epoch added (a copy: the
// session's trace headers are shared).
func withEpoch(h amqp.Table, epoch int64) amqp.Table {
	out := make(amqp.Table, len(h)+2)
	for k, v := range h {
		out[k] = v
	}
	out[envelope.HeaderOwnerEpoch] = epoch
	return out
}

// sharedHeaders is a header table published already and what it was
// built for.
type sharedHeaders struct {
	table          amqp.Table
	epoch, through int64 // through is -1 for a message without a sequence
}

// headersLocked returns the headers of a message of the session: its
// trace context, own (the message's headers but an owner epoch), the
// owner epoch, and for an event (seq > 0) the confirmed mark
// (envelope.HeaderConfirmedThrough). A message without headers of its own
// (every event) shares the table of the previous such message while the
// epoch and the mark are the same, instead of a new table per event: a
// table is never changed once published (amqp091 reads it while it
// writes the frame, and the confirm queue keeps it for a republish, which
// must carry the mark of the first publish). The trace context is set
// before the session publishes anything. Called with lock.
func (ss *sess) headersLocked(own amqp.Table, seq int64) amqp.Table {
	through := int64(-1)
	if seq > 0 {
		through = ss.confirmed.Load()
	}
	sh := &ss.shared
	if len(own) == 0 && sh.table != nil && sh.epoch == ss.epoch && sh.through == through {
		return sh.table
	}
	h := withEpoch(ss.trace.headers, ss.epoch)
	for k, v := range own {
		if k != envelope.HeaderOwnerEpoch {
			h[k] = v
		}
	}
	if seq > 0 {
		h[envelope.HeaderConfirmedThrough] = through
	}
	if len(own) == 0 {
		*sh = sharedHeaders{table: h, epoch: ss.epoch, through: through}
	}
	return h
}

// ownerEpoch reads HeaderOwnerEpoch (0 when missing).
func ownerEpoch(h amqp.Table) int64 {
	switch v := h[envelope.HeaderOwnerEpoch].(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	}
	return 0
}

// lostTo reports whether hs shows that this replica no longer owns ss: a
// higher owner epoch, or another pod named as its owner.
func (s *Sidecar) lostTo(ss *sess, hs *v1alpha1.HCPSession) bool {
	if hs.Status.OwnerEpoch > ss.epoch {
		return true
	}
	return hs.Status.PodName != "" && hs.Status.PodName != s.pod
}

// loseSession handles a session another replica claimed: nothing more is
// published for it here, its harness is told to stop (ownership_lost), and
// it is forgotten. The harness's calls answer 409 ownership_lost from now
// on.
func (s *Sidecar) loseSession(ss *sess, why string, kv ...any) {
	if !ss.lost.CompareAndSwap(false, true) {
		return
	}
	ss.moved.Store(true)
	if ss.ended() {
		return // ended or left here already: no harness works on it
	}
	ss.log().Info("Lost the session to another replica; stopping it here: "+why, kv...)
	go s.harnessAbort(ss.id, codeOwnershipLost)
	ss.leave()
}

// ownershipLostError is the API answer for a session this replica lost.
func ownershipLostError() *apiError {
	return &apiError{http.StatusConflict, &server.Error{Code: codeOwnershipLost, Message: errOwnershipLost.Error()}}
}

// checkOwner re-reads the session from the API server and reports whether
// this replica still holds it (the same epoch, its pod). A session found
// lost is handled (loseSession).
func (s *Sidecar) checkOwner(ctx context.Context, ss *sess) (bool, error) {
	hs, err := s.readSession(ctx, ss.id)
	if err != nil {
		return false, err
	}
	if s.lostTo(ss, hs) {
		s.loseSession(ss, "a newer claim is stored", "epoch", ss.epoch, "storedEpoch", hs.Status.OwnerEpoch, "owner", hs.Status.PodName)
		return false, nil
	}
	return true, nil
}

// confirmedUnder records that this replica's claim of the session was just
// confirmed (written or read back) under the current Lease generation.
func (ss *sess) confirmedUnder() {
	if ss.sc.lease != nil {
		ss.leaseGen.Store(ss.sc.lease.Generation())
	}
}

// reclaim claims a session of a previous incarnation of this sidecar (a
// re-adoption): the stored epoch + 1, this pod as the owner, written with
// an optimistic lock and retried on a conflict after a fresh read. ok is
// false when another replica owns the session now (or it was released
// at a drain): it is not this replica's to continue.
func (s *Sidecar) reclaim(ctx context.Context, hs *v1alpha1.HCPSession) (epoch int64, ok bool, err error) {
	for attempt := 0; ; attempt++ {
		if (hs.Status.PodName != "" && hs.Status.PodName != s.pod) || released(hs) {
			return 0, false, nil
		}
		next := storedEpoch(hs) + 1
		err = s.casStatus(ctx, hs, func(st *v1alpha1.HCPSessionStatus) {
			st.OwnerEpoch = next
			st.PodName = s.pod
		})
		if err == nil {
			return next, true, nil
		}
		if !apierrors.IsConflict(err) || attempt == 4 {
			return 0, false, err
		}
		if hs, err = s.readSession(ctx, hs.Name); err != nil {
			return 0, false, err
		}
	}
}

// setupStatusWriter configures the callee's status writer. Sessions are
// selectable by state (kubectl get hcps -l hcp.io/state=RUNNING): the
// writer keeps the label in step with the state it writes, and the kstatus
// conditions derived from the state (docs/gitops.md). Its writes are
// guarded by the owner epoch the status carries: a write that finds a
// later owner's epoch stored loses the session here.
func (s *Sidecar) setupStatusWriter(w *status.Writer) {
	w.SetStateLabel(v1alpha1.LabelSessionState)
	w.SetDeriveConditions(true)
	w.SetOwnerEpochGuard(true)
	w.SetReader(s.reader)
	w.SetOnFenced(func(name string) {
		if ss := s.session(name); ss != nil {
			s.loseSession(ss, "a status write found a later owner's epoch stored")
		}
	})
}
