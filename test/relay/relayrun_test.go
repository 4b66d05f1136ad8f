package relay

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// relayRun is one bed for one measured run.
type relayRun struct {
	harnessDriver
	tb  testing.TB
	bed *bed
	app *benchApp
	h   *benchHarness
	n   int // sessions
	// postedRate is the rate at which the harness got its events accepted
	// by the callee sidecar in the last run (events/s); detail describes
	// the run.
	postedRate float64
	detail     string
}

func newRelayRun(tb testing.TB, mode emitMode, sessions int) *relayRun {
	return newRelayRunWith(tb, mode, sessions, bedOptions{Quiet: true})
}

// newRelayRunWith is newRelayRun on a bed with options o (Harness and App
// are the run's).
func newRelayRunWith(tb testing.TB, mode emitMode, sessions int, o bedOptions) *relayRun {
	r := &relayRun{tb: tb, app: newBenchApp(), h: newBenchHarness(), n: sessions}
	o.Harness = func(string, logr.Logger) http.Handler { return r.h }
	o.App = r.app
	r.bed = newBed(tb, o)
	r.harnessDriver = newHarnessDriver(r.bed.CalleeAPI, mode)
	return r
}

func (r *relayRun) close() {
	r.hc.CloseIdleConnections()
	r.bed.Close()
}

// run is a benchutil.Runner: cfg.Messages events over r.n sessions, paced
// at cfg.Rate, timed from the first event to the last one the app
// received.
func (r *relayRun) run(ctx context.Context, cfg benchutil.Config) (benchutil.Result, error) {
	sids, err := r.startSessions(ctx)
	if err != nil {
		return benchutil.Result{}, err
	}
	rec := benchutil.NewRecorder(benchutil.NewRunID("relay"), cfg.Messages)
	r.app.setRecorder(rec)
	if cfg.OnStart != nil {
		cfg.OnStart()
	}
	start := time.Now()
	if err := r.emit(ctx, sids, cfg.Messages, cfg.Rate, rec); err != nil {
		return benchutil.Result{}, err
	}
	posted := time.Since(start)
	r.postedRate = float64(cfg.Messages) / posted.Seconds()
	if err := waitRecorder(ctx, rec); err != nil {
		return benchutil.Result{}, err
	}
	res := rec.Result()
	r.detail = fmt.Sprintf("the callee sidecar took them all in %s (%.0f/s); the caller sidecar used %d connection(s) to the app",
		posted.Round(time.Millisecond), r.postedRate, r.bed.AppConns.Load())
	if r.app.streamOffer {
		// The app offered its stream on the answers to the sessions'
		// first messages: the events must have gone over it.
		n := r.app.streamed.Load()
		if n == 0 {
			return benchutil.Result{}, fmt.Errorf("the app offered its stream, and the caller sidecar delivered nothing over it")
		}
		r.detail += fmt.Sprintf(", %d deliveries over its stream", n)
	}
	if r.app.split {
		r.detail += "; " + r.app.hops.String()
	}
	if err := r.finish(ctx, sids); err != nil {
		return benchutil.Result{}, err
	}
	if res.Duplicates != 0 {
		return res, fmt.Errorf("the app received %d events twice", res.Duplicates)
	}
	return res, nil
}

func waitRecorder(ctx context.Context, rec *benchutil.Recorder) error {
	select {
	case <-rec.Done():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d events received: %w", rec.Received(), ctx.Err())
	}
}

// startSessions submits r.n tasks through the caller sidecar and waits until
// the harness runs each and the app has its session_created and
// state_changed, so that what is timed is the stream of harness events.
func (r *relayRun) startSessions(ctx context.Context) ([]string, error) {
	var sids []string
	for i := range r.n {
		req := caller.SubmitRequest{
			CalleeID: calleeID, Capability: "analyze", Intent: fmt.Sprintf("benchmark session %d", i),
			Constraints: task.Constraints{DataClassification: task.T1},
		}
		var v caller.TaskView
		if code := call(ctx, http.MethodPost, r.bed.CallerAPI+"/hcp/v1/tasks", req, &v); code != http.StatusAccepted {
			return nil, fmt.Errorf("POST /hcp/v1/tasks: HTTP %d", code)
		}
		sids = append(sids, v.SessionID)
	}
	err := testbed.Poll(ctx, time.Minute, func(context.Context) error {
		for _, sid := range sids {
			if !r.h.running(sid) {
				return fmt.Errorf("the harness does not run %s yet", sid)
			}
			if st := r.app.session(sid); st.last < 2 {
				return fmt.Errorf("the app has %d events of %s", st.last, sid)
			}
		}
		return nil
	})
	return sids, err
}

// finish completes the sessions and checks what the app received: every
// event once and in order, task_completed, session_closed.
func (r *relayRun) finish(ctx context.Context, sids []string) error {
	for _, sid := range sids {
		if err := r.post(ctx, r.bed.CalleeAPI+"/hcp/v1/sessions/"+sid+"/complete", []byte(`{"result":{"ok":true}}`), false); err != nil {
			return err
		}
	}
	if err := testbed.Poll(ctx, time.Minute, func(context.Context) error {
		for _, sid := range sids {
			if st := r.app.session(sid); !st.accepted || !st.completed || !st.closed {
				return fmt.Errorf("session %s not finished at the app (accepted %t, last sequence %d, completed %t, closed %t)",
					sid, st.accepted, st.last, st.completed, st.closed)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if p := r.app.problems(); len(p) > 0 {
		return fmt.Errorf("the app saw %d problems: %q", len(p), p[:min(len(p), 10)])
	}
	return nil
}
