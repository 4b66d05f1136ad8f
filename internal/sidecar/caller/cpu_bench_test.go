package caller

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// BenchmarkCallerCPU is the caller sidecar's own CPU per event: the
// sidecar runs as a process of its own (TestHelperCallerSidecarProcess,
// prefetch 10, its state directory on disk), and this process publishes
// b.N events of sessions=N sessions (round robin, marked as the callee
// sidecar marks them, envelopes of about 512 bytes) to its event queue at
// rate=1000 events/s or as fast as it takes them (rate=max), and serves the
// app (samplecaller.Recorder, one POST per event). cpu-µs/event is the
// sidecar process's user+sys time (/proc/PID/stat) from the first publish
// until the app has every event and 100 ms more (the last acks), divided
// by b.N; events/s is b.N over the time until the app has them all;
// p50-ms and p99-ms are from each publish to the app's receipt. The
// framework's probe run (b.N = 1) does nothing. With
// HCP_CALLER_SIDECAR_HELPER_CPUPROFILE=file the sidecar process writes its
// CPU profile there (run one sub-benchmark); HCP_CALLER_BENCH_PREFETCH
// sets the sidecar's prefetch (the relay benchmark's is 100).
//
// The app takes one POST per event unless the name starts with app=batch
// (it offers HCP-Batch-Max: 100, so the events ready together go in one
// POST) or app=stream (it offers HCP-Stream and batches: every delivery is
// a line of one long-lived request), the relay benchmark's app modes.
//
//	go test -run '^$' -bench BenchmarkCallerCPU -benchtime 5000x -count 6 ./internal/sidecar/caller
func BenchmarkCallerCPU(b *testing.B) {
	for _, tc := range []struct {
		app      string
		rate     float64
		sessions int
	}{{"single", 1000, 1}, {"single", 1000, 10}, {"single", 0, 1},
		{"batch", 1000, 1}, {"batch", 1000, 10}, {"stream", 1000, 1}, {"stream", 1000, 10}, {"stream", 0, 1}} {
		rate := "max"
		if tc.rate > 0 {
			rate = fmt.Sprint(tc.rate)
		}
		name := fmt.Sprintf("rate=%s/sessions=%d", rate, tc.sessions)
		if tc.app != "single" {
			name = "app=" + tc.app + "/" + name
		}
		b.Run(name, func(b *testing.B) {
			benchCallerCPU(b, tc.app, tc.rate, tc.sessions)
		})
	}
}

func benchCallerCPU(b *testing.B, app string, rate float64, sessions int) {
	if b.N == 1 {
		return
	}
	bd := newBed(b, "lab")
	switch app {
	case "batch":
		bd.app.OfferBatches(100)
	case "stream":
		bd.app.OfferBatches(100)
		bd.app.OfferStream()
	}
	var env []string
	if path := os.Getenv(profileEnv); path != "" {
		env = append(env, profileEnv+"="+path)
	}
	if v := os.Getenv("HCP_CALLER_BENCH_PREFETCH"); v != "" {
		env = append(env, config.EnvPrefetch+"="+v)
	}
	p := bd.spawnWith(b, 0, bd.amqpURL(bd.caller), env...)
	c := bd.callee("lab")
	sids := make([]string, sessions)
	for i := range sids {
		v := p.submit(b, taskReq("lab"))
		s := newScript(b, "lab", v.MessageID, 2)
		sids[i] = s.sessionID
		c.publish(s.msgs[0]) // task_accepted
	}
	eventually(b, 30*time.Second, "every task_accepted at the app", func() error {
		if n := bd.app.Snapshot().Total; n != sessions {
			return fmt.Errorf("%d of %d", n, sessions)
		}
		return nil
	})
	pubs := make([]amqp.Publishing, b.N)
	keys := make([]string, b.N)
	pad := strings.Repeat("x", 240) // an envelope of about 512 bytes
	for i := range pubs {
		sid, seq := sids[i%sessions], int64(i/sessions+2)
		pct := float64(i) * 100 / float64(b.N)
		env, err := envelope.New(envelope.TypeEvent, sid, mustEvent(b, seq, &session.ProgressData{Stage: "step", Percent: &pct, Message: pad}))
		if err != nil {
			b.Fatal(err)
		}
		if pubs[i], err = envelope.EncodePublishing(env, c.u.name); err != nil {
			b.Fatal(err)
		}
		envelope.SetConfirmedThrough(&pubs[i], seq-1)
		keys[i] = topology.EventRoutingKey(bd.callerID, sid, envelope.TypeEvent)
	}
	// Sequence 1 of each session, so that the timed events follow on.
	for _, sid := range sids {
		env, err := envelope.New(envelope.TypeEvent, sid, mustEvent(b, 1, &session.ProgressData{Stage: "start"}))
		if err != nil {
			b.Fatal(err)
		}
		c.publish(env)
	}
	conn, err := amqp.Dial(bd.amqpURL(c.u))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	want := 2 * sessions
	eventually(b, 30*time.Second, "every first event at the app", func() error {
		if n := bd.app.Snapshot().Total; n != want {
			return fmt.Errorf("%d of %d", n, want)
		}
		return nil
	})
	want += b.N
	pid := p.cmd.Process.Pid
	pace := benchutil.NewPacer(rate)
	ctx := context.Background()
	sent := make([]time.Time, b.N)
	b.ResetTimer()
	cpu0, start := procTime(b, pid), time.Now()
	go func() {
		for i := range pubs {
			if pace.Wait(ctx) != nil {
				return
			}
			sent[i] = time.Now()
			if ch.PublishWithContext(ctx, topology.EventsExchange, keys[i], false, false, pubs[i]) != nil {
				return
			}
		}
	}()
	eventually(b, 10*time.Minute, "every event at the app", func() error {
		if n := bd.app.Snapshot().Total; n < want {
			return fmt.Errorf("%d of %d", n, want)
		}
		return nil
	})
	took := time.Since(start)
	time.Sleep(100 * time.Millisecond)
	cpu := procTime(b, pid) - cpu0
	b.StopTimer()
	snap := bd.app.Snapshot()
	if snap.Duplicates != 0 || snap.Problems != 0 || snap.Total != want {
		b.Fatalf("the app got %d messages (want %d), %d duplicates, %d problems", snap.Total, want, snap.Duplicates, snap.Problems)
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/event")
	b.ReportMetric(float64(b.N)/took.Seconds(), "events/s")
	// Latency: from the publish to the app's receipt.
	var lat benchutil.Latencies
	for si, sid := range sids {
		for _, m := range snap.Sessions[sid].Messages {
			if i := int(m.Sequence-2)*sessions + si; m.Type == "event" && m.Sequence >= 2 && i < b.N {
				lat = append(lat, m.At.Sub(sent[i]))
			}
		}
	}
	b.ReportMetric(float64(lat.Percentile(0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat.Percentile(0.99).Microseconds())/1000, "p99-ms")
	// A graceful stop, so that a CPU profile asked for is written.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_, _ = p.cmd.Process.Wait()
}

// procTime is the user+sys time of process pid so far.
func procTime(b *testing.B, pid int) time.Duration {
	d, err := benchutil.ProcessCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}
