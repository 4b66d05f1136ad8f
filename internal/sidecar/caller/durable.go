package caller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// This file holds what makes a session's position survive the caller pod:
// reading HCPSessions (lookups, the seed of a session a new pod has no
// record of, tasks submitted by an earlier pod) and writing
// status.callerAckedSequence exactly at Drain and at a graceful stop. See
// the package documentation, "Durable state and which copy is
// authoritative".

// ReasonForeignSession counts deliveries of a session whose HCPSession names
// another caller: this caller's queue should never carry them.
const ReasonForeignSession = "foreign_session"

// ReasonUnsolicitedSession counts deliveries of a session this caller never
// submitted: no task of its store, and no HCPSession in its namespace
// naming it. A callee, or anyone who may publish to hcp.events, cannot
// inject a session into the app.
const ReasonUnsolicitedSession = "unsolicited_session"

// lookupRetry is how long a missing HCPSession is not looked up again.
const lookupRetry = 10 * time.Second

// lookupTimeout bounds one HCPSession read.
const lookupTimeout = 5 * time.Second

// lookup is what an HCPSession read said about a session.
type lookup struct {
	// found: an HCPSession of this caller is in the sidecar's namespace.
	found bool
	// foreign: the HCPSession names another caller.
	foreign  bool
	calleeID string
	at       time.Time
	// err is a read failure that says nothing (never cached).
	err error
}

// errAbsent says that the API server has no HCPSession of that name in
// the sidecar's namespace, or that the sidecar may not read it (its callee
// runs in another namespace): definitive, unlike a read failure.
var errAbsent = errors.New("no readable HCPSession in the sidecar's namespace")

// readHCPSession reads the HCPSession sid. fresh prefers the uncached
// Reader (a position must not come from a cache that has not seen the last
// write yet) and falls back to the cache only if the API server cannot be
// reached: a cached callerAckedSequence is older, so lower, never higher
// than the stored one, which is safe to resume from. Otherwise the cache is
// asked first and a miss is checked through the Reader (a new HCPSession may
// not be in the cache yet). It returns errAbsent when the session is
// definitely not readable here.
func (s *Sidecar) readHCPSession(ctx context.Context, sid string, fresh bool) (*v1alpha1.HCPSession, error) {
	key := types.NamespacedName{Namespace: s.cfg.Namespace, Name: sid}
	var readers []client.Reader
	authoritative := map[int]bool{}
	add := func(r client.Reader, auth bool) {
		if r != nil {
			authoritative[len(readers)] = auth
			readers = append(readers, r)
		}
	}
	if fresh {
		add(s.o.Reader, true)
		add(s.o.Client, s.o.Reader == nil)
	} else {
		add(s.o.Client, s.o.Reader == nil)
		add(s.o.Reader, true)
	}
	if len(readers) == 0 {
		return nil, errAbsent
	}
	var failure error
	for i, r := range readers {
		var hs v1alpha1.HCPSession
		err := r.Get(ctx, key, &hs)
		switch {
		case err == nil:
			return &hs, nil
		case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
			if authoritative[i] {
				return nil, fmt.Errorf("%w (%s)", errAbsent, apierrors.ReasonForError(err))
			}
			// A cache miss: the API server decides (next reader), or, if it
			// could not be reached, nothing is known.
		default:
			failure = errors.Join(failure, err)
		}
	}
	if failure == nil {
		return nil, errAbsent
	}
	return nil, failure
}

