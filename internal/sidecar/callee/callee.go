// Package callee is the hcp-sidecar's callee mode: it consumes the callee's
// command queue, runs the L3 gate on every task_submit, creates and drives
// the HCPSession of each admitted task, hands the task to the harness over
// the local HTTP API, relays the harness's events to the caller with
// strictly increasing sequence numbers, and enforces the L2 state machine,
// timeouts and aborts. See docs/harness-api.md for the harness side.
//
// # Exactly-once over at-least-once
//
// The HCPSession named after topology.SessionID(calleeID, message_id) is the
// dedup record, shared by every replica and surviving restarts: creating it
// is the first side effect of a task_submit, and AlreadyExists means
// "duplicate". A duplicate is answered with the original reply rebuilt from
// the stored object: the same envelope message_id and timestamp, the same
// reason for a rejection, and for an acceptance the same session token
// (Ed25519 signatures are deterministic, and every claim comes from the
// object's immutable part: iat is its creationTimestamp, exp adds
// spec.maxDuration; see sessionClaims).
// A command is acknowledged only once its reply is confirmed by the broker.
//
// The decision is recorded with an optimistic-lock write PENDING → RUNNING
// or REJECTED, so exactly one processor of a task_submit (the original, a
// redelivery on another replica, or the recovery of a crashed replica)
// decides it. The task reaches the harness only after RUNNING is stored, so
// no crash can make two harnesses run one task.
package callee

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/lease"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Defaults of Options.Timeouts.
const (
	DefaultHarnessTimeout  = 10 * time.Second
	DefaultPendingWait     = 30 * time.Second
	DefaultSweepInterval   = 30 * time.Second
	DefaultShutdownDrain   = 20 * time.Second
	DefaultRetention       = 5 * time.Minute
	DefaultAbortTimeout    = 30 * time.Second
	DefaultSequenceBlock   = 1000
	DefaultHarnessAttempts = 3
	DefaultHarnessCheck    = 5 * time.Second
)

// AnnotationSequenceCeiling records on an HCPSession the highest event
// sequence number the sidecar may have used. Status writes are coalesced, so
// status.lastSequence can lag; a sidecar that takes over a session (after a
// crash) continues after this ceiling, so it never reuses a number the
// caller has already seen. It is reserved in blocks (DefaultSequenceBlock,
// the first block at creation), one metadata write per block.
const AnnotationSequenceCeiling = "hcp.io/event-sequence-ceiling"

// Topology is what the sidecar needs of its AMQP connection besides
// publishing and consuming.
type Topology interface {
	// CheckTopology passively checks that the exchanges (name → kind) and
	// queues exist.
	CheckTopology(ctx context.Context, exchanges map[string]string, queues []string) error
	// Ready reports whether the connection is up.
	Ready() bool
}

var _ Topology = (*transport.Conn)(nil)

// Timeouts tune the sidecar; zero values take the defaults.
type Timeouts struct {
	// HarnessTimeout bounds one call to the harness (task hand-over, abort).
	HarnessTimeout time.Duration
	// PendingWait is how long a duplicate waits for another live replica to
	// decide a task it is still deciding.
	PendingWait time.Duration
	// SweepInterval is how often sessions of vanished pods are looked for.
	SweepInterval time.Duration
	// ShutdownDrain is how long running sessions may go on after shutdown
	// began (the harness gets its own SIGTERM and may finish or fail them);
	// the rest are failed with code callee_shutdown.
	ShutdownDrain time.Duration
	// Retention keeps ended sessions in memory so the harness gets 409 (not
	// 404) for late calls.
	Retention time.Duration
	// HarnessCheck is how often the harness is checked while sessions run
	// (see harnessWatchdog).
	HarnessCheck time.Duration
}

func (t *Timeouts) defaults() {
	if t.HarnessTimeout <= 0 {
		t.HarnessTimeout = DefaultHarnessTimeout
	}
	if t.PendingWait <= 0 {
		t.PendingWait = DefaultPendingWait
	}
	if t.SweepInterval <= 0 {
		t.SweepInterval = DefaultSweepInterval
	}
	if t.ShutdownDrain <= 0 {
		t.ShutdownDrain = DefaultShutdownDrain
	}
	if t.Retention <= 0 {
		t.Retention = DefaultRetention
	}
	if t.HarnessCheck <= 0 {
		t.HarnessCheck = DefaultHarnessCheck
	}
}

