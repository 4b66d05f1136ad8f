package caller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// StatusWriter records HCPSession status; *status.Writer implements it. The
// caller sidecar sets only callerAckedSequence.
type StatusWriter interface {
	Update(name string, mutate func(*v1alpha1.HCPSessionStatus))
}

// Defaults for Options.
const (
	DefaultSubmitTimeout     = 30 * time.Second
	DefaultSubmitMaxTimeout  = 5 * time.Minute
	DefaultSubmitMaxAttempts = 8
	DefaultAppBackoffMin     = 200 * time.Millisecond
	DefaultAppBackoffMax     = 30 * time.Second
	DefaultAppTimeout        = 30 * time.Second
	DefaultGapTimeout        = 10 * time.Second
	DefaultPublishTimeout    = 15 * time.Second
	DefaultRetention         = 24 * time.Hour
	DefaultDrainTimeout      = 5 * time.Second
	// DefaultStatusInterval is the minimum time between two
	// callerAckedSequence writes of one HCPSession while sessions run:
	// coarser than the callee sidecar's 1 s (both sidecars write the same
	// object, and a running pod's own store is the deduplication source). A
	// session's terminal message, Drain and a graceful stop write at once.
	DefaultStatusInterval = 5 * time.Second
	// DefaultSeedTimeout bounds how long a session without a local record
	// waits for its HCPSession to be readable before it is delivered
	// without the position the previous pod recorded.
	DefaultSeedTimeout = 30 * time.Second
	// DefaultFlushTimeout bounds how long a graceful stop (Run's ctx ended)
	// retries writing callerAckedSequence before the consumer's channel is
	// closed.
	DefaultFlushTimeout = 10 * time.Second
)

// RetryPolicy is how a task_submit without an answer is republished: the
// first wait is Timeout, each further one doubles up to MaxTimeout, and
// after MaxAttempts publishes the task is marked unanswered.
type RetryPolicy struct {
	Timeout     time.Duration
	MaxTimeout  time.Duration
	MaxAttempts int
}

// wait returns the time to wait for an answer after publish number attempt
// (1-based).
func (p RetryPolicy) wait(attempt int) time.Duration {
	d := p.Timeout
	for i := 1; i < attempt && d < p.MaxTimeout; i++ {
		d *= 2
	}
	return min(d, p.MaxTimeout)
}

// Backoff bounds the exponential delay between attempts to deliver a
// message the app failed: Min after the first failure, doubling up to Max.
type Backoff struct {
	Min, Max time.Duration
}

func (b Backoff) after(failures int) time.Duration {
	d := b.Min
	for i := 1; i < failures && d < b.Max; i++ {
		d *= 2
	}
	return min(d, b.Max)
}

