// Package status writes HCPSession status for the hcp-sidecar, in both
// modes: the callee sidecar records the session's state, progress and
// sequence numbers; the caller sidecar records callerAckedSequence.
//
// Writes are coalesced per session: whatever the event rate, a session's
// status is written at most once per interval (latest state wins; a
// session's first write too waits an interval from its first change), a
// state change is written at once (UpdateAfter holds one back briefly, to
// share a write with the next), and nothing is written when nothing
// changed.
// All writes of a Writer share a budget (SetBudget): state changes go
// first, progress is coalesced further when the budget is short. Each write is a JSON merge patch of the status subresource holding
// only the fields that differ from what this writer last wrote, under the
// field manager "hcp-sidecar". Merge patches rather than server-side apply:
// both sidecars share the field manager name, and an apply from the caller
// sidecar (which owns only callerAckedSequence) would remove every field the
// callee sidecar applied under the same manager. A diff-based merge patch
// touches exactly the fields its writer changed, so the two sidecars never
// clobber each other, and it needs no read before writing.
//
// With SetStateLabel (the callee sidecar), the writer also keeps a label
// (hcp.io/state) equal to status.state, so that sessions can be selected by
// state: a label is metadata, which a status write cannot change, so each
// write that changes the state is followed by one metadata merge patch of
// that label. State changes coalesced within an interval cost one label
// write at most; writes that do not change the state cost none.
//
// With SetDeriveConditions (the callee sidecar), every Update also derives
// the kstatus conditions Ready, Reconciling and Stalled from the state
// (SetConditions), so they travel in the same write as the state.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
)

// FieldOwner is the field manager of every sidecar write.
const FieldOwner = "hcp-sidecar"

// DefaultInterval is the default minimum time between two status writes of
// one session (Callee spec.sessions.statusUpdateInterval defaults to PT1S).
const DefaultInterval = time.Second

// DefaultWorkers is the default number of concurrent writes (of different
// sessions; one session is never written concurrently).
const DefaultWorkers = 4

// DefaultWritesPerSecond and DefaultWriteBurst are the default API write
// budget of one Writer (Callee spec.sessions.statusWritesPerSecond): the
// status and label writes of all its sessions together, a token bucket.
const (
	DefaultWritesPerSecond = 50
	DefaultWriteBurst      = 2 * DefaultWritesPerSecond
)

// ErrNotFound is returned by Flush when the HCPSession no longer exists.
var ErrNotFound = errors.New("status: HCPSession not found")

// Options configure a Writer.
type Options struct {
	// Client writes the status subresource. Required.
	Client client.Client
	// Namespace of the HCPSessions. Required.
	Namespace string
	// Interval is the minimum time between two writes of one session;
	// <= 0 means DefaultInterval.
	Interval time.Duration
	// Clock is injected for tests; nil means the real clock.
	Clock clock.WithTicker
	// Metrics count writes (StatusWrites by result); optional.
	Metrics *metrics.Metrics
	// Log receives write failures.
	Log logr.Logger
	// FieldOwner overrides FieldOwner.
	FieldOwner string
	// Workers is the number of concurrent writers; <= 0 means DefaultWorkers.
	Workers int
	// WriteTimeout bounds one write; <= 0 means 10s.
	WriteTimeout time.Duration
	// WritesPerSecond is the write budget (see SetBudget); <= 0 means
	// DefaultWritesPerSecond, with a burst of twice as many.
	WritesPerSecond float64
}

// Writer coalesces and writes HCPSession status. It is safe for concurrent
// use. Start it with Run.
type Writer struct {
	c        client.Client
	ns       string
	interval time.Duration
	clk      clock.WithTicker
	m        *metrics.Metrics
	log      logr.Logger
	owner    string
	workers  int
	timeout  time.Duration
	queue    workqueue.TypedDelayingInterface[string]
	// budget is the token bucket every API write takes a token from;
	// closing is closed when Run's context ends: the final flush does not
	// wait for tokens.
	budget  *rate.Limiter
	closing chan struct{}

	mu      sync.Mutex
	entries map[string]*entry
	// writing holds, for each session with a write in flight, a channel
	// closed when that write returns (Forget waits for it).
	writing map[string]chan struct{}
	// labelKey is the label mirroring status.state; "" means none.
	labelKey string
	// derive: Update derives the kstatus conditions (SetConditions).
	derive bool
}

