package status

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// Seed tells the writer what the stored status of name is (read from the
// API server, or just written by the caller itself), so later patches are
// computed against it. writtenAt, when not zero, counts as a write for the
// interval.
func (w *Writer) Seed(name string, st v1alpha1.HCPSessionStatus, writtenAt time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entryLocked(name)
	e.base = *st.DeepCopy()
	e.desired = nil
	e.version++
	e.written = e.version
	e.gone, e.fenced = false, false
	if !writtenAt.IsZero() {
		e.lastWrite = writtenAt
	}
	w.notify(e, nil)
	if w.labelDue(e) {
		// The caller wrote a new state itself; the label follows.
		w.schedule(name, e)
	}
}

// SeedLabel tells the writer the state label name's object already
// carries (set when it was created, or with a terminal record), so writing
// that state does not write the label again; a terminal one is never
// written over.
func (w *Writer) SeedLabel(name string, st v1alpha1.SessionState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entryLocked(name)
	e.label = st
}

// Update applies mutate to the desired status of name and schedules a write:
// at once when the state changes or the session's last write is at least
// one interval old, otherwise when the interval has passed. mutate runs
// under the writer's lock and must not call the writer. A session this writer
// has not seen starts from an empty status, so mutate should set absolute
// values (the patch carries only what differs from what this writer wrote
// before).
func (w *Writer) Update(name string, mutate func(*v1alpha1.HCPSessionStatus)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entryLocked(name)
	if e.gone {
		return
	}
	if e.desired == nil {
		e.desired = e.base.DeepCopy()
	}
	mutate(e.desired)
	if w.derive {
		SetConditions(e.desired, w.clk.Now())
	}
	if e.written == e.version {
		e.pendingSince = w.clk.Now()
	}
	e.version++
	if equality.Semantic.DeepEqual(&e.base, e.desired) {
		// Back to what is stored: nothing to write.
		e.written = e.version
		e.desired = nil
		w.notify(e, nil)
		if !w.labelDue(e) {
			return
		}
	}
	w.schedule(name, e)
}

// UpdateAfter is Update for a state that need not show at once: its write
// waits until linger has passed, unless a later Update changes the state
// first (then one write carries both, at once) or a Flush asks for it.
// The callee sidecar sets RUNNING this way when the HCPSession's creation
// already recorded the admission (annotation and label): a short session's
// RUNNING and terminal status go in one write instead of two.
func (w *Writer) UpdateAfter(name string, linger time.Duration, mutate func(*v1alpha1.HCPSessionStatus)) {
	w.Update(name, func(st *v1alpha1.HCPSessionStatus) {
		mutate(st)
		e := w.entries[name] // Update holds w.mu, and name's entry
		e.lingerState, e.lingerUntil = st.State, w.clk.Now().Add(linger)
	})
}

// Flush writes the pending status of name now, ignoring the interval, and
// waits for the write. It returns nil at once when nothing is pending, and
// ErrNotFound when the object is gone.
func (w *Writer) Flush(ctx context.Context, name string) error {
	w.mu.Lock()
	e := w.entries[name]
	if e == nil || (e.written == e.version && !w.labelDue(e)) {
		w.mu.Unlock()
		return nil
	}
	if e.gone {
		w.mu.Unlock()
		if e.fenced {
			return ErrFenced
		}
		return ErrNotFound
	}
	ch := make(chan error, 1)
	e.waiters = append(e.waiters, waiter{version: e.version, ch: ch})
	e.force = true
	e.labelRetryAt = time.Time{}
	w.mu.Unlock()
	w.queue.Add(name)
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// FlushAll flushes every session with pending changes.
func (w *Writer) FlushAll(ctx context.Context) error {
	w.mu.Lock()
	var names []string
	for n, e := range w.entries {
		if w.pending(e) {
			names = append(names, n)
		}
	}
	w.mu.Unlock()
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for _, n := range names {
		wg.Go(func() {
			if err := w.Flush(ctx, n); err != nil && !errors.Is(err, ErrNotFound) {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", n, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Forget drops what the writer knows of name (the session ended here or the
// object is gone). Pending changes are discarded. It returns once no write
// of name is in flight, so a write the caller makes next (a release at a
// drain) is not overwritten by a patch the writer sent before: patches
// carry no resourceVersion.
func (w *Writer) Forget(name string) {
	w.mu.Lock()
	if e := w.entries[name]; e != nil {
		w.notify(e, errors.New("status: forgotten"))
		delete(w.entries, name)
	}
	inflight := w.writing[name]
	w.mu.Unlock()
	if inflight != nil {
		<-inflight // bounded by the write's timeout
	}
}

// Hold waits until no write of name is in flight and keeps new ones from
// starting until release is called: for a write the caller makes itself
// that one of the writer's must not cross (the callee sidecar's terminal
// record sets the final state label, which a label write of an earlier
// state in flight would otherwise put back). Updates and Flushes go on;
// their writes wait for the release.
func (w *Writer) Hold(name string) (release func()) {
	w.mu.Lock()
	e := w.entryLocked(name)
	e.held++
	inflight := w.writing[name]
	w.mu.Unlock()
	if inflight != nil {
		<-inflight // bounded by the write's timeout
	}
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		e.held--
		if e.held == 0 && w.entries[name] == e && w.pending(e) {
			w.schedule(name, e)
		}
	}
}

// Pending reports whether name has changes not yet written (the state
// label included).
func (w *Writer) Pending(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entries[name]
	return e != nil && w.pending(e)
}

// StoredEpoch returns the owner epoch of the status this writer last
// wrote for name, or was seeded with; ok is false when it knows nothing of
// name.
func (w *Writer) StoredEpoch(name string) (epoch int64, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entries[name]
	if e == nil {
		return 0, false
	}
	return e.base.OwnerEpoch, true
}

// Status returns the desired (latest) status of name as the writer knows it.
func (w *Writer) Status(name string) (v1alpha1.HCPSessionStatus, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entries[name]
	if e == nil {
		return v1alpha1.HCPSessionStatus{}, false
	}
	return *e.want().DeepCopy(), true
}

// pending: e has a status change or a label update to write. Called with
// w.mu held.
func (w *Writer) pending(e *entry) bool {
	return !e.gone && (e.written != e.version || w.labelDue(e))
}

// labelDue: the state label lags the written state. Called with w.mu held.
func (w *Writer) labelDue(e *entry) bool {
	return w.labelKey != "" && !e.gone && e.base.State != "" && !labelHolds(e.label, e.base.State)
}

// labelHolds: a label carrying label needs no write for state: the same
// state, or a terminal one, which a session never leaves (the callee
// sidecar sets it with the session's terminal record, a moment before the
// status shows it: SeedLabel).
func labelHolds(label, state v1alpha1.SessionState) bool {
	return label == state || label.IsTerminal()
}

// notify completes the waiters whose version is written, state label
// included (or all, with a non-nil err). Called with w.mu held.
func (w *Writer) notify(e *entry, err error) {
	kept := e.waiters[:0]
	labelDue := w.labelDue(e)
	for _, wt := range e.waiters {
		if err != nil || (wt.version <= e.written && !labelDue) {
			wt.ch <- err
			continue
		}
		kept = append(kept, wt)
	}
	e.waiters = kept
}

// failWaiters fails the pending Flushes after a failed write; the write is
// retried regardless. Called with w.mu held.
func (w *Writer) failWaiters(e *entry, err error) {
	for _, wt := range e.waiters {
		wt.ch <- err
	}
	e.waiters = nil
}
