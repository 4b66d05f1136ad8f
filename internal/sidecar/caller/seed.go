package caller

import (
	"context"
	"errors"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// ReasonForeignSession counts deliveries of a session whose HCPSession names
// another caller: this caller's queue should never carry them.
const ReasonForeignSession = "foreign_session"

// ReasonUnsolicitedSession counts deliveries of a session this caller never
// submitted: no task of its store, and no HCPSession in its namespace
// naming it. A callee, or anyone who may publish to hcp.events, cannot
// inject a session into the app.
const ReasonUnsolicitedSession = "unsolicited_session"

// seed gives a session without a local record (a new pod, or a lost state
// directory) its starting point from its HCPSession, before anything of it
// is delivered: last_processed_sequence from status.callerAckedSequence, the
// callee and task from spec, and the task record (adoptTask). The
// HCPSession is looked up in this namespace, then, if it is not there, in
// the namespaces the operator lets the sidecar read (a Callee in another
// namespace keeps its sessions there: findElsewhere). A session whose
// HCPSession names another caller is refused (ReasonForeignSession), and
// so is one whose HCPSession every one of those namespaces answers it does
// not have (ReasonUnsolicitedSession): nothing shows this caller submitted
// it.
//
// A session that cannot be verified (the API server cannot be reached, or
// refuses a read: a grant the operator has not applied yet) is held, never
// delivered unverified and never dropped: its deliveries stay unacked in
// the worker (past its share of the prefetch window they go back to the
// queue, as for a failing app: the session is marked stalled) and the read
// is retried with backoff, however long the outage lasts; SeedTimeout only
// logs a warning. seed returns false if the
// sidecar stopped meanwhile (what the worker holds stays unsettled).
func (w *stream) seed() bool {
	s := w.s
	if rec, ok := s.store.Session(w.id); ok {
		w.refresh(rec)
		return true
	}
	if _, ok := s.store.TaskForSession(w.id); ok {
		// Submitted through this store, which has no session record: nothing
		// of it was delivered yet.
		return true
	}
	if s.o.Client == nil && s.o.Reader == nil {
		return true
	}
	start := s.clk.Now()
	warned := false
	defer w.setStalled(false)
	backoff := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx()), lookupTimeout)
		hs, err := s.findHCPSession(ctx, w.id, true)
		cancel()
		switch {
		case err == nil:
			w.adopt(hs)
			return true
		case errors.Is(err, errAbsent):
			s.mu.Lock()
			s.lookups[w.id] = lookup{at: s.clk.Now()}
			s.mu.Unlock()
			w.refused = ReasonUnsolicitedSession
			w.log().Info("WARNING: refusing a session this caller never submitted (no task of its store, no HCPSession of it in this namespace nor in the Caller's status.sessionNamespaces)",
				"reason", err.Error())
			return true
		case !warned && s.clk.Since(start) >= s.o.SeedTimeout:
			warned = true
			w.log().Info("WARNING: the HCPSession of a session this pod has no record of still cannot be read; the session stays held (nothing of it is delivered or acked) until it can",
				"waited", s.clk.Since(start).String(), "error", err.Error())
		}
		// Held: past its share of the prefetch window, further deliveries
		// of the session go back to the queue (Sidecar.mustRelease).
		w.setStalled(true)
		w.log().Info("Cannot read the HCPSession of a session this pod has no record of; its deliveries wait", "retryIn", backoff.String(), "error", err.Error())
		timer := s.clk.NewTimer(backoff)
		select {
		case <-timer.C():
		case <-s.stopCh:
			timer.Stop()
			return false
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// refreshTimeout bounds the best-effort HCPSession read of refresh.
const refreshTimeout = 2 * time.Second

// refresh raises the local record of a session to its HCPSession's
// callerAckedSequence when that is higher. Both are positions the app has
// processed (lower bounds of its true position), so the higher one is the
// better starting point; the HCPSession's can only be higher when another
// pod of this caller delivered the session meanwhile: with several replicas
// the queue's single active consumer moves between live pods when a
// connection drops. Best effort: one read, and the local record stands if
// the API server does not answer at once. A worker that follows an idle
// one of this pod on the same channel reads nothing (parkedWorker).
func (w *stream) refresh(rec SessionRecord) {
	s := w.s
	if rec.over() || s.o.Client == nil && s.o.Reader == nil {
		return
	}
	s.mu.Lock()
	p, parked := s.unparkLocked(w.id)
	l, known := s.lookups[w.id]
	s.mu.Unlock()
	if parked {
		w.reported, w.unreported = p.reported, p.unreported
		w.acked.Store(max(p.acked, rec.LastSeq))
		return
	}
	if known && !l.found {
		return // not here, or not this caller's
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx()), refreshTimeout)
	hs, err := s.findHCPSession(ctx, w.id, true)
	cancel()
	switch {
	case errors.Is(err, errAbsent) || apierrors.IsForbidden(err):
		s.mu.Lock()
		s.lookups[w.id] = lookup{at: s.clk.Now()}
		s.mu.Unlock()
		return
	case err != nil:
		w.log().V(1).Info("Could not read the HCPSession; resuming from the local record", "lastProcessed", rec.LastSeq, "error", err.Error())
		return
	}
	if s.lookupOf(hs).foreign {
		return
	}
	seq := hs.Status.CallerAckedSequence
	// What the HCPSession lacks (a write the previous process did not get
	// to make) is written with the next report.
	w.reported = seq
	w.acked.Store(max(seq, rec.LastSeq))
	if seq <= rec.LastSeq {
		return
	}
	if _, err := s.store.UpdateSession(w.id, func(r *SessionRecord) bool {
		if r.LastSeq >= seq {
			return false
		}
		r.LastSeq, r.UpdatedAt = seq, s.clk.Now()
		return true
	}); err != nil {
		w.log().Error(err, "Failed to persist the position read from the HCPSession")
	}
	w.log().Info("Another pod of this caller delivered this session beyond this pod's record; resuming from its HCPSession",
		"localLastProcessed", rec.LastSeq, "lastProcessed", seq)
}

