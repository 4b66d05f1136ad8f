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
//
// # Where things are
//
//	benchutil.go  Topology, Config and Result of a run
//	rawamqp.go    RawAMQP091: the baseline itself
//	recorder.go   Recorder: message stamps and latencies of a run
//	load.go       message bodies and a pace
//	compare.go    runners interleaved, and the median of their runs
//	roundtrip.go  request round trips and their latencies
//	cpu.go        CPU of the process and of the RabbitMQ node
//	apiwrites.go  the API server's write counts
package benchutil

import (
	"fmt"
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
	// Body, if set, is every message's body (BodySize is then ignored),
	// and Headers are added to each message's stamp headers: a benchmark
	// gives the raw baseline the same bodies and headers as the system it
	// compares with it.
	Body    []byte
	Headers amqp.Table
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
	// CPU is what the run cost the processor, this process and the
	// broker: from Recorder.Start to the last message's arrival (the timed
	// window, no set-up or tear-down), or, for a runner whose recorder did
	// not measure it, the whole run as Interleave samples it.
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
	s := fmt.Sprintf("%d msgs in %v: %.0f msgs/s, p50 %v, p99 %v, %d duplicates", r.Messages, r.Elapsed.Round(time.Millisecond),
		r.Throughput(), r.Percentile(0.5).Round(time.Microsecond), r.Percentile(0.99).Round(time.Microsecond), r.Duplicates)
	if p := r.Pressure(); p > 0 {
		s += fmt.Sprintf(", CPU pressure %.0f%%", 100*p)
	}
	return s
}

// Pressure is the share of the run's elapsed time in which some runnable
// task on the machine waited for a processor (CPU.Waited; 0 unknown).
func (r Result) Pressure() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.CPU.Waited) / float64(r.Elapsed)
}
