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
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Sidecar is the caller-mode sidecar.
type Sidecar struct {
	cfg  *config.Config
	o    Options
	log  logr.Logger
	m    *metrics.Metrics
	clk  clock.WithTickerAndDelayedExecution
	http *http.Client
	// appConns, if not nil, carries the POSTs to the app instead of http
	// (see appConns).
	appConns *appConns
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
	// acks are the deliveries waiting for a group commit, by ticket (see
	// ackAfter).
	ackMu sync.Mutex
	acks  []*ackBatch
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
	// appStreams: stream delivery to the app (appstream.go).
	appStreams streamState
	// answered holds task message ids whose answer has arrived (even if not
	// yet delivered to the app), so they are not republished.
	answered map[string]bool
	// lookups caches HCPSession reads.
	lookups map[string]lookup
	// parked holds what the idle workers that exited while parkedOn (a
	// consumer channel's context) lived left for the next (seed.go, park).
	parked   map[string]parkedWorker
	parkedOn context.Context
	// positions holds, per session, the callerAckedSequence this sidecar
	// has asked the status writer to record and not yet seen written (see
	// flushPositions).
	positions map[string]int64
	// submitMu serialises the check-and-create of a task_submit record.
	submitMu sync.Mutex
	// elsewhere logs once that HCPSessions are not in this namespace.
	elsewhere sync.Once
	// writers are the status writers of other namespaces (Options.StatusIn).
	writers map[string]StatusWriter
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
		writers:   map[string]StatusWriter{},
		runCtx:    context.Background(),
		stopCh:    make(chan struct{}),
	}
	if opts.HTTPClient == nil {
		s.appConns = newAppConns(c.HarnessURL)
	}
	s.m.AppBatchMax.Set(float64(s.batchLimit()))
	if s.store == nil {
		st, err := OpenStore(c.StateDir)
		if err != nil {
			return nil, fmt.Errorf("caller sidecar: %w", err)
		}
		st.SetCommitLinger(o.CommitLinger)
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

// ctx returns the run context (Background before Run).
func (s *Sidecar) ctx() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runCtx
}