// lookupSession reads the HCPSession named sid in the sidecar's namespace
// (a hit is kept; a miss is re-checked after lookupRetry, or at once with
// fresh). A read failure is returned in lookup.err and not kept.
func (s *Sidecar) lookupSession(sid string, fresh bool) lookup {
	s.mu.Lock()
	l, ok := s.lookups[sid]
	if ok && fresh && !l.found && !l.foreign {
		delete(s.lookups, sid)
		ok = false
	}
	s.mu.Unlock()
	if ok && (l.found || l.foreign || s.clk.Since(l.at) < lookupRetry) {
		return l
	}
	if s.o.Client == nil && s.o.Reader == nil {
		return lookup{}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx()), lookupTimeout)
	defer cancel()
	hs, err := s.readHCPSession(ctx, sid, false)
	switch {
	case err == nil:
		l = s.lookupOf(hs)
	case errors.Is(err, errAbsent):
		l = lookup{at: s.clk.Now()}
		s.elsewhere.Do(func() {
			s.log.Info("An HCPSession is not readable in this namespace (its callee runs in another namespace, or RBAC does not allow it); for such sessions callerAckedSequence is not recorded and positions are durable in the local store only",
				"namespace", s.cfg.Namespace, "session", sid, "reason", err.Error())
		})
		s.log.V(1).Info("No readable HCPSession for this session in the sidecar's namespace; callerAckedSequence is not recorded",
			"session", sid, "namespace", s.cfg.Namespace, "reason", err.Error())
	default:
		s.log.Error(err, "Failed to read the HCPSession", "session", sid)
		return lookup{err: err}
	}
	s.mu.Lock()
	s.lookups[sid] = l
	s.mu.Unlock()
	return l
}

// lookupOf turns a read HCPSession into a lookup (and remembers it).
func (s *Sidecar) lookupOf(hs *v1alpha1.HCPSession) lookup {
	l := lookup{found: hs.Spec.CallerID == s.cfg.ID, foreign: hs.Spec.CallerID != s.cfg.ID, calleeID: hs.Spec.CalleeID, at: s.clk.Now()}
	s.mu.Lock()
	s.lookups[hs.Name] = l
	s.mu.Unlock()
	return l
}

// recordAcked records callerAckedSequence through the coalescing status
// writer, when the HCPSession is this caller's and in this namespace (or no
// client is given to check). It reports false when it could not: the
// session's worker keeps the sequence and calls again (on its next ack or
// tick, and with fresh set at the session's terminal message, at stop and
// before it exits idle), so the last value is not lost to a miss cached
// while the cache had not yet seen a new HCPSession. fresh drops a cached
// miss first. A value that could not be recorded for want of an answer from
// the API server is kept for flushPositions.
func (s *Sidecar) recordAcked(sid string, seq int64, fresh bool) bool {
	if s.o.Status == nil {
		return true
	}
	if s.o.Client != nil || s.o.Reader != nil {
		l := s.lookupSession(sid, fresh)
		if l.err != nil {
			s.notePosition(sid, seq)
		}
		if !l.found {
			return false
		}
	}
	s.o.Status.Update(sid, func(st *v1alpha1.HCPSessionStatus) {
		if seq > st.CallerAckedSequence {
			st.CallerAckedSequence = seq
		}
	})
	s.notePosition(sid, seq)
	return true
}

// notePosition remembers seq as a position to make sure of at stop.
func (s *Sidecar) notePosition(sid string, seq int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq > s.positions[sid] {
		s.positions[sid] = seq
	} else if _, ok := s.positions[sid]; !ok {
		s.positions[sid] = seq
	}
}

// statusFlusher is implemented by *status.Writer.
type statusFlusher interface {
	Flush(ctx context.Context, name string) error
}

// flushStatus writes sid's pending status now rather than after the
// interval (a session's terminal message), without waiting for it.
func (s *Sidecar) flushStatus(sid string) {
	f, ok := s.o.Status.(statusFlusher)
	if !ok {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.Flush(ctx, sid); err != nil {
			s.log.V(1).Info("Failed to flush callerAckedSequence; the status writer retries", "session", sid, "error", err.Error())
		}
	}()
}

