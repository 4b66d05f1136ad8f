package status

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"k8s.io/client-go/util/workqueue"
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
	// budget is what every API write takes a token from (writeBudget).
	budget writeBudget

	mu      sync.Mutex
	entries map[string]*entry
	// writing holds, for each session with a write in flight, a channel
	// closed when that write returns (Forget waits for it).
	writing map[string]chan struct{}
	// labelKey is the label mirroring status.state; "" means none.
	labelKey string
	// derive: Update derives the kstatus conditions (SetConditions).
	derive bool
	// reader checks failed guarded writes; onFenced is told of a session
	// lost to a later owner (guard.go).
	reader   client.Reader
	onFenced func(name string)
	// guard: writes of a status carrying an ownerEpoch are guarded by it.
	guard bool
}

// entry is what the writer knows of one session's status.
type entry struct {
	// base is the status this writer last wrote (or was seeded with);
	// patches carry the difference between base and the wanted status.
	base v1alpha1.HCPSessionStatus
	// desired is the status after every Update so far, while it differs
	// from base; nil once base is written up to it (want): a live
	// session's status is kept once, not twice, between its writes.
	desired *v1alpha1.HCPSessionStatus
	// version counts Updates; written is the version base reflects.
	version, written uint64
	// lastWrite is when base was last written (zero: never).
	lastWrite time.Time
	// pendingSince is when the oldest change not yet written came.
	pendingSince time.Time
	// force asks the next write to ignore the interval (Flush).
	force bool
	// gone is set when the object was not found, or (fenced) a later
	// owner claimed it: updates are dropped.
	gone, fenced bool
	// label is the state the object's state label is known to carry ("":
	// unknown, written at the next chance); labelRetryAt delays the next
	// attempt after a failed label write.
	label        v1alpha1.SessionState
	labelRetryAt time.Time
	// held counts Holds: no write of the entry starts while it is above 0.
	held int
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

type waiter struct {
	version uint64
	ch      chan error
}

// want is the status after every Update so far: desired, or base when
// nothing is left to write.
func (e *entry) want() *v1alpha1.HCPSessionStatus {
	if e.desired != nil {
		return e.desired
	}
	return &e.base
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
		budget: writeBudget{
			tokens:  rate.NewLimiter(rate.Limit(o.WritesPerSecond), burstOf(o.WritesPerSecond)),
			pace:    rate.NewLimiter(rate.Limit(o.WritesPerSecond), 1),
			clk:     o.Clock,
			closing: make(chan struct{}),
		},
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
	close(w.budget.closing)
	flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	err := w.FlushAll(flushCtx)
	cancel()
	w.queue.ShutDown()
	wg.Wait()
	return err
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
