package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/samplecallee"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/internal/scrapelog"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// TestDashboardRun records the metrics the chart's Grafana dashboard
// (charts/hcp-operator/dashboards/hcp.json) is drawn from: it runs the
// relay (a callee and a caller sidecar with the sample harness and app)
// under real traffic for a while and scrapes the two sidecars' registries
// and the manager's session collector every second, as Prometheus would
// store them, into HCP_DASHBOARD_SAMPLES (internal/scrapelog's file).
// `make dashboard-picture` runs it, then draws the picture from the file
// in test/observability/dashboard (a module of its own: Prometheus' query
// engine and the plotting library stay out of the main module). The
// operator's controller-runtime panels stay empty: this bed runs no
// manager.
func TestDashboardRun(t *testing.T) {
	out := os.Getenv("HCP_DASHBOARD_SAMPLES")
	if out == "" {
		t.Skip("set HCP_DASHBOARD_SAMPLES to the file to record (make dashboard-picture)")
	}
	runFor := 150 * time.Second
	if d, err := time.ParseDuration(os.Getenv("HCP_DASHBOARD_DURATION")); err == nil {
		runFor = d
	}
	app := samplecaller.NewRecorder()
	b := newBed(t, bedOptions{
		Harness: func(url string, log logr.Logger) http.Handler { return samplecallee.New(url, log).Handler() },
		App:     app.Handler(),
		Quiet:   true,
	})
	manager := prometheus.NewRegistry()
	manager.MustRegister(controller.NewSessionCollector(b.env.Client, nil))
	// Target labels as the chart's PodMonitor and ServiceMonitor give them
	// (the ServiceMonitor honours the manager's own namespace label).
	targets := []scrapelog.Target{
		{Gatherer: b.CalleeReg, Labels: map[string]string{"job": "hcp-sidecars", "namespace": b.ns, "pod": "hcp-callee-lab-cvd-0", "callee": calleeID}},
		{Gatherer: b.CallerReg, Labels: map[string]string{"job": "hcp-sidecars", "namespace": b.ns, "pod": "hcp-caller-alpha-0", "caller": callerID}},
		{Gatherer: manager, Labels: map[string]string{"job": "hcp-operator", "namespace": "hcp-system", "pod": "hcp-operator-0"}, Honor: true},
	}

	ctx, cancel := context.WithTimeout(t.Context(), runFor)
	defer cancel()
	run := scrapelog.Run{Start: time.Now()}
	var wg sync.WaitGroup
	wg.Go(func() { traffic(ctx, t, b) })
	wg.Go(func() {
		// Cut the sidecars' connections once, two thirds in: the
		// connection panels show it.
		select {
		case <-ctx.Done():
			return
		case <-time.After(runFor * 2 / 3):
		}
		_ = b.broker.CloseConnectionsOf(b.callee.name)
	})
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	scrapes := 0
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case now := <-tick.C:
			for _, tg := range targets {
				s, err := scrapelog.Scrape(tg, now)
				if err != nil {
					t.Logf("scrape: %v", err)
				}
				run.Samples = append(run.Samples, s...)
			}
			scrapes++
		}
	}
	wg.Wait()
	run.End = time.Now()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := scrapelog.Write(f, run); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s: %d scrapes, %d samples over %s", out, scrapes, len(run.Samples), run.End.Sub(run.Start).Round(time.Second))
}

// traffic submits tasks through the caller sidecar as an app would: most
// admitted and completing, some refused by the policy, some failing.
func traffic(ctx context.Context, t *testing.T, b *bed) {
	submit := func(capability, inputs string) {
		req := caller.SubmitRequest{
			CalleeID: calleeID, Capability: capability, Intent: "dashboard picture",
			Inputs: json.RawMessage(inputs), Constraints: task.Constraints{DataClassification: task.T1},
		}
		var v caller.TaskView
		if code := call(ctx, http.MethodPost, b.CallerAPI+"/hcp/v1/tasks", req, &v); code != http.StatusAccepted && ctx.Err() == nil {
			t.Logf("POST /hcp/v1/tasks: HTTP %d", code)
		}
	}
	for i := 0; ctx.Err() == nil; i++ {
		submit("analyze", fmt.Sprintf(`{"steps":%d,"step_ms":250,"log_every":5,"checkpoint_every":10}`, 10+i%4*10))
		if i%2 == 0 {
			submit("analyze", `{"steps":60,"step_ms":100}`)
		}
		if i%3 == 0 {
			submit("restricted", `{}`) // the policy does not admit it: not_authorized
		}
		if i%7 == 3 {
			submit("analyze", `{"steps":20,"step_ms":100,"fail_at":12}`)
		}
		if i%9 == 5 {
			submit("analyze", `{"steps":10,"step_ms":100,"pause_at":3,"pause_ms":15000}`)
		}
		select {
		case <-ctx.Done():
		case <-time.After(1500 * time.Millisecond):
		}
	}
}
