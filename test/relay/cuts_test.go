package relay

import (
	"context"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestRelayRandomConnectionCuts streams events through the relay while the
// broker closes the callee sidecar's connections (publishes in flight lose
// their confirms, and the callee republishes them, possibly behind later
// events) and now and then the caller sidecar's (its unacked deliveries
// come back). The caller's gap timeout is 50 ms, far below a reconnect: a
// gap that fills only when the republished copy arrives must be waited
// for, not skipped on time. The app must receive every event exactly once
// and in order; nothing is counted as a skipped gap or a late event.
//
// `make test` runs a smoke of it (1,500 events, 2 callee cuts at least);
// `make relay-cuts` the full run (HCP_RELAY_CUTS=1: 6,000 events, 3 cuts at
// least), RELAY_CUTS_RUNS times. HCP_RELAY_CUTS_LOG=1 shows the sidecars'
// logs.
func TestRelayRandomConnectionCuts(t *testing.T) {
	const sessions, rate = 3, 1000.0
	events, minCuts := 1500, int32(2)
	if os.Getenv("HCP_RELAY_CUTS") != "" {
		events, minCuts = 6000, 3
	}
	r := newRelayRunWith(t, modeAsync, sessions, bedOptions{Quiet: os.Getenv("HCP_RELAY_CUTS_LOG") == "", GapTimeout: 50 * time.Millisecond})
	defer r.close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	sids, err := r.startSessions(ctx)
	must(t, err)

	cutCtx, stopCuts := context.WithCancel(ctx)
	var cuts, callerCuts atomic.Int32
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-cutCtx.Done():
				return
			case <-time.After(time.Duration(100+rand.IntN(300)) * time.Millisecond):
			}
			if err := r.bed.broker.CloseConnectionsOf(r.bed.callee.name); err == nil {
				cuts.Add(1)
			}
			if i%4 == 1 {
				if err := r.bed.broker.CloseConnectionsOf(r.bed.caller.name); err == nil {
					callerCuts.Add(1)
				}
			}
		}
	})
	rec := benchutil.NewRecorder(benchutil.NewRunID("cuts"), events)
	r.app.setRecorder(rec)
	err = r.emit(ctx, sids, events, rate, rec)
	// On a loaded machine a cut (rabbitmqctl) can take seconds: the cuts
	// go on after the last event until enough happened.
	for ctx.Err() == nil && (cuts.Load() < minCuts || callerCuts.Load() < 1) {
		time.Sleep(50 * time.Millisecond)
	}
	stopCuts()
	wg.Wait()
	must(t, err)
	if err := waitRecorder(ctx, rec); err != nil {
		for _, sid := range sids {
			var v caller.SessionView
			call(t.Context(), http.MethodGet, r.bed.CallerAPI+"/hcp/v1/sessions/"+sid, nil, &v)
			t.Logf("session %s at the caller: last %d, buffered %d; at the app: last %d", sid, v.LastSequence, v.Buffered, r.app.session(sid).last)
		}
		if q, err := r.bed.broker.API.GetQueue(r.bed.vhost, topology.EventQueue(callerID)); err == nil {
			t.Logf("event queue: ready %d, unacked %d, consumers %d", q.MessagesReady, q.MessagesUnacknowledged, q.Consumers)
		}
		t.Logf("caller released %v, holds %d; gap_skipped %v, late_event %v, duplicates at the app %d; not received: %v",
			testutil.ToFloat64(r.bed.CallerMetrics.Released), r.bed.CallerSC.Held(),
			testutil.ToFloat64(r.bed.CallerMetrics.Rejects.WithLabelValues(caller.ReasonGapSkipped)),
			testutil.ToFloat64(r.bed.CallerMetrics.Rejects.WithLabelValues(caller.ReasonLateEvent)),
			rec.Result().Duplicates, rec.Missing(10))
		for _, p := range r.app.problems() {
			t.Logf("at the app: %s", p)
		}
		t.Fatalf("not every event reached the app after %d callee and %d caller connection cuts: %v", cuts.Load(), callerCuts.Load(), err)
	}
	must(t, r.finish(ctx, sids))
	// Every delivery a session worker took was settled (or forgotten with
	// its closed channel): nothing leaks out of the prefetch window.
	for deadline := time.Now().Add(10 * time.Second); r.bed.CallerSC.Held() != 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if n := r.bed.CallerSC.Held(); n != 0 {
		t.Errorf("the caller sidecar still counts %d deliveries as held after every session ended", n)
	}
	t.Logf("%d events over %d sessions, %d callee and %d caller connection cuts", events, sessions, cuts.Load(), callerCuts.Load())
	if cuts.Load() < minCuts || callerCuts.Load() < 1 {
		t.Fatalf("only %d callee and %d caller connection cuts happened; the test proves nothing", cuts.Load(), callerCuts.Load())
	}
	r.exactlyOnceInOrder(t, rec)
}

// exactlyOnceInOrder fails t unless the app received every recorded event
// once, in order, and the caller sidecar gave up on none.
func (r *relayRun) exactlyOnceInOrder(t *testing.T, rec *benchutil.Recorder) {
	t.Helper()
	if res := rec.Result(); res.Duplicates != 0 {
		t.Errorf("the app received %d events twice", res.Duplicates)
	}
	for _, p := range r.app.problems() {
		t.Errorf("out of order at the app: %s", p)
	}
	for _, reason := range []string{caller.ReasonGapSkipped, caller.ReasonLateEvent} {
		if n := testutil.ToFloat64(r.bed.CallerMetrics.Rejects.WithLabelValues(reason)); n != 0 {
			t.Errorf("hcp_sidecar_rejects_total{reason=%q} = %v, want 0: an event was given up on", reason, n)
		}
	}
}
