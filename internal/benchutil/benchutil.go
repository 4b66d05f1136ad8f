// Package benchutil is the raw amqp091-go baseline that the project's
// performance claims are measured against (DESIGN.md section 7), plus the
// latency recorder and message stamping shared by the benchmarks that
// compare against it: internal/transport's and the sidecar relay's.
//
// The baseline publishes persistent messages with mandatory set, publisher
// confirms and a window of Window deferred confirms, and consumes them with
// manual, cumulative acks and basic.qos(Prefetch), publisher and consumer on separate
// connections (in HCP they are different processes). Latency is measured
// from just before the publish to the consumer's receipt, in one process on
// one clock.
package benchutil

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Headers that stamp a benchmark message.
const (
	HeaderRun  = "x-bench-run"  // string: the run a message belongs to
	HeaderSeq  = "x-bench-seq"  // int64: 0…Messages-1
	HeaderSent = "x-bench-sent" // int64: UnixNano just before publishing
)

// Defaults: the strongest baseline raw amqp091-go gives within L1's
// limits (prefetch 1–100): the largest prefetch, a deep confirm window,
// cumulative acks. The relay is measured with the same prefetch.
const (
	DefaultWindow   = 1024
	DefaultPrefetch = 100
	DefaultBodySize = 512
)

// Topology is what a benchmark publishes to and consumes from.
type Topology struct {
	Exchange     string // declared durable with ExchangeKind
	ExchangeKind string // default "topic", like hcp.events
	RoutingKey   string // used for publishing
	BindingKey   string // default RoutingKey
	Queue        string // declared durable, x-queue-type quorum
}

func (t Topology) withDefaults() Topology {
	if t.ExchangeKind == "" {
		t.ExchangeKind = amqp.ExchangeTopic
	}
	if t.BindingKey == "" {
		t.BindingKey = t.RoutingKey
	}
	return t
}

// DeclareTopology declares t's exchange, quorum queue and binding on url
// (idempotent).
func DeclareTopology(url string, t Topology) error {
	t = t.withDefaults()
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.ExchangeDeclare(t.Exchange, t.ExchangeKind, true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return err
	}
	return ch.QueueBind(t.Queue, t.BindingKey, t.Exchange, false, nil)
}

// Config is one measured run.
type Config struct {
	URL string
	Topology
	// Messages to publish (all must be consumed).
	Messages int
	// BodySize in bytes (default DefaultBodySize, about an HCP event).
	BodySize int
	// Window of unconfirmed publishes (default DefaultWindow).
	Window int
	// Prefetch of the consumer (default DefaultPrefetch).
	Prefetch int
	// Rate limits publishing to this many messages per second; 0 publishes
	// as fast as the window allows (a throughput run, whose latency
	// includes queueing).
	Rate float64
	// OnStart, if set, is called just before the first publish (after
	// connecting and subscribing): a benchmark passes b.ResetTimer.
	OnStart func()
}

func (c Config) withDefaults() Config {
	c.Topology = c.Topology.withDefaults()
	if c.BodySize <= 0 {
		c.BodySize = DefaultBodySize
	}
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.Prefetch <= 0 {
		c.Prefetch = DefaultPrefetch
	}
	return c
}

// Result of a run.
type Result struct {
	Messages   int
	Duplicates int
	// Elapsed is from the first publish to the last message consumed.
	Elapsed time.Duration
	// Latencies, sorted ascending, one per distinct message.
	Latencies []time.Duration
	// CPU is what the run cost the processor (Interleave measures it):
	// this process and the broker, set-up and tear-down included.
	CPU CPU
}

// CPUPerMessage is the run's CPU per message consumed.
func (r Result) CPUPerMessage() CPU {
	if r.Messages == 0 {
		return CPU{}
	}
	n := time.Duration(r.Messages)
	return CPU{Self: r.CPU.Self / n, Broker: r.CPU.Broker / n}
}

// Throughput is messages consumed per second.
func (r Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Messages) / r.Elapsed.Seconds()
}