// Options wire a callee sidecar.
type Options struct {
	// Config is the sidecar configuration (mode callee). Required.
	Config *config.Config
	// Client reads Callee, Caller, CapabilityPolicy and HCPSession objects
	// (from the cache) and writes HCPSessions. Required.
	Client client.Client
	// Reader reads around the cache: dedup lookups that must not be stale,
	// and Pods (to recognise vanished replicas). It should be an uncached
	// client: a cached one would start a Pod informer. Defaults to Client.
	Reader client.Reader
	// Cache, when set, delivers HCPSession changes (spec.abortRequested set
	// by another replica or by kubectl). Without it the sidecar polls its
	// running sessions every second.
	Cache cache.Informers
	// Conn checks the topology and reports connection readiness. Required.
	Conn Topology
	// Publisher publishes replies and events with confirms. Required.
	Publisher transport.Publisher
	// Consumer consumes the command queue. Required.
	Consumer transport.Consumer
	// Status writes HCPSession status (coalesced). Required.
	Status *status.Writer
	// Metrics; optional.
	Metrics *metrics.Metrics
	// Log; the zero value discards.
	Log logr.Logger
	// Clock; nil means the real clock.
	Clock clock.WithTickerAndDelayedExecution
	// SigningKey overrides Config.TokenKeyPEM (tests).
	SigningKey ed25519.PrivateKey
	// HTTPClient calls the harness; nil means a default client.
	HTTPClient *http.Client
	// Timeouts tune the sidecar.
	Timeouts Timeouts
	// Lease vouches for this replica's ownership of its sessions (see
	// own.go); nil means always valid (tests with a single replica).
	Lease *lease.Keeper
}

// Sidecar is the callee-mode sidecar.
type Sidecar struct {
	cfg      *config.Config
	id       string
	ns       string
	pod      string
	username string
	harness  *url.URL

	c       client.Client
	reader  client.Reader
	infs    cache.Informers
	conn    Topology
	pub     transport.Publisher
	cons    transport.Consumer
	st      *status.Writer
	m       *metrics.Metrics
	log     logr.Logger
	clk     clock.WithTickerAndDelayedExecution
	key     ed25519.PrivateKey
	pubKey  ed25519.PublicKey
	http    *http.Client
	t       Timeouts
	handler http.Handler

	// life is the context of background work (confirm waits, republishes,
	// timers); it ends after the shutdown drain.
	life     context.Context
	stopLife context.CancelFunc

	// wal is the write-ahead log of the sessions (Config.StateDir);
	// walSessions is what it held at start, for re-adoption.
	wal         *wal.Log
	walSessions map[string]*wal.Session
	lease       *lease.Keeper
	ckpt        *checkpoint.Store
	drainOnce   sync.Once
	drained     chan struct{}
	stopConsume context.CancelFunc

	consuming   flag
	inflight    sync.WaitGroup // deliveries being processed
	sessionsWG  sync.WaitGroup // session confirmers
	mu          sync.Mutex
	sessions    map[string]*sess         // sessions of this replica, running or recently ended
	deciding    map[string]chan struct{} // task_submits being decided here, by session id
	shuttingDn  bool
	podGoneWarn sync.Once
}

type flag struct {
	mu  sync.Mutex
	on  bool
	err error
}

func (f *flag) set(on bool, err error) {
	f.mu.Lock()
	f.on, f.err = on, err
	f.mu.Unlock()
}

func (f *flag) get() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.on, f.err
}

