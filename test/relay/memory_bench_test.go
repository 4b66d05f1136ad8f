package relay

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/testbed"
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
//
// HCP_BENCH_MEMORY_PROFILE=prefix writes the heap and goroutine profiles
// of the bed before the n sessions (prefix-heap-0-n.pprof,
// prefix-goroutine-0-n.txt) and while they are live, after the
// measurement (prefix-heap-n.pprof, prefix-goroutine-n.txt), to find the
// owners of the per-session memory (the difference; -memprofilerate
// samples finer than the default 512 KiB, at some cost in heap):
//
//	HCP_BENCH_MEMORY_SESSIONS=1000 HCP_BENCH_MEMORY_PROFILE=/tmp/mem go test -run '^$' -bench 'BenchmarkRelay/memory' -benchtime 2x -memprofilerate 512 -timeout 60m -v ./test/relay
//	go tool pprof -sample_index=inuse_space -diff_base /tmp/mem-heap-0-1000.pprof -top /tmp/mem-heap-1000.pprof
func benchMemory(b *testing.B) {
	if b.N == 1 {
		return // the framework's probe run (see benchRelayVsRaw)
	}
	for _, n := range envInts("HCP_BENCH_MEMORY_SESSIONS", []int{100, 1000}) {
		c, err := liveSessionCost(b, n, idleWindow)
		if err != nil {
			b.Fatal(err)
		}
		report.setMemory(n, c)
		b.Logf("%d live sessions: %.1f KiB heap and %.1f goroutines per session (both sidecars, harness and app together); process RSS %.1f MiB with none, %.1f MiB with %d (%.1f KiB per session); CPU %.1f ms/s with none, %.1f ms/s while they wait (%.1f µs per session-second)",
			n, c.heap/1024, c.goroutines, float64(c.rss0)/(1<<20), float64(c.rss1)/(1<<20), n, float64(c.rss1-c.rss0)/float64(n)/1024,
			c.idleCPU0*1e3, c.idleCPU1*1e3, (c.idleCPU1-c.idleCPU0)*1e6/float64(n))
		b.ReportMetric(c.heap/1024, fmt.Sprintf("KiB/session@%d", n))
		b.ReportMetric(c.goroutines, fmt.Sprintf("goroutines/session@%d", n))
		b.ReportMetric(float64(c.rss1)/(1<<20), fmt.Sprintf("MiB-RSS@%d", n))
		b.Logf("the same %d sessions once quiet (their caller workers gone): %.1f KiB heap and %.1f goroutines per session; process RSS %.1f MiB (%.1f KiB per session)",
			n, c.waitingHeap/1024, c.waitingGoroutines, float64(c.waitingRSS)/(1<<20), float64(c.waitingRSS-c.rss0)/float64(n)/1024)
		b.Logf("sidecar goroutines: %d before the %d sessions, %d while they ran, %d after they ended (baseline: after %d sessions started and ended together)",
			c.sidecarG0, n, c.sidecarG1, c.sidecarG2, memoryConcurrency)
	}
}

// memoryConcurrency is how many sessions liveSessionCost starts at once.
const memoryConcurrency = 16

// sessionCost is what n live sessions cost: heap and goroutines per
// session, and the process's RSS before and with them.
type sessionCost struct {
	heap, goroutines float64
	rss0, rss1       int64
	// idleCPU0 and idleCPU1 are this process's CPU seconds per second
	// before the sessions and while they run with nothing to send.
	idleCPU0, idleCPU1 float64
	// sidecarG0, sidecarG1 and sidecarG2 count the sidecars' goroutines
	// (sidecarGoroutines) before the sessions, while they are live, and
	// after they ended and the count settled (at most a minute).
	sidecarG0, sidecarG1, sidecarG2 int
	// waitingHeap, waitingGoroutines (per session) and waitingRSS are the
	// same after the idle window, the sessions quiet for longer than the
	// caller's WorkerIdle.
	waitingHeap, waitingGoroutines float64
	waitingRSS                     int64
}

// rssPerSession is the RSS the sessions added, per session, in bytes.
func (c sessionCost) rssPerSession(n int) float64 { return float64(c.rss1-c.rss0) / float64(n) }

// idleWindow is how long live sessions are watched for their idle CPU.
const idleWindow = 10 * time.Second

