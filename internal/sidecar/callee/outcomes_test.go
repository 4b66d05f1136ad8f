package callee

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// TestSessionOutcomeMetrics: every task the callee brings to an end is
// counted once in hcp_sessions_total under its capability and outcome
// (a timeout apart from other failures), sessions that ran are observed in
// hcp_session_duration_seconds, and a rejected task keeps its capability
// only when the Callee declares it.
func TestSessionOutcomeMetrics(t *testing.T) {
	one := int32(1)
	b := newBed(t, bedOptions{sessions: v1alpha1.SessionsSpec{MaxConcurrent: &one, AbortTimeout: "PT2S"}})
	run := func(inputs string, maxDuration time.Duration) (string, task.TaskAccepted) {
		t.Helper()
		_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) {
			ts.Inputs = json.RawMessage(inputs)
			if maxDuration > 0 {
				ts.Constraints.MaxDuration = task.Duration(maxDuration)
			}
		}))
		return sid, acceptedOf(t, b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))
	}
	ends := func(sid string, want session.State) {
		t.Helper()
		if closed := closedOf(t, b, sid); closed.FinalState != want {
			t.Fatalf("session_closed %+v, want %s", closed, want)
		}
		// Written, so that the concurrency count no longer holds it.
		b.waitState(sid, v1alpha1.SessionState(want), 10*time.Second)
	}
	rejected := func(mut func(*task.TaskSubmit), want task.ReasonCode) {
		t.Helper()
		_, sid, _ := b.submit(newSubmit(mut))
		if rj := rejectedOf(t, b.waitMessage(sid, 20*time.Second, "task_rejected", isType(envelope.TypeTaskRejected))); rj.ReasonCode != want {
			t.Fatalf("task_rejected %+v, want %s", rj, want)
		}
	}

	sid, _ := run(`{"steps":3,"step_ms":20}`, 0)
	ends(sid, session.StateCompleted)
	sid, _ = run(`{"steps":5,"step_ms":20,"fail_at":2}`, 0)
	ends(sid, session.StateFailed)
	sid, _ = run(`{"steps":100,"step_ms":100}`, 2*time.Second)
	ends(sid, session.StateFailed) // by its timeout: TIMED_OUT

	// One session at a time: while this one runs, another is refused
	// (concurrency_limit), on a capability the Callee declares.
	long, acc := run(`{"steps":100,"step_ms":100}`, 0)
	rejected(func(*task.TaskSubmit) {}, task.ReasonConcurrencyLimit)
	b.abort(long, acc.SessionToken, "enough")
	ends(long, session.StateAborted)

	// Capabilities the Callee does not declare, and a task refused before
	// the gate, are counted without theirs.
	rejected(func(ts *task.TaskSubmit) { ts.Capability = "teleport" }, task.ReasonUnknownCapability)
	rejected(func(ts *task.TaskSubmit) { ts.Capability = "made-up" }, task.ReasonUnknownCapability)
	rejected(func(ts *task.TaskSubmit) { ts.ExpiresAt = task.TimestampPtr(time.Now().Add(-time.Minute)) }, task.ReasonExpired)
	// A declared capability the policy does not admit keeps its name.
	rejected(func(ts *task.TaskSubmit) { ts.Capability = "restricted" }, task.ReasonNotAuthorized)

	want := map[[2]string]float64{
		{"analyze", "COMPLETED"}:   1,
		{"analyze", "FAILED"}:      1,
		{"analyze", "TIMED_OUT"}:   1,
		{"analyze", "ABORTED"}:     1,
		{"analyze", "REJECTED"}:    1,
		{"", "REJECTED"}:           3,
		{"restricted", "REJECTED"}: 1,
	}
	testEventually(t, 5*time.Second, func() error {
		for k, w := range want {
			if got := testutil.ToFloat64(b.metrics.SessionsTotal.WithLabelValues(k[0], k[1])); got != w {
				return fmt.Errorf("hcp_sessions_total{capability=%q,outcome=%q} = %v, want %v", k[0], k[1], got, w)
			}
		}
		return nil
	})
	if n := testutil.CollectAndCount(b.metrics.SessionsTotal); n != len(want) {
		t.Errorf("%d hcp_sessions_total series, want %d", n, len(want))
	}
	// Durations: the four sessions that ran, none for rejections; the
	// timed-out one ran its two seconds.
	if n := testutil.CollectAndCount(b.metrics.SessionDuration); n != 4 {
		t.Errorf("%d hcp_session_duration_seconds series, want 4", n)
	}
	var timedOut struct{ count, sum float64 }
	for _, mf := range gather(t, b) {
		if mf.name != "hcp_session_duration_seconds" || mf.labels["outcome"] != "TIMED_OUT" {
			continue
		}
		timedOut.count, timedOut.sum = mf.count, mf.sum
	}
	if timedOut.count != 1 || timedOut.sum < 1.5 || timedOut.sum > 10 {
		t.Errorf("TIMED_OUT duration: %v observations, %vs in all; want one of about 2s", timedOut.count, timedOut.sum)
	}
}

// histogramSeries is one series of a histogram: its labels, count and sum.
type histogramSeries struct {
	name       string
	labels     map[string]string
	count, sum float64
}

func gather(t *testing.T, b *bed) []histogramSeries {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() { b.metrics.SessionDuration.Collect(ch); close(ch) }()
	var out []histogramSeries
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		for _, l := range pb.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		out = append(out, histogramSeries{name: "hcp_session_duration_seconds", labels: labels,
			count: float64(pb.GetHistogram().GetSampleCount()), sum: pb.GetHistogram().GetSampleSum()})
	}
	return out
}
