package benchutil

import (
	"testing"
	"time"
)

func TestRecorder(t *testing.T) {
	r := NewRecorder("run-a", 3)
	r.Start()
	for _, seq := range []int{0, 2, 2, 1} {
		if !r.ObserveHeaders(r.Stamp(seq)) {
			t.Fatalf("stamp of seq %d not recognised", seq)
		}
	}
	other := NewRecorder("run-b", 3)
	if r.ObserveHeaders(other.Stamp(0)) {
		t.Error("a message of another run was recorded")
	}
	select {
	case <-r.Done():
	default:
		t.Fatal("Done not closed after every message was observed")
	}
	res := r.Result()
	if res.Messages != 3 || res.Duplicates != 1 || len(res.Latencies) != 3 || res.Elapsed <= 0 {
		t.Errorf("result %+v", res)
	}
}

func TestPercentileAndSummary(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	r := Result{Messages: 100, Elapsed: time.Second, Latencies: lat}
	if r.Percentile(0.5) != 50*time.Millisecond || r.Percentile(0.99) != 99*time.Millisecond || r.Throughput() != 100 {
		t.Errorf("p50 %v p99 %v throughput %v", r.Percentile(0.5), r.Percentile(0.99), r.Throughput())
	}
	slow := Result{Messages: 100, Elapsed: 2 * time.Second, Latencies: lat}
	fast := Result{Messages: 100, Elapsed: time.Second / 2, Latencies: lat}
	if s := Summarize([]Result{slow, fast, r}); s.Throughput != 100 || s.Runs != 3 {
		t.Errorf("summary %+v", s)
	}
	if n := len(Body(512)); n != 512 {
		t.Errorf("Body(512) has %d bytes", n)
	}
}

func TestSampleCPUCountsThisProcessAndTheBroker(t *testing.T) {
	before := SampleCPU()
	deadline := time.Now().Add(50 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	d := SampleCPU().Sub(before)
	if d.Self < 20*time.Millisecond {
		t.Fatalf("50 ms of spinning counted as %v of CPU (%d loops)", d.Self, x)
	}
	if brokerPID() == "" {
		t.Log("no RabbitMQ node on this machine: the broker's CPU is not measured")
		return
	}
	if c := SampleCPU(); c.Broker <= 0 {
		t.Fatalf("the broker's CPU reads %v", c.Broker)
	}
	if _, broker := PeakRSS(); broker <= 0 {
		t.Fatalf("the broker's peak RSS reads %d", broker)
	}
}

func TestSummarizeTakesTheMedianCPU(t *testing.T) {
	rs := []Result{
		{Messages: 100, Elapsed: time.Second, CPU: CPU{Self: 100 * time.Millisecond, Broker: 300 * time.Millisecond}},
		{Messages: 100, Elapsed: time.Second, CPU: CPU{Self: 900 * time.Millisecond, Broker: 100 * time.Millisecond}},
		{Messages: 100, Elapsed: time.Second, CPU: CPU{Self: 200 * time.Millisecond, Broker: 200 * time.Millisecond}},
	}
	if got := Summarize(rs).CPUPerMessage; got.Self != 2*time.Millisecond || got.Broker != 2*time.Millisecond {
		t.Fatalf("median CPU per message %+v, want 2ms each", got)
	}
}
