package benchutil

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Runner moves cfg.Messages messages from a publisher to a consumer and
// measures it: RawAMQP091, or the system compared with it.
type Runner func(ctx context.Context, cfg Config) (Result, error)

// Summary is the median of several runs' figures, with their spread.
type Summary struct {
	Runs       int
	Throughput float64 // msgs/s
	P50, P99   time.Duration
	// CPUPerMessage: this process's and the broker's, each the median.
	CPUPerMessage CPU
	// The spread over the runs: lowest and highest.
	ThroughputMin, ThroughputMax float64
	P99Min, P99Max               time.Duration
	SelfCPUMin, SelfCPUMax       time.Duration // per message
	// Pressure is the median of the runs' Result.Pressure.
	Pressure float64
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
	pressure := make([]float64, len(rs))
	for i, r := range rs {
		tp[i], p50[i], p99[i], pressure[i] = r.Throughput(), r.Percentile(0.5), r.Percentile(0.99), r.Pressure()
		c := r.CPUPerMessage()
		self[i], broker[i] = c.Self, c.Broker
	}
	for _, s := range [][]time.Duration{p50, p99, self, broker} {
		slices.Sort(s)
	}
	slices.Sort(tp)
	slices.Sort(pressure)
	m := len(rs) / 2
	s.Throughput, s.P50, s.P99, s.Pressure = tp[m], p50[m], p99[m], pressure[m]
	s.CPUPerMessage = CPU{Self: self[m], Broker: broker[m]}
	last := len(rs) - 1
	s.ThroughputMin, s.ThroughputMax = tp[0], tp[last]
	s.P99Min, s.P99Max = p99[0], p99[last]
	s.SelfCPUMin, s.SelfCPUMax = self[0], self[last]
	return s
}

func (s Summary) String() string {
	return fmt.Sprintf("median of %d runs (lowest–highest): %.0f msgs/s (%.0f–%.0f), p50 %v, p99 %v (%v–%v), CPU per message: this process %v (%v–%v), broker %v",
		s.Runs, s.Throughput, s.ThroughputMin, s.ThroughputMax,
		s.P50.Round(time.Microsecond), s.P99.Round(time.Microsecond), s.P99Min.Round(time.Microsecond), s.P99Max.Round(time.Microsecond),
		s.CPUPerMessage.Self.Round(100*time.Nanosecond), s.SelfCPUMin.Round(100*time.Nanosecond), s.SelfCPUMax.Round(100*time.Nanosecond),
		s.CPUPerMessage.Broker.Round(100*time.Nanosecond)) + fmt.Sprintf(", CPU pressure %.0f%%", 100*s.Pressure)
}

// Interleave runs every runner rounds times, alternating between them in
// an order that rotates each round (a, b, c; b, c, a; c, a, b; …: RunOrder)
// so that neither drifting machine load (other builds on a shared host)
// nor the position in a round (caches, the broker's backlog of the run
// before) biases any of them, and returns the results per runner. config
// is called before each run, to give it fresh topology. A run's CPU is
// its recorder's (the timed window); where a runner left it zero, the
// whole run's.
func Interleave(ctx context.Context, rounds int, runners map[string]Runner, config func(runner string) (Config, error)) (map[string][]Result, error) {
	names := make([]string, 0, len(runners))
	for n := range runners {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make(map[string][]Result, len(runners))
	for i := 0; i < rounds; i++ {
		for _, n := range RunOrder(names, i) {
			cfg, err := config(n)
			if err != nil {
				return out, err
			}
			before := SampleCPU()
			r, err := runners[n](ctx, cfg)
			if err != nil {
				return out, fmt.Errorf("%s, round %d: %w", n, i+1, err)
			}
			if r.CPU == (CPU{}) {
				r.CPU = SampleCPU().Sub(before)
			}
			out[n] = append(out[n], r)
		}
	}
	return out, nil
}

// RunOrder is the order of names in round i (from 0): rotated left by i.
func RunOrder(names []string, round int) []string {
	if len(names) == 0 {
		return nil
	}
	k := round % len(names)
	return append(slices.Clone(names[k:]), names[:k]...)
}
