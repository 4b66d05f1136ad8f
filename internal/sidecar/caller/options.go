package caller

import (
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/transport"
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
	// DefaultSeedTimeout is how long a session without a local record waits
	// for its HCPSession to be readable before a warning is logged; it waits
	// on (held, nothing delivered or acked) until the HCPSession can be read.
	DefaultSeedTimeout = 30 * time.Second
	// DefaultFlushTimeout bounds how long a graceful stop (Run's ctx ended)
	// retries writing callerAckedSequence before the consumer's channel is
	// closed.
	DefaultFlushTimeout = 10 * time.Second
	// DefaultMaxAttempts is how many times the app may refuse an event (an
	// answer other than 2xx, or none within AppTimeout) before it is
	// dead-lettered (the Caller's spec.delivery.maxAttempts; see poison.go).
	DefaultMaxAttempts = 10
	// DefaultMaxGapWait is Options.MaxGapWait's default.
	DefaultMaxGapWait = 10 * time.Minute
	// DefaultCommitLinger is Options.CommitLinger's default.
	DefaultCommitLinger = 5 * time.Millisecond
	// DefaultWorkerIdle is Options.WorkerIdle's default.
	DefaultWorkerIdle = 10 * time.Second
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
	// StatusIn returns the writer of HCPSessions in another namespace (a
	// Callee's, where the operator lets this sidecar record its position:
	// resource.SessionReaderRole), called once per namespace; optional:
	// without it, the position of a session whose HCPSession is in another
	// namespace is durable in the local store only, and a new pod resumes
	// such a session from its first queued event.
	StatusIn func(namespace string) StatusWriter
	// StatusInterval is the minimum time between two callerAckedSequence
	// writes of one session; 0 means DefaultStatusInterval, < 0 leaves the
	// writer's own interval.
	StatusInterval time.Duration
	// Metrics; nil creates unregistered collectors.
	Metrics *metrics.Metrics
	Log     logr.Logger
	// Clock; nil means the real clock.
	Clock clock.WithTickerAndDelayedExecution
	// Recorder records the Warning Events of contradictions, stale owners
	// and dead letters (on the HCPSession, or the Caller); optional.
	Recorder record.EventRecorder
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
	// WorkerIdle is how long a session's worker that holds nothing lingers
	// after the session's last message before it exits, its goroutine and
	// state freed (a waiting session costs its records only); the
	// session's next message starts a new one from the store (stream.go).
	WorkerIdle time.Duration
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
	// AppStream sends every delivery (one message or a batch) as a line
	// of one long-lived full-duplex POST to the app's StreamPath, acked
	// line by line, from the first message on, whatever the app's answers
	// say; default cfg.AppStream. Without it the app may still offer a
	// stream (HeaderStream). The stream needs an HTTPClient without a
	// global timeout.
	AppStream bool
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
	// SeedTimeout is how long a session the local store has no record of
	// waits for its HCPSession before a warning is logged (see
	// DefaultSeedTimeout); it is held until the HCPSession can be read.
	SeedTimeout time.Duration
	// MaxGapWait bounds how long a gap may hold later events back, however
	// its marks and releases say it will fill (meanwhile the events behind
	// it go round the queue, and a broker delivery limit could drop them);
	// then it is given up (Lost reason gap_wait_limit). 0 means
	// DefaultMaxGapWait.
	MaxGapWait time.Duration
	// MaxAttempts is how many refusals of an event by the app dead-letter
	// it; 0 means cfg.AppMaxAttempts, or DefaultMaxAttempts.
	MaxAttempts int
	// FlushTimeout bounds the final callerAckedSequence writes of a
	// graceful stop (see DefaultFlushTimeout); Drain uses its own ctx.
	FlushTimeout time.Duration
	// CommitLinger is how long the store gathers the records of delivered
	// events before one write and fsync covers them all, and so how long
	// their acks may wait (see the package documentation, "Delivery
	// pipeline"): the next record after it carries the batch, or twice
	// it passes with none; 0 means DefaultCommitLinger, < 0 none (an fsync
	// as soon as the previous one returns). Records that something waits for
	// (answers, submits, a stop) and a prefetch window half full of
	// unsettled deliveries cut it short. It applies to the store opened from
	// Config.StateDir, not to Store.
	CommitLinger time.Duration
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
	o.AppStream = o.AppStream || c.AppStream
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
	if o.WorkerIdle <= 0 {
		o.WorkerIdle = DefaultWorkerIdle
	}
	if o.SeedTimeout <= 0 {
		o.SeedTimeout = DefaultSeedTimeout
	}
	if o.MaxGapWait <= 0 {
		o.MaxGapWait = DefaultMaxGapWait
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = c.AppMaxAttempts
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.FlushTimeout <= 0 {
		o.FlushTimeout = DefaultFlushTimeout
	}
	if o.CommitLinger == 0 {
		o.CommitLinger = DefaultCommitLinger
	}
	if o.StatusInterval == 0 {
		o.StatusInterval = DefaultStatusInterval
	}
	return o
}
