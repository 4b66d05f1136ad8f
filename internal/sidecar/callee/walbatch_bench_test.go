package callee

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// BenchmarkPublishEvents is one harness request of batch=N events through
// the callee's publish path with its write-ahead log on disk (a state
// directory in the system's temporary directory) and a publisher that
// confirms at once: sequencing, encoding, the log, the publish and the
// confirm hand-off (every 64th confirm recorded in the log), without the
// broker and HTTP. cpu-µs/event is this
// process's user+sys time over the timed loop per event.
//
//	go test -run '^$' -bench BenchmarkPublishEvents -count 6 ./internal/sidecar/callee
func BenchmarkPublishEvents(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			log, _, err := wal.Open(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = log.Release() }()
			s := &Sidecar{pub: nopPublisher{}, m: metrics.New(prometheus.NewRegistry()), username: "callee.lab@/hcp",
				wal: log, st: status.New(status.Options{}), clk: clock.RealClock{}, life: context.Background(), sessions: map[string]*sess{}}
			const sid = "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10"
			m, err := session.New(time.Now()).Apply(session.StateRunning, "started", time.Now())
			if err != nil {
				b.Fatal(err)
			}
			ss := &sess{sc: s, id: sid, callerID: "alpha", lock: make(chan struct{}, 1),
				machine: m, seq: session.NewSequencer(0), confirmDone: make(chan struct{})}
			s.register(ss) // its confirm loop records every 64th confirm, and the last
			evs := make([]harnessEvent, n)
			for i := range evs {
				evs[i] = harnessEvent{EventType: session.EventProgress, Data: json.RawMessage(`{"stage":"heating","percent":40,"message":"` + fmt.Sprint(i) + `"}`)}
			}
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := benchutil.SampleCPU().Self
			b.ResetTimer()
			for range b.N {
				if _, _, e := ss.publishEvents(ctx, evs); e != nil {
					b.Fatal(e)
				}
			}
			b.StopTimer()
			cpu := benchutil.SampleCPU().Self - cpu0
			ss.closeConfirms()
			<-ss.confirmDone
			b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N*n), "cpu-µs/event")
			b.ReportMetric(float64(log.MessageWrites())/float64(b.N*n), "writes/event")
		})
	}
}
