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
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/record"
	"k8s.io/utils/lru"

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
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Defaults of Options.Timeouts.
const (
	DefaultHarnessTimeout  = 10 * time.Second
	DefaultPendingWait     = 30 * time.Second
	DefaultRecountWait     = 5 * time.Second
	DefaultSweepInterval   = 30 * time.Second
	DefaultShutdownDrain   = 20 * time.Second
	DefaultRetention       = 5 * time.Minute
	DefaultAbortTimeout    = 30 * time.Second
	DefaultSequenceBlock   = 1000
	DefaultHarnessAttempts = 3
	DefaultHarnessCheck    = 5 * time.Second
	DefaultRecordWait      = 30 * time.Second
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
	// RecountWait bounds how long an admission under a concurrency limit
	// waits for the undecided claims ranked after it (see recount) before
	// it counts them as admitted.
	RecountWait time.Duration
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
	// LostOwnerGrace is how long a replica whose pod and Lease are both gone
	// is still taken for alive (see ownerAlive). Defaults to the Lease
	// duration.
	LostOwnerGrace time.Duration
	// RecordWait bounds how long an accepted task's HCPSession create is
	// retried while the API server cannot take it (accept.go); then the
	// session ends, task_failed session_not_recorded.
	RecordWait time.Duration
}

func (t *Timeouts) defaults() {
	if t.HarnessTimeout <= 0 {
		t.HarnessTimeout = DefaultHarnessTimeout
	}
	if t.RecountWait <= 0 {
		t.RecountWait = DefaultRecountWait
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
	if t.RecordWait <= 0 {
		t.RecordWait = DefaultRecordWait
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
	// SigningKey overrides Config.TokenKeyPEM and TokenKeyFile (tests).
	SigningKey ed25519.PrivateKey
	// HTTPClient calls the harness; nil means a default client.
	HTTPClient *http.Client
	// Timeouts tune the sidecar.
	Timeouts Timeouts
	// Lease vouches for this replica's ownership of its sessions (see
	// own.go); nil means always valid (tests with a single replica).
	Lease *lease.Keeper
	// Recorder records Kubernetes Events on the Callee (rejections);
	// optional. The standard broadcaster aggregates and rate-limits them.
	Recorder record.EventRecorder
	// RecordBeforeReply creates every admitted task's HCPSession before
	// task_accepted goes out, as releases before the reply-first
	// acceptance did (accept.go): a benchmark's baseline.
	RecordBeforeReply bool
}

// Sidecar is the callee-mode sidecar.
type Sidecar struct {
	// rec records Events (nil: none); rejections remembers the tasks the
	// gate rejected without a record (see rejectUnrecorded).
	rec        record.EventRecorder
	rejections *lru.Cache
	// recordFirst: Options.RecordBeforeReply; issuedAtDropped is set once
	// the API server dropped spec.issuedAt from a create (a CRD of an
	// earlier release, checkIssuedAt): from then on every admission is
	// recorded first.
	recordFirst                      bool
	issuedAtChecked, issuedAtDropped atomic.Bool

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
	keys    tokenKeys
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
	// adopting is set until the sessions in walSessions are re-adopted:
	// meanwhile the harness API answers 503 (retry), not 404, for a
	// session it does not hold yet.
	adopting atomic.Bool
	// harnessAnswered is when the harness last answered a request (unix
	// nanoseconds; 0: never): the gate's reachability check trusts it for
	// harnessFresh.
	harnessAnswered atomic.Int64
	lease           *lease.Keeper
	leases          *lease.Observer // other replicas' Leases, on this clock
	ckpt            *checkpoint.Store
	drainOnce       sync.Once
	drained         chan struct{}
	stopConsume     context.CancelFunc

	consuming   flag
	inflight    sync.WaitGroup // deliveries being processed
	sessionsWG  sync.WaitGroup // session confirmers
	mu          sync.Mutex
	sessions    map[string]*sess         // sessions of this replica, running or recently ended
	deciding    map[string]chan struct{} // task_submits being decided here, by session id
	shuttingDn  bool
	podGoneWarn sync.Once
	// goneSince is when a replica was first seen with neither a pod nor a
	// Lease (ownerAlive); under mu.
	goneSince map[string]time.Time
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
	keys, err := loadTokenKeys(o, o.Log)
	if err != nil {
		errs = append(errs, fmt.Errorf("callee: %w", err))
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
	if o.Timeouts.LostOwnerGrace <= 0 {
		o.Timeouts.LostOwnerGrace = lease.DefaultDuration
		if o.Lease != nil {
			o.Timeouts.LostOwnerGrace = o.Lease.Duration()
		}
	}
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
		cfg:       o.Config,
		id:        o.Config.ID,
		ns:        o.Config.Namespace,
		pod:       pod,
		username:  username,
		harness:   hu,
		c:         o.Client,
		reader:    o.Reader,
		infs:      o.Cache,
		conn:      o.Conn,
		pub:       o.Publisher,
		cons:      o.Consumer,
		st:        o.Status,
		m:         o.Metrics,
		log:       o.Log,
		clk:       o.Clock,
		keys:      keys,
		http:      o.HTTPClient,
		t:         o.Timeouts,
		sessions:  map[string]*sess{},
		goneSince: map[string]time.Time{},
		deciding:  map[string]chan struct{}{},

		wal:         wl,
		walSessions: walSessions,
		lease:       o.Lease,
		leases:      lease.NewObserver(o.Clock),
		ckpt: &checkpoint.Store{C: o.Client, R: o.Reader, Namespace: o.Config.Namespace, CalleeID: o.Config.ID, CalleeName: o.Config.ObjectName,
			Signer: keys.signer, Verifiers: keys.verifiers},
		drained:     make(chan struct{}),
		rec:         o.Recorder,
		rejections:  lru.New(rejectionsRemembered),
		recordFirst: o.RecordBeforeReply,
	}
	s.setupStatusWriter(o.Status)
	s.life, s.stopLife = context.WithCancel(context.Background())
	s.handler = s.routes()
	s.adopting.Store(len(walSessions) > 0)
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
	// Ready only once the broker accepted the subscription: a pod that
	// cannot subscribe (no queue, no permission) takes no traffic.
	if !s.cons.Subscribed(topology.CommandQueue(s.id)) {
		return fmt.Errorf("not subscribed to %s yet", topology.CommandQueue(s.id))
	}
	return nil
}

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