// Percentile returns the q-quantile (0 < q ≤ 1) latency, nearest rank.
func (r Result) Percentile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(q*float64(len(r.Latencies))+0.5) - 1
	i = max(0, min(i, len(r.Latencies)-1))
	return r.Latencies[i]
}

// Report adds msgs/s, p50-ms and p99-ms to b's output.
func (r Result) Report(b *testing.B) {
	b.ReportMetric(r.Throughput(), "msgs/s")
	b.ReportMetric(float64(r.Percentile(0.50))/float64(time.Millisecond), "p50-ms")
	b.ReportMetric(float64(r.Percentile(0.99))/float64(time.Millisecond), "p99-ms")
}

func (r Result) String() string {
	return fmt.Sprintf("%d msgs in %v: %.0f msgs/s, p50 %v, p99 %v, %d duplicates", r.Messages, r.Elapsed.Round(time.Millisecond),
		r.Throughput(), r.Percentile(0.5).Round(time.Microsecond), r.Percentile(0.99).Round(time.Microsecond), r.Duplicates)
}

// Recorder collects the latency of each distinct message of a run.
type Recorder struct {
	run   string
	n     int
	mu    sync.Mutex
	start time.Time
	end   time.Time
	seen  []bool
	lat   []time.Duration
	dups  int
	done  chan struct{}
}

// NewRecorder expects messages 0…n-1 of run.
func NewRecorder(run string, n int) *Recorder {
	return &Recorder{run: run, n: n, seen: make([]bool, n), lat: make([]time.Duration, 0, n), done: make(chan struct{})}
}

// Start marks the beginning of the run.
func (r *Recorder) Start() {
	r.mu.Lock()
	r.start = time.Now()
	r.mu.Unlock()
}

// Stamp returns headers marking message seq of the run as sent now; merge
// them into the publishing's headers just before publishing.
func (r *Recorder) Stamp(seq int) amqp.Table {
	return amqp.Table{HeaderRun: r.run, HeaderSeq: int64(seq), HeaderSent: time.Now().UnixNano()}
}

// ObserveHeaders records a message from its stamp headers; messages of
// other runs are ignored. It reports whether the message belonged to the
// run.
func (r *Recorder) ObserveHeaders(h amqp.Table) bool {
	run, _ := h[HeaderRun].(string)
	seq, ok1 := h[HeaderSeq].(int64)
	sent, ok2 := h[HeaderSent].(int64)
	if run != r.run || !ok1 || !ok2 {
		return false
	}
	r.Observe(int(seq), time.Unix(0, sent))
	return true
}

// Observe records message seq, sent at sent, as received now.
func (r *Recorder) Observe(seq int, sent time.Time) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq < 0 || seq >= r.n {
		return
	}
	if r.seen[seq] {
		r.dups++
		return
	}
	r.seen[seq] = true
	r.lat = append(r.lat, now.Sub(sent))
	if len(r.lat) == r.n {
		r.end = now
		close(r.done)
	}
}

// Done is closed once every message was observed.
func (r *Recorder) Done() <-chan struct{} { return r.done }

// Received is the number of distinct messages observed.
func (r *Recorder) Received() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lat)
}

// Missing returns up to max messages not observed yet, lowest first.
func (r *Recorder) Missing(limit int) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for seq, ok := range r.seen {
		if !ok && len(out) < limit {
			out = append(out, seq)
		}
	}
	return out
}

// Result summarises the run; call it after Done.
func (r *Recorder) Result() Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	lat := slices.Clone(r.lat)
	slices.Sort(lat)
	end := r.end
	if end.IsZero() {
		end = time.Now()
	}
	return Result{Messages: len(lat), Duplicates: r.dups, Elapsed: end.Sub(r.start), Latencies: lat}
}