// Options configure a Sidecar. Config, Publisher and Consumer are required.
type Options struct {
	// Config is the sidecar configuration (mode caller): ID, Username,
	// Vhost, HarnessURL (the app's base URL), Prefetch, StateDir, Namespace.
	Config *config.Config
	// Client reads HCPSessions in Config.Namespace (typically from a cache):
	// a session's callee and caller when no local record names them, and
	// whether callerAckedSequence can be recorded. Optional: without Client
	// and Reader, positions are durable in the local store only.
	Client client.Client
	// Reader reads HCPSessions uncached (the API server). A session without
	// a local record (a new pod) resumes from the status.callerAckedSequence
	// read through it, since a cache may not have seen the previous pod's
	// last write yet; a cache miss is checked through it too. Optional: nil
	// reads through Client.
	Reader client.Reader
	// Publisher publishes task_submit and abort (confirmed).
	Publisher transport.Publisher
	// Consumer consumes hcp.evt.{callerID}. A *transport.Conn must be
	// dialled with DrainWithoutCancel: a basic.cancel on stop would send the
	// messages in transit to the back of the quorum queue, out of order
	// (see the package documentation).
	Consumer transport.Consumer
	// Status records callerAckedSequence; optional. If it has a
	// SetInterval(time.Duration) method (*status.Writer does), New sets it
	// to StatusInterval: the writer must be the caller sidecar's own.
	Status StatusWriter
	// StatusInterval is the minimum time between two callerAckedSequence
	// writes of one session; 0 means DefaultStatusInterval, < 0 leaves the
	// writer's own interval.
	StatusInterval time.Duration
	// Metrics; nil creates unregistered collectors.
	Metrics *metrics.Metrics
	Log     logr.Logger
	// Clock; nil means the real clock.
	Clock clock.WithTickerAndDelayedExecution
	// HTTPClient calls the app; nil means a client without a global
	// timeout (AppTimeout bounds each call) that keeps a connection per
	// concurrently delivering session alive.
	HTTPClient *http.Client

	// Store overrides the store opened from Config.StateDir (tests). The
	// Sidecar does not close a Store it was given.
	Store *Store
	// SubmitRetry: republishing of unanswered task_submits.
	SubmitRetry RetryPolicy
	// AppBackoff: delays between attempts to deliver a message the app
	// failed (the delivery stays held meanwhile; see the package doc).
	AppBackoff Backoff
	// AppTimeout bounds one POST to the app.
	AppTimeout time.Duration
	// GapTimeout is how long events wait behind a sequence gap before the
	// gap is skipped (L2: log a warning and continue).
	GapTimeout time.Duration
	// DrainTimeout bounds how long, after Run's ctx ends, the deliveries
	// already received are still delivered to the app; what is left stays
	// unsettled and returns to the head of the queue when the channel
	// closes. Keep it below the transport's drain timeout.
	DrainTimeout time.Duration
	// AppMaxBatch, above 1, has the events of a session that are ready
	// together (up to this many) POSTed in one request to the app's
	// BatchPath instead of one request per event to EventsPath; default
	// cfg.AppMaxBatch. At 1 the app may still offer batches
	// (HeaderBatchMax).
	AppMaxBatch int
	// MaxBuffer bounds each session's reorder buffer; 0 means twice the
	// prefetch (at least 16). Buffered events stay unacked, so the window
	// bounds the buffer (plus, after a lost channel, its stale copies not
	// yet dropped): with a prefetch the bound is never reached, and a
	// window full of buffered events is handed back to the queue instead
	// (stream.shed), so that the missing one can come. A smaller bound
	// would skip gaps whose events are queued (measured: a gap of 6 skipped
	// with Prefetch-1, TestLongGapIsNotSkipped).
	MaxBuffer int
	// PublishTimeout bounds one publish including its confirm.
	PublishTimeout time.Duration
	// Retention is how long finished tasks and sessions are remembered
	// (for deduplication and the GET endpoints); default 24h, the event
	// queue's default message TTL.
	Retention time.Duration
	// SeedTimeout bounds the wait for a session's HCPSession when the local
	// store has no record of it (see DefaultSeedTimeout).
	SeedTimeout time.Duration
	// FlushTimeout bounds the final callerAckedSequence writes of a
	// graceful stop (see DefaultFlushTimeout); Drain uses its own ctx.
	FlushTimeout time.Duration
}

