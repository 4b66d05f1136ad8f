package status

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// BenchmarkWriteBudget measures one callee sidecar's status writer against
// a real API server (envtest) at the default budget: N live sessions each
// streaming 10 events/s for 10 s, 1% of them (at least one) changing state
// each second. It reports the API writes per second (status and state
// label), the p50/p99 time from a state change to the API server storing
// it (what `kubectl get hcpsessions` shows, seen through a watch), how
// long the last progress takes to be written once the events stop, and the
// writes during 5 idle seconds after that. Run with -benchtime 1x (make bench).
func BenchmarkWriteBudget(b *testing.B) {
	e := testbed.StartEnv(b, testbed.Options{WithoutTopologyCRDs: true, AddToScheme: []func(*runtime.Scheme) error{v1alpha1.AddToScheme}})
	var rows []string
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			for range b.N {
				r := runWriteBudget(b, e, n)
				b.ReportMetric(r.writesPerSecond, "writes/s")
				b.ReportMetric(r.p50.Seconds()*1000, "state-p50-ms")
				b.ReportMetric(r.p99.Seconds()*1000, "state-p99-ms")
				b.ReportMetric(float64(r.idleWrites), "idle-writes")
				rows = append(rows, fmt.Sprintf("| %d | %d | %.1f | %.0f / %.0f | %d | %.1f | %d |", n, n*10, r.writesPerSecond,
					r.p50.Seconds()*1000, r.p99.Seconds()*1000, r.changes, r.drain.Seconds(), r.idleWrites))
			}
		})
	}
	b.Logf("\n| sessions | events/s | API writes/s (budget %d) | state visible p50 / p99 ms | state changes | s to write the last progress | writes in 5 idle s after |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n%s",
		DefaultWritesPerSecond, joinLines(rows))
}

type budgetResult struct {
	writesPerSecond float64
	p50, p99        time.Duration
	changes         int
	idleWrites      int
	drain           time.Duration
}

func runWriteBudget(b *testing.B, e *testbed.Env, n int) budgetResult {
	ctx := b.Context()
	ns := e.CreateNamespace(b, "budget-")
	names := make([]string, n)
	for i := range n {
		id := fmt.Sprintf("2b7e1e5a-9c3f-4d1e-8a7b-%012d", i)
		obj := session(id)
		obj.Namespace = ns
		obj.Spec.TaskMessageID = fmt.Sprintf("6f9619ff-8b86-4011-b42d-%012d", i)
		if err := e.Client.Create(ctx, obj); err != nil {
			b.Fatal(err)
		}
		names[i] = obj.Name
	}
	m := metrics.New(prometheus.NewRegistry())
	w := New(Options{Client: e.Client, Namespace: ns, Metrics: m, Log: logr.Discard()})
	w.SetStateLabel(v1alpha1.LabelSessionState)
	w.SetDeriveConditions(true)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(runCtx); close(done) }()
	defer func() { stop(); <-done }()
	// Every session RUNNING, stored, before the clock starts.
	for _, name := range names {
		w.Update(name, func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning })
	}
	if err := w.FlushAll(ctx); err != nil {
		b.Fatal(err)
	}

	// The watch sees what the API server stores.
	var list v1alpha1.HCPSessionList
	if err := e.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		b.Fatal(err)
	}
	wc, err := client.NewWithWatch(e.Config, client.Options{Scheme: e.Client.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	wi, err := wc.Watch(ctx, &v1alpha1.HCPSessionList{}, client.InNamespace(ns))
	if err != nil {
		b.Fatal(err)
	}
	defer wi.Stop()
	var mu sync.Mutex
	changedAt := map[string]time.Time{} // name/state → when Update asked for it
	var lat []time.Duration
	go func() {
		for ev := range wi.ResultChan() {
			hs, ok := ev.Object.(*v1alpha1.HCPSession)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			key := hs.Name + "/" + string(hs.Status.State)
			mu.Lock()
			if at, ok := changedAt[key]; ok {
				lat = append(lat, time.Since(at))
				delete(changedAt, key)
			}
			mu.Unlock()
		}
	}()

	writes := func() int {
		return int(testutil.ToFloat64(m.StatusWrites.WithLabelValues("ok")) + testutil.ToFloat64(m.LabelWrites.WithLabelValues("ok")))
	}
	const seconds, perSecond = 10, 10
	before := writes()
	start := time.Now()
	state := map[string]v1alpha1.SessionState{}
	changes := 0
	tick := time.NewTicker(time.Second / perSecond)
	for step := 1; step <= seconds*perSecond; step++ {
		<-tick.C
		seq := int64(step)
		for _, name := range names {
			w.Update(name, func(s *v1alpha1.HCPSessionStatus) { s.LastSequence, s.EventCount = seq, seq })
		}
		if step%perSecond == 0 {
			// Distinct sessions: a session picked twice in one step
			// would go back to the state stored before its first change
			// could be written, leaving nothing to show; the benchmark
			// then timed that session's next progress write (up to
			// 20 s at 1,000 sessions) as if it were a state change.
			for _, i := range rand.Perm(n)[:max(n/100, 1)] {
				name := names[i]
				next := v1alpha1.SessionPaused
				if state[name] == v1alpha1.SessionPaused {
					next = v1alpha1.SessionRunning
				}
				state[name] = next
				mu.Lock()
				changedAt[name+"/"+string(next)] = time.Now()
				mu.Unlock()
				w.Update(name, func(s *v1alpha1.HCPSessionStatus) { s.State = next })
				changes++
			}
		}
	}
	tick.Stop()
	busy := time.Since(start)
	streamed := writes() - before
	// Let what is pending drain, then count 5 idle seconds.
	drainStart := time.Now()
	for pending := true; pending && time.Since(drainStart) < 2*time.Minute; {
		time.Sleep(100 * time.Millisecond)
		pending = slices.ContainsFunc(names, w.Pending)
	}
	drain := time.Since(drainStart)
	idleFrom := writes()
	time.Sleep(5 * time.Second)
	idle := writes() - idleFrom

	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	if len(changedAt) > 0 {
		b.Logf("%d state changes not seen stored (a later change overtook them)", len(changedAt))
	}
	failed := testutil.ToFloat64(m.StatusWrites.WithLabelValues("error")) + testutil.ToFloat64(m.StatusWrites.WithLabelValues("conflict")) +
		testutil.ToFloat64(m.LabelWrites.WithLabelValues("error"))
	b.Logf("%d sessions: %.0f failed writes (retried); the slowest state changes: %v", n, failed, lat[max(0, len(lat)-3):])
	return budgetResult{writesPerSecond: float64(streamed) / busy.Seconds(), p50: pct(0.5), p99: pct(0.99), changes: changes, idleWrites: idle, drain: drain}
}

func joinLines(rows []string) string {
	out := ""
	for _, r := range rows {
		out += r + "\n"
	}
	return out
}
