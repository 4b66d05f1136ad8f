package status

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// schedule queues name for writing when it is due. Called with w.mu held.
func (w *Writer) schedule(name string, e *entry) {
	if d := w.delay(e); d <= 0 {
		w.queue.Add(name)
	} else {
		w.queue.AddAfter(name, d)
	}
}

// delay is how long until e may be written; <= 0 means now. Called with
// w.mu held.
func (w *Writer) delay(e *entry) time.Duration {
	if e.written == e.version {
		// Only the label is due: at once, unless the last attempt failed.
		return e.labelRetryAt.Sub(w.clk.Now())
	}
	if e.failures > 0 {
		return e.retryAt.Sub(w.clk.Now())
	}
	if !e.force && e.lingerState != "" && e.want().State == e.lingerState {
		if d := e.lingerUntil.Sub(w.clk.Now()); d > 0 {
			return d
		}
	}
	if e.force || stateChange(e) {
		return 0
	}
	if e.lastWrite.IsZero() {
		// Never written: progress and sequences wait an interval from
		// their first change all the same, so a short session's go with
		// its end (the caller's callerAckedSequence: one write, not two).
		return e.pendingSince.Add(w.interval).Sub(w.clk.Now())
	}
	return e.lastWrite.Add(w.interval).Sub(w.clk.Now())
}

// stateChange: the desired state is not yet written. A state change is
// written at once (within the write budget): states change a few times
// per session, progress is what the interval coalesces.
func stateChange(e *entry) bool {
	st := e.want().State
	return st != "" && st != e.base.State
}

func (w *Writer) processNext() bool {
	name, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(name)

	w.mu.Lock()
	e := w.entries[name]
	if e != nil && e.held > 0 {
		// Its Hold's release schedules it again.
		w.mu.Unlock()
		return true
	}
	if e == nil || !w.pending(e) {
		if e != nil {
			// A Flush that queued name while its write was in flight is
			// satisfied: its force must not make the next progress
			// update skip the interval.
			e.force = false
		}
		w.mu.Unlock()
		return true
	}
	statusDue := e.written != e.version
	if d := w.delay(e); d > 0 {
		// Queued early (an Update while a write was in flight): wait out
		// the interval.
		w.queue.AddAfter(name, d)
		if !statusDue || !w.labelDue(e) || w.clk.Now().Before(e.labelRetryAt) {
			w.mu.Unlock()
			return true
		}
		// But a state the caller wrote itself (Seed) gets its label now.
		statusDue = false
	}
	labelKey, labelled := w.labelKey, e.label
	writes, visible := w.plan(e, statusDue)
	if !visible && !w.budget.closed() {
		// Only progress: it waits for spare budget and its pace, and then
		// carries the latest status.
		if ok, retry := w.budget.spare(writes, w.interval/4, w.interval/time.Duration(2*len(w.entries))); !ok {
			w.queue.AddAfter(name, retry)
			w.mu.Unlock()
			return true
		}
	}
	base, target, version := *e.base.DeepCopy(), *e.want().DeepCopy(), e.version
	forced := e.force
	e.force = false
	w.mu.Unlock()
	if visible {
		w.budget.await(writes)
	}
	w.mu.Lock()
	if w.entries[name] != e { // forgotten while waiting for tokens
		w.mu.Unlock()
		return true
	}
	if e.held > 0 { // held while waiting for tokens: the release schedules it
		e.force = e.force || forced
		w.mu.Unlock()
		return true
	}
	inflight := make(chan struct{})
	w.writing[name] = inflight // the queue never hands out one name twice at once
	w.mu.Unlock()

	var err, labelErr error
	if statusDue {
		err = w.write(name, base, target)
	} else {
		target = base
	}
	// The label follows the state just written (or already stored).
	labelWritten := false
	if err == nil && labelKey != "" && target.State != "" && !labelHolds(labelled, target.State) {
		labelErr = w.writeLabel(name, labelKey, target.State, w.guarded(target))
		labelWritten = labelErr == nil
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.writing, name)
	close(inflight)
	if w.entries[name] == e { // not forgotten meanwhile
		w.settle(name, e, attempt{statusDue: statusDue, version: version, target: target, err: err,
			labelKey: labelKey, labelErr: labelErr, labelWritten: labelWritten})
	}
	return true
}

// attempt is what one processNext tried and how it went.
type attempt struct {
	statusDue    bool
	version      uint64
	target       v1alpha1.HCPSessionStatus
	err          error
	labelKey     string
	labelErr     error
	labelWritten bool
}