// writePosition makes sure the HCPSession sid stores callerAckedSequence
// seq (or more): recorded through the status writer and flushed. nil also
// means that nothing can be written (no HCPSession of this caller here, or
// it is gone).
func (s *Sidecar) writePosition(ctx context.Context, sid string, seq int64) error {
	if s.o.Status == nil {
		return nil
	}
	if s.o.Client != nil || s.o.Reader != nil {
		l := s.lookupSession(sid, true)
		if l.err != nil {
			return l.err
		}
		if !l.found {
			return nil
		}
	}
	s.o.Status.Update(sid, func(st *v1alpha1.HCPSessionStatus) {
		if seq > st.CallerAckedSequence {
			st.CallerAckedSequence = seq
		}
	})
	f, ok := s.o.Status.(statusFlusher)
	if !ok {
		return nil
	}
	if err := f.Flush(ctx, sid); err != nil && !errors.Is(err, status.ErrNotFound) {
		return err
	}
	return nil
}

// flushPositions writes every position noted (see notePosition) and waits
// for the writes, retrying failures with exponential backoff until all
// landed or ctx ends.
func (s *Sidecar) flushPositions(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		s.mu.Lock()
		pending := make(map[string]int64, len(s.positions))
		for sid, seq := range s.positions {
			pending[sid] = seq
		}
		s.mu.Unlock()
		var (
			mu   sync.Mutex
			errs []error
			wg   sync.WaitGroup
			sem  = make(chan struct{}, 8)
		)
		for sid, seq := range pending {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				if err := s.writePosition(ctx, sid, seq); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("session %s: %w", sid, err))
					mu.Unlock()
					return
				}
				s.mu.Lock()
				if s.positions[sid] == seq {
					delete(s.positions, sid)
				}
				s.mu.Unlock()
			})
		}
		wg.Wait()
		if len(errs) == 0 {
			if len(pending) > 0 {
				s.log.Info("Recorded every session's position in its HCPSession", "sessions", len(pending), "attempts", attempt)
			}
			return nil
		}
		err := errors.Join(errs...)
		s.log.Info("Failed to record some sessions' callerAckedSequence; retrying", "failed", len(errs), "attempt", attempt,
			"retryIn", backoff.String(), "error", err.Error())
		timer := s.clk.NewTimer(backoff)
		select {
		case <-timer.C():
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("callerAckedSequence of %d sessions not recorded: %w", len(errs), err)
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// Drain prepares the pod's deletion (the preStop hook calls it before the
// app gets SIGTERM): the sidecar stops handing deliveries to its session
// workers, which finish what they hold (up to DrainTimeout: the app request
// in progress and the deliveries already received), fsync the store and ack
// what was delivered; then every session's position is written to its
// HCPSession's status.callerAckedSequence (retried with backoff until it
// lands or ctx ends), and only then is the consumer stopped, without
// basic.cancel: its channel closes and the broker hands what is unsettled,
// at the head of the queue and in order, to the next consumer, which
// resumes each session from that exact position. Drain returns an error if
// a position could not be written before ctx ended (the consumer is stopped
// regardless). It is idempotent; Run keeps republishing submits until its
// own ctx ends and then returns as usual.
func (s *Sidecar) Drain(ctx context.Context) error {
	s.log.Info("Draining: no more deliveries to the app; recording every session's position")
	start := s.clk.Now()
	err := s.stop(ctx)
	if err != nil {
		return fmt.Errorf("caller sidecar drain: %w", err)
	}
	s.log.Info("Drained", "took", s.clk.Since(start).Round(time.Millisecond).String())
	return nil
}

// stop is the shutdown sequence of Drain and of Run's graceful end; each
// step is idempotent.
func (s *Sidecar) stop(ctx context.Context) error {
	s.mu.Lock()
	if !s.stopping {
		s.stopping = true
		close(s.stopCh)
	}
	stopConsume := s.stopConsume
	s.mu.Unlock()
	// Once stopping is set no worker is added, so Wait is safe.
	workersDone := make(chan struct{})
	go func() {
		s.workers.Wait()
		close(workersDone)
	}()
	var err error
	select {
	case <-workersDone:
		err = s.flushPositions(ctx)
	case <-ctx.Done():
		err = fmt.Errorf("session workers did not finish: %w", ctx.Err())
	}
	// The channel closes (and a standby consumer takes over) only now.
	if stopConsume != nil {
		stopConsume()
	}
	return err
}

// seed gives a session without a local record (a new pod, or a lost state
// directory) its starting point from its HCPSession, before anything of it
// is delivered: last_processed_sequence from status.callerAckedSequence, the
// callee and task from spec, and the task record (adoptTask). A session
// whose HCPSession names another caller is refused (ReasonForeignSession),
// and so is one with no HCPSession in this namespace
// (ReasonUnsolicitedSession): nothing shows this caller submitted it. While the API server cannot be
// reached the seed is retried for up to SeedTimeout; then the session is
// delivered from scratch (a warning: events the previous pod delivered and
// that come again are then delivered again). seed returns false if the
// sidecar stopped meanwhile.
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
	deadline := s.clk.Now().Add(s.o.SeedTimeout)
	backoff := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx()), lookupTimeout)
		hs, err := s.readHCPSession(ctx, w.id, true)
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
			w.log.Info("WARNING: refusing a session this caller never submitted (no task of its store, no HCPSession in its namespace naming it)")
			return true
		case !s.clk.Now().Before(deadline):
			w.log.Info("WARNING: the HCPSession of a session this pod has no record of could not be read; delivering it from its first event received (copies of events an earlier pod delivered are delivered again)",
				"waited", s.o.SeedTimeout.String(), "error", err.Error())
			return true
		}
		w.log.Info("Cannot read the HCPSession of a session this pod has no record of; its deliveries wait", "retryIn", backoff.String(), "error", err.Error())
		timer := s.clk.NewTimer(backoff)
		select {
		case <-timer.C():
		case <-s.stopCh:
			timer.Stop()
			return false
		}
		backoff = min(2*backoff, 2*time.Second)
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
// the API server does not answer at once.
func (w *stream) refresh(rec SessionRecord) {
	s := w.s
	if rec.over() || s.o.Client == nil && s.o.Reader == nil {
		return
	}
	s.mu.Lock()
	l, known := s.lookups[w.id]
	s.mu.Unlock()
	if known && !l.found {
		return // not here, or not this caller's
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx()), refreshTimeout)
	hs, err := s.readHCPSession(ctx, w.id, true)
	cancel()
	switch {
	case errors.Is(err, errAbsent):
		s.mu.Lock()
		s.lookups[w.id] = lookup{at: s.clk.Now()}
		s.mu.Unlock()
		return
	case err != nil:
		w.log.V(1).Info("Could not read the HCPSession; resuming from the local record", "lastProcessed", rec.LastSeq, "error", err.Error())
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
		w.log.Error(err, "Failed to persist the position read from the HCPSession")
	}
	w.log.Info("Another pod of this caller delivered this session beyond this pod's record; resuming from its HCPSession",
		"localLastProcessed", rec.LastSeq, "lastProcessed", seq)
}

