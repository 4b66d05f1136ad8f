package relay

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// benchMemory measures what live sessions cost in memory and goroutines:
// HCP_BENCH_MEMORY_SESSIONS (default 100,1000) sessions are started
// through the relay (each accepted, its task running at the harness, its
// session_created and state_changed delivered to the app) and left
// running; the heap in use after a GC, the process's resident memory
// (VmRSS, read after the freed memory was returned to the system), the
// goroutine count and, once their status writes are done, the CPU the
// process uses in 10 s while they wait are compared
// with the same bed before them. Both sidecars, the harness and the app
// run in this process, so the figures are for the whole relay of a
// session, both sides together.
func benchMemory(b *testing.B) {
	if b.N == 1 {
		return // the framework's probe run (see benchRelayVsRaw)
	}
	for _, n := range envInts("HCP_BENCH_MEMORY_SESSIONS", []int{100, 1000}) {
		c, err := liveSessionCost(b, n)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("%d live sessions: %.1f KiB heap and %.1f goroutines per session (both sidecars, harness and app together); process RSS %.1f MiB with none, %.1f MiB with %d (%.1f KiB per session); CPU %.1f ms/s with none, %.1f ms/s while they wait (%.1f µs per session-second)",
			n, c.heap/1024, c.goroutines, float64(c.rss0)/(1<<20), float64(c.rss1)/(1<<20), n, float64(c.rss1-c.rss0)/float64(n)/1024,
			c.idleCPU0*1e3, c.idleCPU1*1e3, (c.idleCPU1-c.idleCPU0)*1e6/float64(n))
		b.ReportMetric(c.heap/1024, fmt.Sprintf("KiB/session@%d", n))
		b.ReportMetric(c.goroutines, fmt.Sprintf("goroutines/session@%d", n))
		b.ReportMetric(float64(c.rss1)/(1<<20), fmt.Sprintf("MiB-RSS@%d", n))
	}
}

// sessionCost is what n live sessions cost: heap and goroutines per
// session, and the process's RSS before and with them.
type sessionCost struct {
	heap, goroutines float64
	rss0, rss1       int64
	// idleCPU0 and idleCPU1 are this process's CPU seconds per second
	// before the sessions and while they run with nothing to send.
	idleCPU0, idleCPU1 float64
}

// idleWindow is how long live sessions are watched for their idle CPU.
const idleWindow = 10 * time.Second

func liveSessionCost(b *testing.B, n int) (sessionCost, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := newRelayRun(b, modeAsync, 1)
	defer r.close()
	if _, err := r.startSessions(ctx); err != nil { // warm-up: one session
		return sessionCost{}, err
	}
	idle0 := idleCPU()
	heap0, g0, rss0 := heapInUse(), runtime.NumGoroutine(), benchutil.RSS()
	sem := make(chan struct{}, 16)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		sids []string
		ferr error
	)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			req := caller.SubmitRequest{CalleeID: calleeID, Capability: "analyze", Intent: fmt.Sprintf("memory %d", i),
				Constraints: task.Constraints{DataClassification: task.T1}}
			var v caller.TaskView
			code := call(ctx, http.MethodPost, r.bed.CallerAPI+"/hcp/v1/tasks", req, &v)
			mu.Lock()
			defer mu.Unlock()
			if code != http.StatusAccepted {
				ferr = fmt.Errorf("POST /hcp/v1/tasks: HTTP %d", code)
				return
			}
			sids = append(sids, v.SessionID)
		})
	}
	wg.Wait()
	if ferr != nil {
		return sessionCost{}, ferr
	}
	deadline := time.Now().Add(5 * time.Minute)
	for _, sid := range sids {
		for !r.h.running(sid) || r.app.session(sid).last < 2 {
			if time.Now().After(deadline) {
				return sessionCost{}, fmt.Errorf("session %s did not start", sid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	heap1, g1, rss1 := heapInUse(), runtime.NumGoroutine(), benchutil.RSS()
	// The sessions' first status writes go out within the write budget
	// (50 a second by default): wait until they are all written, so that
	// the idle window measures waiting sessions, not that backlog.
	if err := r.bed.waitStatusWritesSettled(ctx); err != nil {
		return sessionCost{}, err
	}
	idle1 := idleCPU()
	return sessionCost{heap: float64(heap1-heap0) / float64(n), goroutines: float64(g1-g0) / float64(n),
		rss0: rss0, rss1: rss1, idleCPU0: idle0, idleCPU1: idle1}, nil
}

// idleCPU is this process's CPU seconds per second over idleWindow.
func idleCPU() float64 {
	cpu0 := benchutil.SampleCPU()
	time.Sleep(idleWindow)
	return benchutil.SampleCPU().Sub(cpu0).Self.Seconds() / idleWindow.Seconds()
}

// heapInUse collects garbage and returns the freed memory to the system
// (so that the RSS read after it is what is live, not what an earlier
// peak left), then reads the heap in use.
func heapInUse() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// waitStatusWritesSettled waits until neither sidecar has written an
// HCPSession (status or state label) for 3 s.
func (b *bed) waitStatusWritesSettled(ctx context.Context) error {
	last, since := -1.0, time.Now()
	for {
		n := 0.0
		for _, reg := range []*prometheus.Registry{b.CalleeReg, b.CallerReg} {
			mfs, err := reg.Gather()
			if err != nil {
				return err
			}
			for _, mf := range mfs {
				if mf.GetName() != "hcp_sidecar_status_writes_total" && mf.GetName() != "hcp_sidecar_state_label_writes_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					n += m.GetCounter().GetValue()
				}
			}
		}
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= 3*time.Second {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("status writes still going after the sessions started (%v so far): %w", n, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