// entry is what the writer knows of one session's status.
type entry struct {
	// base is the status this writer last wrote (or was seeded with);
	// patches carry the difference between base and desired.
	base v1alpha1.HCPSessionStatus
	// desired is the status after every Update so far.
	desired v1alpha1.HCPSessionStatus
	// version counts Updates; written is the version base reflects.
	version, written uint64
	// lastWrite is when base was last written (zero: never).
	lastWrite time.Time
	// pendingSince is when the oldest change not yet written came.
	pendingSince time.Time
	// force asks the next write to ignore the interval (Flush).
	force bool
	// gone is set when the object was not found: updates are dropped.
	gone bool
	// label is the state the object's state label is known to carry ("":
	// unknown, written at the next chance); labelRetryAt delays the next
	// attempt after a failed label write.
	label        v1alpha1.SessionState
	labelRetryAt time.Time
	// lingerState and lingerUntil hold back the write of a state set
	// with UpdateAfter until then, while it is still the desired state.
	lingerState v1alpha1.SessionState
	lingerUntil time.Time
	// failures counts status writes that failed in a row; the next one
	// waits until retryAt (retryBackoff), terminal or not.
	failures int
	retryAt  time.Time
	waiters  []waiter
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

type waiter struct {
	version uint64
	ch      chan error
}

// New returns a Writer. Call Run to start writing.
func New(o Options) *Writer {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.FieldOwner == "" {
		o.FieldOwner = FieldOwner
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.WritesPerSecond <= 0 {
		o.WritesPerSecond = DefaultWritesPerSecond
	}
	return &Writer{
		budget:   rate.NewLimiter(rate.Limit(o.WritesPerSecond), burstOf(o.WritesPerSecond)),
		closing:  make(chan struct{}),
		c:        o.Client,
		ns:       o.Namespace,
		interval: o.Interval,
		clk:      o.Clock,
		m:        o.Metrics,
		log:      o.Log,
		owner:    o.FieldOwner,
		workers:  o.Workers,
		timeout:  o.WriteTimeout,
		queue:    workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Clock: o.Clock}),
		entries:  map[string]*entry{},
		writing:  map[string]chan struct{}{},
	}
}

// Interval returns the minimum time between two writes of one session.
func (w *Writer) Interval() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.interval
}

// SetInterval changes the interval (the Callee's
// spec.sessions.statusUpdateInterval, known only once the Callee is read);
// <= 0 is ignored.
func (w *Writer) SetInterval(d time.Duration) {
	if d <= 0 {
		return
	}
	w.mu.Lock()
	w.interval = d
	w.mu.Unlock()
}

// SetBudget changes the write budget: perSecond API writes a second on
// average, with bursts of twice as many (<= 0 is ignored). Writes that make
// a change visible (a new state, its label, a terminal state, a Flush)
// wait for a token; a write that only moves progress or sequences is put
// off while fewer than half the burst's tokens are left, and carries the
// latest status when it goes. So with many sessions streaming the writer
// stays within the budget, progress is coalesced further, and state
// changes still go first.
func (w *Writer) SetBudget(perSecond float64) {
	if perSecond <= 0 {
		return
	}
	w.budget.SetLimit(rate.Limit(perSecond))
	w.budget.SetBurst(burstOf(perSecond))
}

func burstOf(perSecond float64) int { return max(int(2*perSecond), 2) }

// SetStateLabel makes the writer keep the label key of each session it
// writes equal to its status.state (see the package documentation); ""
// turns it off.
func (w *Writer) SetStateLabel(key string) {
	w.mu.Lock()
	w.labelKey = key
	w.mu.Unlock()
}

// SetDeriveConditions makes every Update derive the kstatus conditions
// from the state it leaves (SetConditions). Only the writer that owns
// status.state (the callee sidecar's) may: the caller sidecar's writes only
// callerAckedSequence.
func (w *Writer) SetDeriveConditions(on bool) {
	w.mu.Lock()
	w.derive = on
	w.mu.Unlock()
}

// Run writes until ctx ends, then writes whatever is still pending (bounded
// by a 10 s grace period) and returns. Updates after Run returned are not
// written.
func (w *Writer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range w.workers {
		wg.Go(func() {
			for w.processNext() {
			}
		})
	}
	<-ctx.Done()
	close(w.closing)
	flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	err := w.FlushAll(flushCtx)
	cancel()
	w.queue.ShutDown()
	wg.Wait()
	return err
}