// New validates the options and returns the sidecar; Run starts it.
func New(o Options) (*Sidecar, error) {
	var errs []error
	if o.Config == nil {
		return nil, errors.New("callee: Config is required")
	}
	if o.Config.Mode != config.ModeCallee {
		errs = append(errs, fmt.Errorf("callee: config mode is %q, not callee", o.Config.Mode))
	}
	for name, missing := range map[string]bool{
		"Client": o.Client == nil, "Conn": o.Conn == nil, "Publisher": o.Publisher == nil,
		"Consumer": o.Consumer == nil, "Status": o.Status == nil,
	} {
		if missing {
			errs = append(errs, fmt.Errorf("callee: %s is required", name))
		}
	}
	if err := topology.ValidateID(o.Config.ID); err != nil {
		errs = append(errs, fmt.Errorf("callee: %s: %w", config.EnvID, err))
	}
	hu, err := url.Parse(o.Config.HarnessURL)
	if err != nil || (hu.Scheme != "http" && hu.Scheme != "https") || hu.Host == "" {
		errs = append(errs, fmt.Errorf("callee: %s must be an http(s) URL, got %q", config.EnvHarnessURL, o.Config.HarnessURL))
	}
	key := o.SigningKey
	if key == nil {
		key, err = token.ParsePrivateKeyPEM([]byte(o.Config.TokenKeyPEM))
		if err != nil {
			errs = append(errs, fmt.Errorf("callee: %s: %w", config.EnvTokenKey, err))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if o.Reader == nil {
		o.Reader = o.Client
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Transport: &http.Transport{
			Proxy:               nil, // the harness is on localhost: never through a proxy
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	o.Timeouts.defaults()
	wl, walSessions, err := wal.Open(o.Config.StateDir)
	if err != nil {
		return nil, fmt.Errorf("callee: the sessions' write-ahead log in %s: %w", o.Config.StateDir, err)
	}
	pod := o.Config.PodName
	if pod == "" {
		pod, _ = os.Hostname()
	}
	username := o.Config.Username
	s := &Sidecar{
		cfg:      o.Config,
		id:       o.Config.ID,
		ns:       o.Config.Namespace,
		pod:      pod,
		username: username,
		harness:  hu,
		c:        o.Client,
		reader:   o.Reader,
		infs:     o.Cache,
		conn:     o.Conn,
		pub:      o.Publisher,
		cons:     o.Consumer,
		st:       o.Status,
		m:        o.Metrics,
		log:      o.Log,
		clk:      o.Clock,
		key:      key,
		pubKey:   key.Public().(ed25519.PublicKey),
		http:     o.HTTPClient,
		t:        o.Timeouts,
		sessions: map[string]*sess{},
		deciding: map[string]chan struct{}{},

		wal:         wl,
		walSessions: walSessions,
		lease:       o.Lease,
		ckpt:        &checkpoint.Store{C: o.Client, R: o.Reader, Namespace: o.Config.Namespace, CalleeID: o.Config.ID},
		drained:     make(chan struct{}),
	}
	// Sessions are selectable by state (kubectl get hcps -l hcp.io/state=RUNNING):
	// the writer keeps the label in step with the state it writes.
	o.Status.SetStateLabel(v1alpha1.LabelSessionState)
	s.life, s.stopLife = context.WithCancel(context.Background())
	s.handler = s.routes()
	return s, nil
}

// Handler is the local harness API (serve it on Config.APIAddr). It keeps
// serving while Run drains at shutdown.
func (s *Sidecar) Handler() http.Handler { return s.handler }

// Ready reports whether the sidecar takes tasks: the AMQP connection is up
// and the command queue is being consumed.
func (s *Sidecar) Ready() error {
	if !s.conn.Ready() {
		return errors.New("AMQP connection is down")
	}
	on, err := s.consuming.get()
	if !on {
		if err != nil {
			return fmt.Errorf("not consuming %s: %w", topology.CommandQueue(s.id), err)
		}
		return fmt.Errorf("not consuming %s yet", topology.CommandQueue(s.id))
	}
	return nil
}

// Run checks the topology, recovers the sessions a previous incarnation
// left behind, consumes commands until ctx ends, then shuts down
// gracefully: it stops consuming, finishes the deliveries in hand, lets
// running sessions go on for Timeouts.ShutdownDrain, fails the rest
// (callee_shutdown), waits for their last events to be confirmed and
// flushes their status.
func (s *Sidecar) Run(ctx context.Context) error {
	defer s.stopLife()
	log := s.log.WithValues("callee", s.id, "pod", s.pod)
	queue := topology.CommandQueue(s.id)

	if err := s.checkTopology(ctx); err != nil {
		return err
	}
	if cl, err := s.callee(ctx); err == nil {
		s.st.SetInterval(calleeDuration(cl.Spec.Sessions.StatusUpdateInterval, status.DefaultInterval))
	} else {
		log.Error(err, "Failed to read the Callee; using default session settings for now")
	}
	if err := s.watchAborts(ctx); err != nil {
		return err
	}
	defer func() { _ = s.wal.Release() }()
	s.readopt(ctx)
	s.recover(ctx)
	go s.sweepLoop(ctx)
	go s.harnessWatchdog(ctx)

	consumeCtx, stopConsume := context.WithCancel(context.WithoutCancel(ctx))
	s.mu.Lock()
	s.stopConsume = stopConsume
	s.mu.Unlock()
	consumeDone := make(chan error, 1)
	go func() {
		s.consuming.set(true, nil)
		err := s.cons.Consume(consumeCtx, queue, s.cfg.Prefetch, s.handle)
		s.consuming.set(false, err)
		consumeDone <- err
	}()
	log.Info("Consuming commands", "queue", queue, "prefetch", s.cfg.Prefetch)

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-consumeDone:
		if s.draining() {
			// Drained (the pod is being deleted): stay up, serving the
			// local API, until told to stop.
			consumeDone <- nil
			<-ctx.Done()
			break
		}
		// Consume only returns early when the transport was closed.
		runErr = fmt.Errorf("consuming %s: %w", queue, err)
		consumeDone <- err
	}
	log.Info("Shutting down: no new tasks; handing sessions over")
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.t.ShutdownDrain)
	_ = s.Drain(dctx)
	cancel()
	if err := <-consumeDone; err != nil && runErr == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, transport.ErrClosed) {
		log.Error(err, "The consumer ended with an error")
	}
	if !waitTimeout(&s.inflight, s.t.ShutdownDrain) {
		log.Info("Commands still in hand after the drain time; they return to the queue")
	}
	s.drainSessions(log)
	// Unblocks whatever still waits on the broker; the deliveries it holds
	// are requeued by the broker.
	s.stopLife()
	waitTimeout(&s.inflight, 5*time.Second)
	return runErr
}

// waitTimeout waits for wg at most d; false when it timed out.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func (s *Sidecar) checkTopology(ctx context.Context) error {
	err := s.conn.CheckTopology(ctx,
		map[string]string{topology.CommandsExchange: topology.CommandsExchangeType, topology.EventsExchange: topology.EventsExchangeType},
		[]string{topology.CommandQueue(s.id)})
	if err != nil {
		return fmt.Errorf("callee %q: the HCP topology is incomplete (the operator declares it; the sidecar may not): %w", s.id, err)
	}
	return nil
}

