package benchutil

import (
	"syscall"
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
	// Spin until the kernel's own account (getrusage) says this process
	// used 50 ms more CPU: on shared cores wall time says nothing of it.
	before, used0 := SampleCPU(), rusageCPU(t)
	deadline := time.Now().Add(30 * time.Second)
	x := 0
	for rusageCPU(t)-used0 < 50*time.Millisecond && time.Now().Before(deadline) {
		for range 10000 {
			x++
		}
	}
	used := rusageCPU(t) - used0
	d := SampleCPU().Sub(before)
	if d.Self < used/2 {
		t.Fatalf("%v of CPU by getrusage counted as %v by SampleCPU (%d loops)", used, d.Self, x)
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

// rusageCPU is this process's user and system CPU time by getrusage(2).
func rusageCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestOnDefaultPort: the broker measured is the node on 5672, not a test
// cluster's node on a port of its own (hack/rabbitmq-cluster.sh), which
// a glob of /proc lists first when its process id sorts first.
func TestOnDefaultPort(t *testing.T) {
	for env, want := range map[string]bool{
		"HOME=/root\x00PATH=/bin":                                                     true,
		"RABBITMQ_NODE_PORT=5672\x00HOME=/root":                                       true,
		"RABBITMQ_NODENAME=hcp-r2@localhost\x00RABBITMQ_NODE_PORT=5702\x00HOME=/root": false,
		"": true,
	} {
		if got := onDefaultPort([]byte(env)); got != want {
			t.Errorf("onDefaultPort(%q) = %v, want %v", env, got, want)
		}
	}
}