// Sidecar is the caller-mode sidecar.
type Sidecar struct {
	cfg      *config.Config
	o        Options
	log      logr.Logger
	m        *metrics.Metrics
	clk      clock.WithTickerAndDelayedExecution
	http     *http.Client
	store    *Store
	ownStore bool
	queue    string

	started atomic.Bool
	// runCtx ends when Run's ctx ends; timers watch it.
	runCtx context.Context
	// consuming is true while the consumer runs (readiness).
	consuming atomic.Bool
	// stopCh is closed when delivering stops (Drain, or Run's ctx ended):
	// session workers finish what they hold and exit.
	stopCh chan struct{}

	mu       sync.Mutex
	stopping bool
	// stopConsume ends the consumer (its channel closes without
	// basic.cancel); set by Run.
	stopConsume context.CancelFunc
	streams     map[string]*stream
	workers     sync.WaitGroup
	// movedAt is when a delivery last went to a session that can deliver
	// (unix nanos; see releaseDelay).
	movedAt atomic.Int64
	// holding counts the deliveries handed to session workers and not
	// settled (the sum of the streams' held); buffered is the sum of the
	// streams' reorder buffers as they last published them (mirror);
	// dispatchedAt is when a delivery last reached the dispatcher (unix
	// nanos). See Sidecar.release and stream.shed.
	holding atomic.Int32
	// stalledSessions counts the session workers whose app is failing
	// their messages (stream.stalled).
	stalledSessions atomic.Int32
	// appBatchMax is the batch size the app last offered (HeaderBatchMax;
	// 0: none), used while Options.AppMaxBatch is 1; batchRefusedAt is
	// when its batch endpoint last refused a batch (unix nanos).
	appBatchMax    atomic.Int32
	batchRefusedAt atomic.Int64
	buffered       atomic.Int64
	dispatchedAt   atomic.Int64
	// answered holds task message ids whose answer has arrived (even if not
	// yet delivered to the app), so they are not republished.
	answered map[string]bool
	// lookups caches HCPSession reads.
	lookups map[string]lookup
	// positions holds, per session, the callerAckedSequence this sidecar
	// has asked the status writer to record and not yet seen written (see
	// flushPositions).
	positions map[string]int64
	// submitMu serialises the check-and-create of a task_submit record.
	submitMu sync.Mutex
	// elsewhere logs once that HCPSessions are not in this namespace.
	elsewhere sync.Once
}

