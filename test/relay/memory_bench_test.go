package relay

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// benchMemory measures what live sessions cost in memory and goroutines:
// HCP_BENCH_MEMORY_SESSIONS (default 100,1000) sessions are started
// through the relay (each accepted, its task running at the harness, its
// session_created and state_changed delivered to the app) and left
// running; the heap in use after a GC and the goroutine count are compared
// with the same bed before them. Both sidecars, the harness and the app
// run in this process, so the figures are for the whole relay of a
// session, both sides together.
func benchMemory(b *testing.B) {
	if b.N == 1 {
		return // the framework's probe run (see benchRelayVsRaw)
	}
	for _, n := range envInts("HCP_BENCH_MEMORY_SESSIONS", []int{100, 1000}) {
		heap, goroutines, err := liveSessionCost(b, n)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("%d live sessions: %.1f KiB heap and %.1f goroutines per session (both sidecars, harness and app together)",
			n, heap/1024, goroutines)
		b.ReportMetric(heap/1024, fmt.Sprintf("KiB/session@%d", n))
		b.ReportMetric(goroutines, fmt.Sprintf("goroutines/session@%d", n))
	}
}

func liveSessionCost(b *testing.B, n int) (heapPerSession, goroutinesPerSession float64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := newRelayRun(b, modeAsync, 1)
	defer r.close()
	if _, err := r.startSessions(ctx); err != nil { // warm-up: one session
		return 0, 0, err
	}
	heap0, g0 := heapInUse(), runtime.NumGoroutine()
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
		return 0, 0, ferr
	}
	deadline := time.Now().Add(5 * time.Minute)
	for _, sid := range sids {
		for !r.h.running(sid) || r.app.session(sid).last < 2 {
			if time.Now().After(deadline) {
				return 0, 0, fmt.Errorf("session %s did not start", sid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	heap1, g1 := heapInUse(), runtime.NumGoroutine()
	return float64(heap1-heap0) / float64(n), float64(g1-g0) / float64(n), nil
}

func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}