// settle records the outcome of a write attempt of name, tells the
// waiters and schedules what is still pending. Called with w.mu held.
func (w *Writer) settle(name string, e *entry, a attempt) {
	if a.statusDue {
		e.lastWrite = w.clk.Now()
		if a.err == nil {
			e.base = a.target
			e.written = a.version
			e.failures = 0
			if e.written == e.version {
				e.desired = nil // base is all that was wanted
			}
		} else {
			e.failures++
			e.retryAt = e.lastWrite.Add(retryBackoff(e.failures))
		}
	}
	if a.labelWritten {
		e.label = a.target.State
	}
	if a.labelErr != nil && !apierrors.IsNotFound(a.labelErr) {
		e.labelRetryAt = w.clk.Now().Add(w.interval)
		w.log.Error(a.labelErr, "Failed to update the HCPSession state label; will retry", "hcpsession", klog.KRef(w.ns, name), "label", a.labelKey)
	}
	switch {
	case a.err == nil && a.labelErr == nil:
		w.notify(e, nil)
	case errors.Is(a.err, ErrFenced) || errors.Is(a.labelErr, ErrFenced):
		e.gone, e.fenced = true, true
		w.log.Info("HCPSession claimed by a later owner; dropped its status updates", "hcpsession", klog.KRef(w.ns, name), "reason", errors.Join(a.err, a.labelErr).Error())
		w.notify(e, ErrFenced)
		if f := w.onFenced; f != nil {
			go f(name)
		}
		return
	case apierrors.IsNotFound(a.err) || apierrors.IsNotFound(a.labelErr):
		e.gone = true
		w.log.Info("HCPSession is gone; dropped its status updates", "hcpsession", klog.KRef(w.ns, name))
		w.notify(e, ErrNotFound)
		return
	case a.err != nil:
		w.log.Error(a.err, "Failed to write HCPSession status; will retry", "hcpsession", klog.KRef(w.ns, name),
			"failures", e.failures, "retryIn", retryBackoff(e.failures).String())
		w.failWaiters(e, a.err)
	default:
		w.failWaiters(e, a.labelErr)
	}
	if w.pending(e) {
		w.schedule(name, e)
	}
}

// RetryBackoffMax caps the delay between attempts at a status write that
// keeps failing (an API server down): retries go on until it lands.
const RetryBackoffMax = 30 * time.Second

// retryBackoff is the delay after the n-th failure in a row: 200 ms
// doubling up to RetryBackoffMax.
func retryBackoff(n int) time.Duration {
	d := 200 * time.Millisecond
	for i := 1; i < n && d < RetryBackoffMax; i++ {
		d *= 2
	}
	return min(d, RetryBackoffMax)
}

func (w *Writer) write(name string, base, target v1alpha1.HCPSessionStatus) error {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	if epoch := w.guarded(target); epoch > 0 {
		err := w.writeGuarded(ctx, name, base, target, epoch)
		w.count(err)
		return err
	}
	meta := metav1.ObjectMeta{Name: name, Namespace: w.ns}
	from := &v1alpha1.HCPSession{ObjectMeta: meta, Status: base}
	to := &v1alpha1.HCPSession{ObjectMeta: meta, Status: target}
	err := w.c.Status().Patch(ctx, to, client.MergeFrom(from), client.FieldOwner(w.owner))
	w.count(err)
	return err
}

// writeLabel sets the state label with a metadata merge patch (a status
// write cannot change labels).
func (w *Writer) writeLabel(name, key string, state v1alpha1.SessionState, epoch int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	if epoch > 0 {
		err := w.writeLabelGuarded(ctx, name, key, state, epoch)
		w.countLabel(err)
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{key: string(state)}}})
	if err != nil {
		return err
	}
	hs := &v1alpha1.HCPSession{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns}}
	err = w.c.Patch(ctx, hs, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(w.owner))
	w.countLabel(err)
	return err
}

func (w *Writer) countLabel(err error) {
	if w.m != nil {
		result := "ok"
		if err != nil {
			result = "error"
		}
		w.m.LabelWrites.WithLabelValues(result).Inc()
	}
}

func (w *Writer) count(err error) {
	if w.m == nil {
		return
	}
	switch {
	case err == nil:
		w.m.StatusWrites.WithLabelValues("ok").Inc()
	case apierrors.IsConflict(err):
		w.m.StatusWrites.WithLabelValues("conflict").Inc()
	default:
		w.m.StatusWrites.WithLabelValues("error").Inc()
	}
}