// Seed tells the writer what the stored status of name is (read from the
// API server, or just written by the caller itself), so later patches are
// computed against it. writtenAt, when not zero, counts as a write for the
// interval.
func (w *Writer) Seed(name string, st v1alpha1.HCPSessionStatus, writtenAt time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entryLocked(name)
	e.base = *st.DeepCopy()
	e.desired = *st.DeepCopy()
	e.version++
	e.written = e.version
	e.gone = false
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
// carries (set when it was created), so writing that state does not write
// the label again.
func (w *Writer) SeedLabel(name string, st v1alpha1.SessionState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entryLocked(name)
	e.label = st
}

// entryLocked is name's entry, a new one if the writer has none. Called
// with w.mu held.
func (w *Writer) entryLocked(name string) *entry {
	e := w.entries[name]
	if e == nil {
		e = &entry{}
		w.entries[name] = e
	}
	return e
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
	mutate(&e.desired)
	if w.derive {
		SetConditions(&e.desired, w.clk.Now())
	}
	if e.written == e.version {
		e.pendingSince = w.clk.Now()
	}
	e.version++
	if equality.Semantic.DeepEqual(e.base, e.desired) {
		// Back to what is stored: nothing to write.
		e.written = e.version
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

// Pending reports whether name has changes not yet written (the state
// label included).
func (w *Writer) Pending(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entries[name]
	return e != nil && w.pending(e)
}

// pending: e has a status change or a label update to write. Called with
// w.mu held.
func (w *Writer) pending(e *entry) bool {
	return !e.gone && (e.written != e.version || w.labelDue(e))
}

// labelDue: the state label lags the written state. Called with w.mu held.
func (w *Writer) labelDue(e *entry) bool {
	return w.labelKey != "" && !e.gone && e.base.State != "" && e.label != e.base.State
}

// Status returns the desired (latest) status of name as the writer knows it.
func (w *Writer) Status(name string) (v1alpha1.HCPSessionStatus, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entries[name]
	if e == nil {
		return v1alpha1.HCPSessionStatus{}, false
	}
	return *e.desired.DeepCopy(), true
}

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
	if !e.force && e.lingerState != "" && e.desired.State == e.lingerState {
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
	return e.desired.State != "" && e.desired.State != e.base.State
}

func (w *Writer) processNext() bool {
	name, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(name)

	w.mu.Lock()
	e := w.entries[name]
	if e == nil || !w.pending(e) {
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
	if !visible && !w.closed() && !w.spare(writes) {
		// Only progress: it waits for spare budget and then carries the
		// latest status.
		w.queue.AddAfter(name, max(w.interval/4, w.spareIn(writes)))
		w.mu.Unlock()
		return true
	}
	base, target, version := *e.base.DeepCopy(), *e.desired.DeepCopy(), e.version
	e.force = false
	w.mu.Unlock()
	if visible {
		w.awaitTokens(writes)
	}
	w.mu.Lock()
	if w.entries[name] != e { // forgotten while waiting for tokens
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
	if err == nil && labelKey != "" && target.State != "" && target.State != labelled {
		labelErr = w.writeLabel(name, labelKey, target.State)
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

// plan counts the API writes e's next attempt makes (its status, its
// label) and whether they make a change visible (see SetBudget). Called
// with w.mu held.
func (w *Writer) plan(e *entry, statusDue bool) (writes int, visible bool) {
	if statusDue {
		writes++
	}
	if w.labelKey != "" && e.desired.State != "" && e.desired.State != e.label {
		writes++
	}
	return writes, !statusDue || e.force || stateChange(e)
}

// awaitTokens waits until the budget grants writes tokens (or the writer
// closes). The burst is at least the two writes of a state change, so the
// reservation is always granted.
func (w *Writer) awaitTokens(writes int) {
	if writes == 0 {
		return
	}
	now := w.clk.Now()
	if d := w.budget.ReserveN(now, writes).DelayFrom(now); d > 0 {
		select {
		case <-w.clk.After(d):
		case <-w.closing:
		}
	}
}

func (w *Writer) closed() bool {
	select {
	case <-w.closing:
		return true
	default:
		return false
	}
}

// spare takes n tokens if more than half the burst would be left for the
// writes that make a change visible. Called with w.mu held.
func (w *Writer) spare(n int) bool {
	now := w.clk.Now()
	if w.budget.TokensAt(now) < float64(n+w.budget.Burst()/2) {
		return false
	}
	return w.budget.AllowN(now, n)
}

// spareIn is about when spare(n) can next succeed.
func (w *Writer) spareIn(n int) time.Duration {
	missing := float64(n+w.budget.Burst()/2) - w.budget.TokensAt(w.clk.Now())
	return time.Duration(missing / float64(w.budget.Limit()) * float64(time.Second))
}

func (w *Writer) write(name string, base, target v1alpha1.HCPSessionStatus) error {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	meta := metav1.ObjectMeta{Name: name, Namespace: w.ns}
	from := &v1alpha1.HCPSession{ObjectMeta: meta, Status: base}
	to := &v1alpha1.HCPSession{ObjectMeta: meta, Status: target}
	err := w.c.Status().Patch(ctx, to, client.MergeFrom(from), client.FieldOwner(w.owner))
	w.count(err)
	return err
}

// writeLabel sets the state label with a metadata merge patch (a status
// write cannot change labels).
func (w *Writer) writeLabel(name, key string, state v1alpha1.SessionState) error {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{key: string(state)}}})
	if err != nil {
		return err
	}
	hs := &v1alpha1.HCPSession{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns}}
	err = w.c.Patch(ctx, hs, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(w.owner))
	if w.m != nil {
		result := "ok"
		if err != nil {
			result = "error"
		}
		w.m.LabelWrites.WithLabelValues(result).Inc()
	}
	return err
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