// adopt applies a session's HCPSession to the new worker (see seed).
func (w *stream) adopt(hs *v1alpha1.HCPSession) {
	s := w.s
	l := s.lookupOf(hs)
	if l.foreign {
		w.refused = ReasonForeignSession
		w.log.Info("WARNING: the HCPSession of this session names another caller; refusing its messages", "caller", hs.Spec.CallerID, "callee", hs.Spec.CalleeID)
		return
	}
	tid := strings.ToLower(hs.Spec.TaskMessageID)
	if _, err := s.adoptTask(hs); err != nil {
		w.log.Error(err, "Failed to record the task of a session learnt from its HCPSession", "task", tid)
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
		w.log.Error(err, "Failed to persist the position read from the HCPSession")
	}
	w.maxSeen = max(w.maxSeen, seq)
	w.callee, w.unverified = hs.Spec.CalleeID, false
	w.taskMessageID, w.capability = tid, hs.Spec.Capability
	w.acked.Store(seq)
	w.reported = seq
	w.log.Info("Resuming a session this pod has no record of from its HCPSession", "lastProcessed", seq,
		"callee", hs.Spec.CalleeID, "task", tid, "hcpState", string(hs.Status.State))
}

// adoptTask records the task of an HCPSession of this caller that the
// store does not know (submitted by an earlier pod), so that its answer is
// recognised as this caller's and the GET endpoints show it. Its state is
// the HCPSession's decision; an adopted task is never republished.
func (s *Sidecar) adoptTask(hs *v1alpha1.HCPSession) (TaskRecord, error) {
	tid := strings.ToLower(hs.Spec.TaskMessageID)
	st := TaskAccepted
	switch hs.DecidedState() {
	case "", v1alpha1.SessionPending:
		st = TaskPending
	case v1alpha1.SessionRejected:
		st = TaskRejected
	}
	created := false
	rec, err := s.store.UpdateTask(tid, func(t *TaskRecord) bool {
		if t.CalleeID != "" {
			return false // known: this store's record stands
		}
		created = true
		*t = TaskRecord{MessageID: tid, CalleeID: hs.Spec.CalleeID, Capability: hs.Spec.Capability, State: st,
			SessionID: hs.Name, SubmittedAt: hs.CreationTimestamp.Time, RiskLevel: string(hs.Spec.RiskLevel), Adopted: true}
		if st.answered() {
			t.AnsweredAt = hs.CreationTimestamp.Time
		}
		if st == TaskRejected && hs.Status.Error != nil {
			t.ReasonCode, t.ReasonMessage = hs.Status.Error.Code, hs.Status.Error.Message
		}
		return true
	})
	if created {
		if st.answered() {
			s.markAnswered(tid)
		}
		s.log.Info("Adopted a task submitted by an earlier pod of this caller, from its HCPSession", "task", tid,
			"callee", hs.Spec.CalleeID, "state", st)
	}
	return rec, err
}

