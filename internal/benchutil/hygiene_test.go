package benchutil

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

func spin(d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
	}
}

// spinCPU spins until this process has used d more of processor time: on
// a loaded machine a wall-clock spin gets only part of its time.
func spinCPU(d time.Duration) {
	for start := SampleCPU().Self; SampleCPU().Self-start < d; {
	}
}

// The run order rotates each round, so that no runner always goes first.
func TestInterleaveRotatesTheRunOrder(t *testing.T) {
	var order []string
	runner := func(name string) Runner {
		return func(context.Context, Config) (Result, error) {
			order = append(order, name)
			return Result{Messages: 1, Elapsed: time.Millisecond}, nil
		}
	}
	_, err := Interleave(t.Context(), 4, map[string]Runner{"raw": runner("raw"), "relay": runner("relay"), "floor": runner("floor")},
		func(string) (Config, error) { return Config{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"floor", "raw", "relay", "raw", "relay", "floor", "relay", "floor", "raw", "floor", "raw", "relay"}
	if !slices.Equal(order, want) {
		t.Fatalf("run order %v, want %v", order, want)
	}
}

// A run's CPU covers Recorder.Start to the last message's arrival: the
// set-up before and the tear-down after are left out.
func TestRecorderSamplesCPUOverTheTimedWindowOnly(t *testing.T) {
	var rec *Recorder
	res, err := Interleave(t.Context(), 1, map[string]Runner{"sut": func(context.Context, Config) (Result, error) {
		rec = NewRecorder(NewRunID("cpu"), 1)
		spinCPU(150 * time.Millisecond) // set-up
		rec.Start()
		spinCPU(30 * time.Millisecond)
		rec.ObserveHeaders(rec.Stamp(0))
		spinCPU(150 * time.Millisecond) // tear-down
		return rec.Result(), nil
	}}, func(string) (Config, error) { return Config{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	got := res["sut"][0].CPU.Self
	if got < 10*time.Millisecond || got > 120*time.Millisecond {
		t.Fatalf("CPU of a 30 ms timed window between 150 ms of set-up and of tear-down: %v", got)
	}
}

func TestSummaryPrintsTheSpread(t *testing.T) {
	rs := []Result{
		{Messages: 100, Elapsed: time.Second, Latencies: []time.Duration{time.Millisecond}, CPU: CPU{Self: 100 * time.Millisecond}},
		{Messages: 100, Elapsed: 2 * time.Second, Latencies: []time.Duration{3 * time.Millisecond}, CPU: CPU{Self: 300 * time.Millisecond}},
		{Messages: 100, Elapsed: time.Second / 2, Latencies: []time.Duration{2 * time.Millisecond}, CPU: CPU{Self: 200 * time.Millisecond}},
	}
	s := Summarize(rs)
	if s.ThroughputMin != 50 || s.ThroughputMax != 200 || s.P99Min != time.Millisecond || s.P99Max != 3*time.Millisecond ||
		s.SelfCPUMin != time.Millisecond || s.SelfCPUMax != 3*time.Millisecond {
		t.Fatalf("spread %+v", s)
	}
	if str := s.String(); !contains(str, "100 msgs/s (50–200)") || !contains(str, "p99 2ms (1ms–3ms)") {
		t.Fatalf("summary %q does not print the spread", str)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