// adopt applies a session's HCPSession to the new worker (see seed).
func (w *stream) adopt(hs *v1alpha1.HCPSession) {
	s := w.s
	// In the callee's namespace (findElsewhere), the position is recorded
	// there through Options.StatusIn.
	l := s.lookupOf(hs)
	if l.foreign {
		w.refused = ReasonForeignSession
		w.log().Info("WARNING: the HCPSession of this session names another caller; refusing its messages", "caller", hs.Spec.CallerID, "callee", hs.Spec.CalleeID)
		return
	}
	tid := strings.ToLower(hs.Spec.TaskMessageID)
	if _, err := s.adoptTask(hs); err != nil {
		w.log().Error(err, "Failed to record the task of a session learnt from its HCPSession", "task", tid)
	}
	seq := hs.Status.CallerAckedSequence
	now := s.clk.Now()
	if _, err := s.store.UpdateSession(w.id, func(r *SessionRecord) bool {
		r.CalleeID, r.TaskMessageID, r.Capability = hs.Spec.CalleeID, tid, hs.Spec.Capability
		r.RiskLevel = string(hs.Spec.RiskLevel)
		r.LastSeq = max(r.LastSeq, seq)
		r.UpdatedAt = now
		return true
	}); err != nil {
		// The in-memory record holds it: this run still resumes from it.
		w.log().Error(err, "Failed to persist the position read from the HCPSession")
	}
	w.maxSeen = max(w.maxSeen, seq)
	w.callee, w.unverified = hs.Spec.CalleeID, false
	w.taskMessageID, w.capability = tid, hs.Spec.Capability
	w.acked.Store(seq)
	w.reported = seq
	w.log().Info("Resuming a session this pod has no record of from its HCPSession", "lastProcessed", seq,
		"callee", hs.Spec.CalleeID, "task", tid, "hcpState", string(hs.Status.State))
}

// parkedWorker is what a session's worker that exited idle (tryExit) leaves
// for the session's next worker: its positions, valid while the consumer
// channel it delivered from lives (Sidecar.parkedOn). The broker moves a
// queue's single active consumer to another pod only when the active one's
// channel goes, so while that channel lives no other pod has delivered the
// session, and the next worker resumes from the local record without
// reading the HCPSession (refresh).
type parkedWorker struct {
	acked, reported int64
	unreported      bool
}

// park records w's positions for its session's next worker (s.mu held). A
// worker of another channel than the parked ones' starts the map anew:
// theirs are stale.
func (w *stream) park() {
	s, ch := w.s, w.lastDctx
	if ch == nil || ch.Err() != nil || w.refused != "" {
		return
	}
	if s.parkedOn != ch {
		s.parked, s.parkedOn = map[string]parkedWorker{}, ch
	}
	s.parked[w.id] = parkedWorker{acked: w.acked.Load(), reported: w.reported, unreported: w.unreported}
}

// unparkLocked takes what the session's previous worker parked, if its
// channel still lives (s.mu held).
func (s *Sidecar) unparkLocked(sid string) (parkedWorker, bool) {
	p, ok := s.parked[sid]
	if !ok {
		return p, false
	}
	delete(s.parked, sid)
	return p, s.parkedOn.Err() == nil
}