// adoptTaskByID finds the HCPSession of task id (submitted by an earlier
// pod of this caller) and adopts the task. With calleeID the session's name
// is known and only the cache is asked (a submit); without it, HCPSessions
// of this caller are listed, cache first.
func (s *Sidecar) adoptTaskByID(ctx context.Context, id, calleeID string) (TaskRecord, bool) {
	if s.o.Client == nil && s.o.Reader == nil {
		return TaskRecord{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	var found *v1alpha1.HCPSession
	if calleeID != "" {
		if s.o.Client == nil {
			return TaskRecord{}, false
		}
		// Sessions decided by callees of earlier releases carry the legacy id.
		for _, name := range []string{topology.SessionID(calleeID, s.cfg.ID, id), topology.LegacySessionID(calleeID, id)} {
			var hs v1alpha1.HCPSession
			if err := s.o.Client.Get(ctx, types.NamespacedName{Namespace: s.cfg.Namespace, Name: name}, &hs); err == nil && hs.Spec.CallerID == s.cfg.ID {
				found = &hs
				break
			}
		}
		if found == nil {
			return TaskRecord{}, false
		}
	} else {
		for _, r := range []client.Reader{s.o.Client, s.o.Reader} {
			if r == nil {
				continue
			}
			var list v1alpha1.HCPSessionList
			if err := r.List(ctx, &list, client.InNamespace(s.cfg.Namespace), client.MatchingLabels{v1alpha1.LabelCallerID: s.cfg.ID}); err != nil {
				continue
			}
			for i := range list.Items {
				if strings.EqualFold(list.Items[i].Spec.TaskMessageID, id) {
					found = &list.Items[i]
					break
				}
			}
			if found != nil {
				break
			}
		}
	}
	if found == nil || found.Spec.CallerID != s.cfg.ID || !strings.EqualFold(found.Spec.TaskMessageID, id) {
		return TaskRecord{}, false
	}
	rec, err := s.adoptTask(found)
	if err != nil {
		s.log.Error(err, "Failed to record an adopted task", "task", id)
	}
	return rec, rec.CalleeID != ""
}