// withDefaults fills in every option left unset.
func (o Options) withDefaults(c *config.Config) Options {
	if o.Metrics == nil {
		o.Metrics = metrics.New(prometheus.NewRegistry())
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.HTTPClient == nil {
		// Sessions deliver concurrently, one request at a time each: keep a
		// connection per session alive (http.DefaultTransport keeps 2 per
		// host, so with more sessions every request would open one).
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64
		o.HTTPClient = &http.Client{Transport: t}
	}
	if o.SubmitRetry.Timeout <= 0 {
		o.SubmitRetry.Timeout = DefaultSubmitTimeout
	}
	if o.SubmitRetry.MaxTimeout <= 0 {
		o.SubmitRetry.MaxTimeout = max(DefaultSubmitMaxTimeout, o.SubmitRetry.Timeout)
	}
	if o.SubmitRetry.MaxAttempts <= 0 {
		o.SubmitRetry.MaxAttempts = DefaultSubmitMaxAttempts
	}
	if o.AppBackoff.Min <= 0 {
		o.AppBackoff.Min = DefaultAppBackoffMin
	}
	if o.AppBackoff.Max <= 0 {
		o.AppBackoff.Max = max(DefaultAppBackoffMax, o.AppBackoff.Min)
	}
	if o.AppTimeout <= 0 {
		o.AppTimeout = DefaultAppTimeout
	}
	if o.GapTimeout <= 0 {
		o.GapTimeout = DefaultGapTimeout
	}
	if o.AppMaxBatch <= 0 {
		o.AppMaxBatch = c.AppMaxBatch
	}
	if o.MaxBuffer <= 0 {
		o.MaxBuffer = max(2*c.Prefetch, 16)
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = DefaultPublishTimeout
	}
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.SeedTimeout <= 0 {
		o.SeedTimeout = DefaultSeedTimeout
	}
	if o.FlushTimeout <= 0 {
		o.FlushTimeout = DefaultFlushTimeout
	}
	if o.StatusInterval == 0 {
		o.StatusInterval = DefaultStatusInterval
	}
	return o
}

// New validates opts and opens the state store.
func New(opts Options) (*Sidecar, error) {
	c := opts.Config
	if c == nil {
		return nil, errors.New("caller sidecar: Config is required")
	}
	if opts.Publisher == nil || opts.Consumer == nil {
		return nil, errors.New("caller sidecar: Publisher and Consumer are required")
	}
	var errs []error
	if err := topology.ValidateID(c.ID); err != nil {
		errs = append(errs, fmt.Errorf("caller id: %w", err))
	}
	if c.HarnessURL == "" {
		errs = append(errs, fmt.Errorf("%s (the app's base URL) is required", config.EnvHarnessURL))
	}
	if role, vhost, id, err := topology.ParseUsername(c.Username); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", config.EnvUsername, err))
	} else if role != topology.RoleCaller || id != c.ID || vhost != c.Vhost {
		errs = append(errs, fmt.Errorf("%s %q is not the caller user of id %q in vhost %q (want %q): callees identify callers by it",
			config.EnvUsername, c.Username, c.ID, c.Vhost, topology.Username(topology.RoleCaller, c.Vhost, c.ID)))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("caller sidecar: %w", err)
	}
	o := opts.withDefaults(c)
	if iv, ok := o.Status.(interface{ SetInterval(time.Duration) }); ok && o.StatusInterval > 0 {
		iv.SetInterval(o.StatusInterval)
	}
	s := &Sidecar{
		cfg:       c,
		o:         o,
		log:       o.Log.WithValues("callerID", c.ID),
		m:         o.Metrics,
		clk:       o.Clock,
		http:      o.HTTPClient,
		store:     o.Store,
		queue:     topology.EventQueue(c.ID),
		streams:   map[string]*stream{},
		answered:  map[string]bool{},
		lookups:   map[string]lookup{},
		positions: map[string]int64{},
		runCtx:    context.Background(),
		stopCh:    make(chan struct{}),
	}
	s.m.AppBatchMax.Set(float64(s.batchLimit()))
	if s.store == nil {
		st, err := OpenStore(c.StateDir)
		if err != nil {
			return nil, fmt.Errorf("caller sidecar: %w", err)
		}
		s.store, s.ownStore = st, true
	}
	for _, t := range s.store.Tasks() {
		if t.State.answered() {
			s.answered[t.MessageID] = true
		}
	}
	return s, nil
}

// Store returns the sidecar's state store (for inspection).
func (s *Sidecar) Store() *Store { return s.store }

// Ready reports whether the sidecar consumes its event queue and its store
// is writable.
func (s *Sidecar) Ready() error {
	s.mu.Lock()
	stopping := s.stopping
	s.mu.Unlock()
	if stopping {
		return errors.New("drained or stopping: no longer delivering events")
	}
	if !s.consuming.Load() {
		return errors.New("not consuming the event queue")
	}
	if !s.o.Consumer.Subscribed(s.queue) {
		return errors.New("not subscribed to the event queue yet")
	}
	if err := s.store.err(); err != nil {
		return err
	}
	return nil
}

