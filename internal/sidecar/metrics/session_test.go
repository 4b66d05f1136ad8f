package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
)

// TestSessionOutcomes: a session's end lands in hcp_sessions_total and
// hcp_session_duration_seconds under its capability and outcome; a
// timeout is TIMED_OUT; a rejection keeps its capability only when the
// Callee declares it.
func TestSessionOutcomes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.SessionEnded("cvd.run", "COMPLETED", "completed", 90*time.Second)
	m.SessionEnded("cvd.run", "COMPLETED", "completed", 200*time.Second)
	m.SessionEnded("cvd.run", "FAILED", "timeout", time.Hour)
	m.SessionEnded("cvd.run", "FAILED", "harness_error", 3*time.Second)
	m.SessionEnded("cvd.plan", "ABORTED", "abort_requested", 10*time.Second)
	callee := &v1alpha1.Callee{Spec: v1alpha1.CalleeSpec{Capabilities: []v1alpha1.Capability{{Name: "cvd.run"}}}}
	m.TaskRejected(callee, "cvd.run")
	m.TaskRejected(callee, "made-up-by-the-caller")
	m.TaskRejected(nil, "cvd.run")

	want := `
# HELP hcp_sessions_total Tasks a callee brought to an end, by capability and outcome (COMPLETED, FAILED, TIMED_OUT, ABORTED, REJECTED).
# TYPE hcp_sessions_total counter
hcp_sessions_total{capability="",outcome="REJECTED"} 2
hcp_sessions_total{capability="cvd.plan",outcome="ABORTED"} 1
hcp_sessions_total{capability="cvd.run",outcome="COMPLETED"} 2
hcp_sessions_total{capability="cvd.run",outcome="FAILED"} 1
hcp_sessions_total{capability="cvd.run",outcome="REJECTED"} 1
hcp_sessions_total{capability="cvd.run",outcome="TIMED_OUT"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hcp_sessions_total"); err != nil {
		t.Error(err)
	}
	// Rejected tasks never ran: no duration. Two completed sessions, one
	// within 120 s and one within 300 s.
	if n := testutil.CollectAndCount(m.SessionDuration); n != 4 {
		t.Errorf("%d duration series, want 4 (no REJECTED)", n)
	}
	out, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range out {
		if mf.GetName() != "hcp_session_duration_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["capability"] != "cvd.run" || labels["outcome"] != "COMPLETED" {
				continue
			}
			h := s.GetHistogram()
			if h.GetSampleCount() != 2 || h.GetSampleSum() != 290 {
				t.Errorf("COMPLETED: count %d sum %v", h.GetSampleCount(), h.GetSampleSum())
			}
			for _, b := range h.GetBucket() {
				want := map[float64]uint64{60: 0, 120: 1, 300: 2}
				if w, ok := want[b.GetUpperBound()]; ok && b.GetCumulativeCount() != w {
					t.Errorf("bucket le=%v: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), w)
				}
			}
		}
	}
}

// TestOutcome: L2's terminal states name themselves; FAILED by timeout is
// TIMED_OUT.
func TestOutcome(t *testing.T) {
	for _, tc := range [][3]string{
		{"COMPLETED", "completed", "COMPLETED"},
		{"FAILED", "timeout", "TIMED_OUT"},
		{"FAILED", "harness_unavailable", "FAILED"},
		{"ABORTED", "timeout", "ABORTED"}, // an abort that ended by the timeout is still an abort
		{"REJECTED", "concurrency_limit", "REJECTED"},
	} {
		if got := metrics.Outcome(tc[0], tc[1]); got != tc[2] {
			t.Errorf("Outcome(%s, %s) = %s, want %s", tc[0], tc[1], got, tc[2])
		}
	}
	var m *metrics.Metrics
	m.SessionEnded("x", "COMPLETED", "", time.Second) // nil: no-op
	m.TaskRejected(nil, "x")
}