func liveSessionCost(b testing.TB, n int, idle time.Duration) (sessionCost, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Warm-up: n sessions started and ended as the measured ones are, so
	// that the pools sized by concurrency (the status writers' workers)
	// have their size in the goroutine baseline; then one session, left
	// live.
	r := newRelayRun(b, modeAsync, 1)
	defer r.close()
	warm, err := startConcurrently(ctx, r, n)
	if err == nil {
		err = endConcurrently(ctx, r, warm)
	}
	if err == nil {
		_, err = r.startSessions(ctx)
	}
	if err != nil {
		return sessionCost{}, err
	}
	settle, settleCancel := context.WithTimeout(ctx, min(time.Minute, 10*time.Second+time.Duration(n)*50*time.Millisecond))
	defer settleCancel()
	sg0, err := settleSidecarGoroutines(settle, -1)
	if err != nil {
		return sessionCost{}, err
	}
	idle0 := idleCPU(idle)
	heap0, g0, rss0 := heapInUse(), runtime.NumGoroutine(), benchutil.RSS()
	if err := writeMemoryProfiles(os.Getenv("HCP_BENCH_MEMORY_PROFILE"), fmt.Sprintf("0-%d", n)); err != nil {
		return sessionCost{}, err
	}
	sids, err := startConcurrently(ctx, r, n)
	if err != nil {
		return sessionCost{}, err
	}
	heap1, g1, rss1 := heapInUse(), runtime.NumGoroutine(), benchutil.RSS()
	if err := writeMemoryProfiles(os.Getenv("HCP_BENCH_MEMORY_PROFILE"), strconv.Itoa(n)); err != nil {
		return sessionCost{}, err
	}
	// The sessions' first status writes go out within the write budget
	// (50 a second by default): wait until they are all written, so that
	// the idle window measures waiting sessions, not that backlog.
	if err := r.bed.waitStatusWritesSettled(ctx); err != nil {
		return sessionCost{}, err
	}
	idle1 := idleCPU(idle)
	sg1 := sidecarGoroutines()
	// Quiet for longer than the caller's WorkerIdle, their workers go (their
	// goroutines went as soon as they held nothing; their state goes
	// then): what is left is what a long-running, quiet session costs.
	select {
	case <-ctx.Done():
		return sessionCost{}, ctx.Err()
	case <-time.After(caller.DefaultWorkerIdle + 2*time.Second):
	}
	quiet, quietCancel := context.WithTimeout(ctx, time.Minute)
	defer quietCancel()
	if _, err := settleSidecarGoroutines(quiet, sg0); err != nil {
		msg := err.Error()
		return sessionCost{}, fmt.Errorf("the quiet sessions' workers did not go: %s", msg[:min(len(msg), 8000)])
	}
	heap2, g2, rss2 := heapInUse(), runtime.NumGoroutine(), benchutil.RSS()
	// End them all; the sidecars' goroutines must return to the baseline.
	if err := endConcurrently(ctx, r, sids); err != nil {
		return sessionCost{}, err
	}
	settle2, settle2Cancel := context.WithTimeout(ctx, min(time.Minute, 10*time.Second+time.Duration(n)*50*time.Millisecond))
	defer settle2Cancel()
	sg2, err := settleSidecarGoroutines(settle2, sg0)
	if err != nil {
		msg := err.Error()
		b.Logf("sidecar goroutines after the sessions ended: %s", msg[:min(len(msg), 8000)])
	}
	return sessionCost{heap: float64(heap1-heap0) / float64(n), goroutines: float64(g1-g0) / float64(n),
		rss0: rss0, rss1: rss1, idleCPU0: idle0, idleCPU1: idle1, sidecarG0: sg0, sidecarG1: sg1, sidecarG2: sg2,
		waitingHeap: float64(heap2-heap0) / float64(n), waitingGoroutines: float64(g2-g0) / float64(n), waitingRSS: rss2}, nil
}

// startConcurrently submits n tasks through r's caller sidecar,
// memoryConcurrency at a time, and waits until each runs at the harness
// and its first two messages reached the app.
func startConcurrently(ctx context.Context, r *relayRun, n int) ([]string, error) {
	sem := make(chan struct{}, memoryConcurrency)
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
		return nil, ferr
	}
	deadline := time.Now().Add(5 * time.Minute)
	for _, sid := range sids {
		for !r.h.running(sid) || r.app.session(sid).last < 2 {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("session %s did not start", sid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return sids, nil
}

// endConcurrently completes the sessions, memoryConcurrency at a time,
// and waits until the app has each one's end.
func endConcurrently(ctx context.Context, r *relayRun, sids []string) error {
	sem := make(chan struct{}, memoryConcurrency)
	var wg sync.WaitGroup
	ends := make(chan error, len(sids))
	for _, sid := range sids {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ends <- r.post(ctx, r.bed.CalleeAPI+"/hcp/v1/sessions/"+sid+"/complete", []byte(`{"result":{"ok":true}}`), false)
		})
	}
	wg.Wait()
	close(ends)
	for err := range ends {
		if err != nil {
			return err
		}
	}
	return testbed.Poll(ctx, 5*time.Minute, func(context.Context) error {
		for _, sid := range sids {
			if st := r.app.session(sid); !st.completed || !st.closed {
				return fmt.Errorf("session %s not finished at the app", sid)
			}
		}
		return nil
	})
}

// writeMemoryProfiles writes the heap profile to prefix-heap-suffix.pprof
// and the goroutine profile (debug=1) to prefix-goroutine-suffix.txt;
// nothing when prefix is empty.
func writeMemoryProfiles(prefix, suffix string) error {
	if prefix == "" {
		return nil
	}
	for _, p := range []struct {
		name, file string
		debug      int
	}{{"heap", prefix + "-heap-" + suffix + ".pprof", 0}, {"goroutine", prefix + "-goroutine-" + suffix + ".txt", 1}} {
		f, err := os.Create(p.file)
		if err != nil {
			return err
		}
		err = pprof.Lookup(p.name).WriteTo(f, p.debug)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// idleCPU is this process's CPU seconds per second over window.
func idleCPU(window time.Duration) float64 {
	cpu0 := benchutil.SampleCPU()
	time.Sleep(window)
	return benchutil.SampleCPU().Sub(cpu0).Self.Seconds() / window.Seconds()
}

// heapInUse collects garbage and returns the freed memory to the system
// (so that the RSS read after it is what is live, not what an earlier
// peak left), then reads the live heap: the bytes of objects the
// collection kept. Not MemStats.HeapInuse, the spans in use: the
// warm-up's ended sessions leave spans partly free, which the measured
// sessions fill, so the spans' growth came out at half the objects'
// (8.1 KiB a session against 15.5 KiB of live objects in the heap
// profiles of the same run, 2026-11-30), and moved with that
// fragmentation from commit to commit.
func heapInUse() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	return int64(sample[0].Value.Uint64())
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