// Run consumes the event queue and republishes pending submits until ctx
// ends, then shuts down (see stop): deliveries stop being handed to the
// session workers, the app requests in progress finish and are persisted and
// acked, deliveries already received are still delivered for up to
// DrainTimeout, every session's callerAckedSequence is written (retried for
// up to FlushTimeout), and only then does the consumer's channel close, so
// whatever is left (behind a gap, failed by the app, not yet handed over)
// returns to the head of the queue, in order, for the next consumer, which
// can then rely on the HCPSession's position. After Drain, Run no longer
// consumes but keeps republishing submits until ctx ends. The store is
// closed last. Run may be called once.
func (s *Sidecar) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("caller sidecar: Run called twice")
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The consumer outlives ctx until the positions are written.
	consumeCtx, stopConsume := context.WithCancel(context.WithoutCancel(ctx))
	defer stopConsume()
	s.mu.Lock()
	s.runCtx = runCtx
	s.stopConsume = stopConsume
	drained := s.stopping // Drain before Run: nothing to consume
	s.mu.Unlock()
	s.log.Info("Starting caller sidecar", "queue", s.queue, "prefetch", s.cfg.Prefetch, "stateDir", s.cfg.StateDir,
		"tasks", len(s.store.Tasks()), "sessions", len(s.store.Sessions()))

	var bg sync.WaitGroup
	bg.Go(func() { s.retryLoop(runCtx) })
	bg.Go(func() { s.housekeeping(runCtx) })
	// A graceful stop: the same sequence as Drain, bounded by FlushTimeout.
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-runCtx.Done():
		case <-consumeCtx.Done():
			// Drained, or the consumer failed: Run still ends with ctx.
			<-runCtx.Done()
		}
		fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), s.o.FlushTimeout)
		defer fcancel()
		if err := s.stop(fctx); err != nil {
			s.log.Error(err, "Stopped without recording every session's position in its HCPSession; a new pod may deliver some events again")
		}
	}()

	var err error
	if drained {
		stopConsume()
	} else {
		s.consuming.Store(true)
		err = s.o.Consumer.Consume(consumeCtx, s.queue, s.cfg.Prefetch, s.handle)
		s.consuming.Store(false)
	}
	if consumeCtx.Err() == nil {
		// The consumer ended by itself (a failure): stop now and return it.
		cancel()
	} else if errors.Is(err, context.Canceled) || errors.Is(err, transport.ErrClosed) {
		err = nil
	}
	<-stopped
	cancel()
	bg.Wait()
	s.workers.Wait()
	if s.ownStore {
		if cerr := s.store.Close(); cerr != nil {
			s.log.Error(cerr, "Failed to close the state store")
		}
	}
	s.log.Info("Stopped caller sidecar")
	if err != nil && ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

// housekeeping forgets old finished tasks and sessions and keeps the
// sessions gauge current.
func (s *Sidecar) housekeeping(ctx context.Context) {
	t := s.clk.NewTicker(30 * time.Second)
	defer t.Stop()
	s.sessionGauge()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			s.prune()
			s.sessionGauge()
		}
	}
}

func (s *Sidecar) prune() {
	cutoff := s.clk.Now().Add(-s.o.Retention)
	for _, t := range s.store.Tasks() {
		done := (t.State.answered() && t.Delivered) || t.State == TaskUnanswered || t.State == TaskExpired || t.Adopted
		last := t.AnsweredAt
		if last.IsZero() {
			last = t.LastAttemptAt
		}
		if last.IsZero() {
			last = t.SubmittedAt
		}
		if done && last.Before(cutoff) {
			if err := s.store.DeleteTask(t.MessageID); err != nil {
				s.log.Error(err, "Failed to forget an old task", "task", t.MessageID)
			}
			s.mu.Lock()
			delete(s.answered, t.MessageID)
			s.mu.Unlock()
		}
	}
	for _, r := range s.store.Sessions() {
		if r.over() && r.UpdatedAt.Before(cutoff) {
			s.mu.Lock()
			_, active := s.streams[r.SessionID]
			delete(s.lookups, r.SessionID)
			if !active {
				delete(s.positions, r.SessionID)
			}
			s.mu.Unlock()
			if active {
				continue
			}
			if err := s.store.DeleteSession(r.SessionID); err != nil {
				s.log.Error(err, "Failed to forget an old session", "session", r.SessionID)
			}
		}
	}
}

func (s *Sidecar) sessionGauge() {
	counts := map[string]float64{}
	for _, r := range s.store.Sessions() {
		st := r.State
		if st == "" {
			st = "UNKNOWN"
		}
		counts[st]++
	}
	s.m.Sessions.Reset()
	for st, n := range counts {
		s.m.Sessions.WithLabelValues(st).Set(n)
	}
}

// ctx returns the run context (Background before Run).
func (s *Sidecar) ctx() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runCtx
}