// drainSessions waits up to ShutdownDrain for the running sessions to end,
// fails the rest, and waits (10 s at most) for their last confirms.
func (s *Sidecar) drainSessions(log logr.Logger) {
	deadline := s.clk.NewTimer(s.t.ShutdownDrain)
	defer deadline.Stop()
	tick := s.clk.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for s.activeCount() > 0 {
		select {
		case <-deadline.C():
			for _, ss := range s.active() {
				log.Info("Failing a session still running at shutdown", "session", ss.id)
				ss.terminate(codeCalleeShutdown, "the callee sidecar shut down before the task finished", true)
			}
		case <-tick.C():
			continue
		}
		break
	}
	done := make(chan struct{})
	go func() { s.sessionsWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		log.Info("Gave up waiting for the confirms of the last events")
	}
}

func (s *Sidecar) active() []*sess {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*sess
	for _, ss := range s.sessions {
		if !ss.ended() {
			out = append(out, ss)
		}
	}
	return out
}

func (s *Sidecar) activeCount() int { return len(s.active()) }

// callee reads this sidecar's Callee object from the cache.
func (s *Sidecar) callee(ctx context.Context) (*v1alpha1.Callee, error) {
	var c v1alpha1.Callee
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: s.cfg.ObjectName}, &c); err != nil {
		return nil, fmt.Errorf("reading Callee %s/%s: %w", s.ns, s.cfg.ObjectName, err)
	}
	return &c, nil
}

func (s *Sidecar) harnessURL(path string) string {
	return strings.TrimRight(s.harness.String(), "/") + path
}