// Body returns a JSON body of about size bytes, shaped like an HCP event.
func Body(size int) []byte {
	const head = `{"hcp_version":"1.0","type":"event","payload":{"data":"`
	const tail = `"}}`
	n := max(0, size-len(head)-len(tail))
	b := make([]byte, 0, len(head)+n+len(tail))
	b = append(b, head...)
	for i := 0; i < n; i++ {
		b = append(b, 'x')
	}
	return append(b, tail...)
}

// Pacer spaces publishes at a fixed rate (no-op when rate is 0).
type Pacer struct {
	interval time.Duration
	next     time.Time
}

// NewPacer paces at rate per second.
func NewPacer(rate float64) *Pacer {
	if rate <= 0 {
		return &Pacer{}
	}
	return &Pacer{interval: time.Duration(float64(time.Second) / rate)}
}

// Wait blocks until the next publish is due.
func (p *Pacer) Wait(ctx context.Context) error {
	if p.interval == 0 {
		return ctx.Err()
	}
	now := time.Now()
	if p.next.IsZero() {
		p.next = now
	}
	if d := p.next.Sub(now); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	p.next = p.next.Add(p.interval)
	return nil
}

var runSeq struct {
	sync.Mutex
	n int
}

// NewRunID returns an id unique in the process, for Recorder.
func NewRunID(prefix string) string {
	runSeq.Lock()
	defer runSeq.Unlock()
	runSeq.n++
	return prefix + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.Itoa(runSeq.n)
}

// RawAMQP091 runs the baseline with plain amqp091-go and returns its result.
func RawAMQP091(ctx context.Context, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	if cfg.Messages <= 0 {
		return Result{}, errors.New("benchutil: Messages must be positive")
	}
	rec := NewRecorder(NewRunID("raw"), cfg.Messages)

	consConn, cch, err := DialChannel(cfg.URL, "bench-raw-consumer")
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = consConn.Close() }()
	if err := cch.Qos(cfg.Prefetch, 0, false); err != nil {
		return Result{}, err
	}
	deliveries, err := cch.Consume(cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return Result{}, err
	}
	consErr := make(chan error, 1)
	go func() {
		// Acks are cumulative (multiple=true): one per burst of deliveries
		// taken, at the latest every half window, the fewest frames a raw
		// consumer can send without holding the window.
		var unacked int
		for d := range deliveries {
			rec.ObserveHeaders(d.Headers)
			unacked++
			if len(deliveries) > 0 && unacked < max(cfg.Prefetch/2, 1) {
				continue
			}
			if err := d.Ack(true); err != nil {
				consErr <- err
				return
			}
			unacked = 0
		}
	}()

	pubConn, pch, err := DialChannel(cfg.URL, "bench-raw-publisher")
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = pubConn.Close() }()
	if err := pch.Confirm(false); err != nil {
		return Result{}, err
	}
	returns := pch.NotifyReturn(make(chan amqp.Return, 16))
	returned := make(chan amqp.Return, 1)
	go func() {
		for r := range returns {
			select {
			case returned <- r:
			default:
			}
		}
	}()

	body := Body(cfg.BodySize)
	pacer := NewPacer(cfg.Rate)
	window := make([]*amqp.DeferredConfirmation, 0, cfg.Window)
	waitOldest := func() error {
		dc := window[0]
		window = window[1:]
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("benchutil: publish nacked")
		}
		return nil
	}
	if cfg.OnStart != nil {
		cfg.OnStart()
	}
	rec.Start()
	for i := 0; i < cfg.Messages; i++ {
		if err := pacer.Wait(ctx); err != nil {
			return Result{}, err
		}
		if len(window) == cfg.Window {
			if err := waitOldest(); err != nil {
				return Result{}, err
			}
		}
		dc, err := pch.PublishWithDeferredConfirmWithContext(ctx, cfg.Exchange, cfg.RoutingKey, true, false, amqp.Publishing{
			ContentType:     "application/json",
			ContentEncoding: "utf-8",
			DeliveryMode:    amqp.Persistent,
			MessageId:       strconv.Itoa(i),
			Type:            "event",
			Headers:         rec.Stamp(i),
			Body:            body,
		})
		if err != nil {
			return Result{}, err
		}
		window = append(window, dc)
	}
	for len(window) > 0 {
		if err := waitOldest(); err != nil {
			return Result{}, err
		}
	}
	select {
	case <-rec.Done():
	case r := <-returned:
		return Result{}, fmt.Errorf("benchutil: message returned: %d %s (is queue %s bound with %q?)", r.ReplyCode, r.ReplyText, cfg.Queue, cfg.RoutingKey)
	case err := <-consErr:
		return Result{}, err
	case <-ctx.Done():
		return Result{}, fmt.Errorf("benchutil: %d of %d messages consumed: %w", rec.Received(), cfg.Messages, ctx.Err())
	}
	return rec.Result(), nil
}

