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