// DialChannel opens a connection to url named name (as the management UI
// shows it) and a channel on it; the caller closes the connection.
func DialChannel(url, name string) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Heartbeat: 30 * time.Second, Properties: connName(name)})
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

func connName(n string) amqp.Table {
	p := amqp.NewConnectionProperties()
	p.SetClientConnectionName(n)
	return p
}

// Runner moves cfg.Messages messages from a publisher to a consumer and
// measures it: RawAMQP091, or the system compared with it.
type Runner func(ctx context.Context, cfg Config) (Result, error)

// Summary is the median of several runs' figures.
type Summary struct {
	Runs       int
	Throughput float64 // msgs/s
	P50, P99   time.Duration
	// CPUPerMessage: this process's and the broker's, each the median.
	CPUPerMessage CPU
}

// Summarize takes the median of each figure over rs.
func Summarize(rs []Result) Summary {
	s := Summary{Runs: len(rs)}
	if len(rs) == 0 {
		return s
	}
	tp := make([]float64, len(rs))
	p50 := make([]time.Duration, len(rs))
	p99 := make([]time.Duration, len(rs))
	self := make([]time.Duration, len(rs))
	broker := make([]time.Duration, len(rs))
	for i, r := range rs {
		tp[i], p50[i], p99[i] = r.Throughput(), r.Percentile(0.5), r.Percentile(0.99)
		c := r.CPUPerMessage()
		self[i], broker[i] = c.Self, c.Broker
	}
	for _, s := range [][]time.Duration{p50, p99, self, broker} {
		slices.Sort(s)
	}
	slices.Sort(tp)
	m := len(rs) / 2
	s.Throughput, s.P50, s.P99 = tp[m], p50[m], p99[m]
	s.CPUPerMessage = CPU{Self: self[m], Broker: broker[m]}
	return s
}

func (s Summary) String() string {
	return fmt.Sprintf("median of %d runs: %.0f msgs/s, p50 %v, p99 %v, CPU per message: this process %v, broker %v", s.Runs, s.Throughput,
		s.P50.Round(time.Microsecond), s.P99.Round(time.Microsecond), s.CPUPerMessage.Self.Round(100*time.Nanosecond), s.CPUPerMessage.Broker.Round(100*time.Nanosecond))
}

// Interleave runs every runner rounds times, alternating between them
// (raw, sut, raw, sut, …) so that drifting machine load (other builds on a
// shared host) biases none of them, and returns the results per runner.
// config is called before each run, to give it fresh topology.
func Interleave(ctx context.Context, rounds int, runners map[string]Runner, config func(runner string) (Config, error)) (map[string][]Result, error) {
	names := make([]string, 0, len(runners))
	for n := range runners {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make(map[string][]Result, len(runners))
	for i := 0; i < rounds; i++ {
		for _, n := range names {
			cfg, err := config(n)
			if err != nil {
				return out, err
			}
			before := SampleCPU()
			r, err := runners[n](ctx, cfg)
			if err != nil {
				return out, fmt.Errorf("%s, round %d: %w", n, i+1, err)
			}
			r.CPU = SampleCPU().Sub(before)
			out[n] = append(out[n], r)
		}
	}
	return out, nil
}
