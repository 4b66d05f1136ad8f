package relay

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
)

// TestBenchSmoke runs make bench's relay benchmark small (part of make
// test): raw, the relay and the floor in async mode with an app that takes
// batches, at max rate and at 1,000 events/s, at 1 and 10 sessions, and
// in stream mode with an app that offers a stream at 1,000 events/s in 1
// session and at max rate in 10, one round of 300 events each; the
// acceptance benchmark with 6 tasks; the memory benchmark with 20
// sessions. It checks the report's structure, not its figures: every
// target line is there, with a value and ✓ or ✗, and the targets with
// both modes measured chose between them.
func TestBenchSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test (envtest + RabbitMQ); -short skips it")
	}
	start := time.Now()
	sessionCounts := []int{1, 10}
	rep := &targetReport{memory: map[int]sessionCost{}}
	for _, rate := range []float64{0, 1000} {
		for _, n := range sessionCounts {
			modes := []scenario{{mode: modeAsync, app: appBatch}}
			if (rate == 0) == (n > 1) {
				// The streams at 1,000/s in 1 session (a line flushed at
				// a time) and at max rate in 10 (lines coalesced, the
				// sessions' deliveries on one stream to the app): 3 s each.
				modes = append(modes, scenario{mode: modeStream, app: appStream})
			}
			for _, m := range modes {
				sc := scenario{mode: m.mode, app: m.app, rate: rate, sessions: n}
				row, _, err := relayScenario(t, sc, 300, 1)
				if err != nil {
					t.Fatalf("%s: %v", sc, err)
				}
				rep.setRows([]benchRow{row})
				t.Logf("%s done after %s", sc, time.Since(start).Round(100*time.Millisecond))
			}
		}
	}
	rep.setAcceptance(measureAcceptance(t, 6))
	t.Logf("acceptance done after %s", time.Since(start).Round(100*time.Millisecond))
	c, err := liveSessionCost(t, 20, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	rep.setMemory(20, c)

	lines := rep.lines(sessionCounts)
	var text strings.Builder
	for _, l := range lines {
		text.WriteString(l.String() + "\n")
	}
	t.Logf("the report (figures of a smoke, not for docs; %s):\n%s", time.Since(start).Round(time.Second), text.String())
	want := []string{
		"sidecar CPU per event, 1000/s, 1 session(s)", "sidecar CPU per event, 1000/s, 10 session(s)",
		"sidecar CPU per event, max rate, 1 session(s)", "sidecar CPU per event, max rate, 10 session(s)",
		"relay p99 − raw p99, 1000/s, 1 session(s)", "relay p99 − raw p99, 1000/s, 10 session(s)",
		"throughput against the floor, mode=async/app=batch/rate=max/sessions=1",
		"throughput against the floor, mode=async/app=batch/rate=max/sessions=10",
		"throughput against the floor, mode=stream/app=stream/rate=max/sessions=10",
		"task acceptance p50", "task acceptance p99", "RSS per live session", "sidecar goroutines after sessions end",
	}
	checkReport(t, text.String(), want)
	// The targets with both modes measured chose between them.
	for _, l := range lines {
		switch l.id {
		case "sidecar CPU per event, 1000/s, 1 session(s)", "relay p99 − raw p99, 1000/s, 1 session(s)", "sidecar CPU per event, max rate, 10 session(s)":
			if !strings.Contains(l.value, "the best of 2 modes") {
				t.Errorf("%s: not a choice of the two modes run: %s", l.id, l.value)
			}
		}
	}
}

// reportLine is a target line: ✓ or ✗, the target's name, a value with a
// number, the target, and the anchors where the target has them.
var reportLine = regexp.MustCompile(`^([✓✗]) ([^:]+): ([^|]*[0-9][^|]*) \| target [^|]+( \| anchors: .+)?$`)

// checkReport fails t unless the report has exactly one line for each of
// want, in that shape (reportProblems).
func checkReport(t *testing.T, report string, want []string) {
	t.Helper()
	for _, p := range reportProblems(report, want) {
		t.Error(p)
	}
}

// reportProblems lists what is wrong with the report's structure: a line
// that is not a measured target line, a target of want without exactly
// one.
func reportProblems(report string, want []string) []string {
	var out []string
	got := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(report), "\n") {
		m := reportLine.FindStringSubmatch(line)
		if m == nil {
			out = append(out, fmt.Sprintf("not a measured target line: %q", line))
			continue
		}
		got[m[2]]++
	}
	for _, id := range want {
		if got[id] != 1 {
			out = append(out, fmt.Sprintf("target %q: %d lines with a value, want 1", id, got[id]))
		}
	}
	return out
}

// The structure check catches a target left out, one not measured, one
// without a number, one twice.
func TestReportProblems(t *testing.T) {
	good := "✓ a: 1.00 ms | target ≤ 2 ms | anchors: x\n✗ b: 3× (4 µs) | target ≤ 1.5×\n"
	if p := reportProblems(good, []string{"a", "b"}); len(p) != 0 {
		t.Fatalf("a good report: %q", p)
	}
	for name, bad := range map[string]string{
		"left out":     "✓ a: 1.00 ms | target ≤ 2 ms\n",
		"not measured": good + "– c: not measured: did not run | target ≤ 1\n",
		"no number":    good + "✓ c: fast | target ≤ 1\n",
		"twice":        good + "✓ b: 2 | target ≤ 1\n",
	} {
		if p := reportProblems(bad, []string{"a", "b"}); len(p) == 0 {
			t.Errorf("%s: no problem found in %q", name, bad)
		}
	}
}

// The marks follow the targets: a report built from figures on either side
// of each.
func TestTargetReportMarks(t *testing.T) {
	row := func(sc scenario, raw, relay, floor benchutil.Summary) benchRow {
		return benchRow{scenario: sc.String(), sc: sc, raw: raw, relay: relay, floor: floor, paced: sc.rate > 0}
	}
	sum := func(thr float64, p99, cpu time.Duration) benchutil.Summary {
		return benchutil.Summary{Runs: 5, Throughput: thr, P99: p99, CPUPerMessage: benchutil.CPU{Self: cpu}}
	}
	us := time.Microsecond
	rep := &targetReport{memory: map[int]sessionCost{}}
	rep.setRows([]benchRow{
		// 1 session: sidecars 500 − (400 − 100) = 200 µs ✓; +1.5 ms ✓.
		row(scenario{modeAsync, appBatch, 1000, 1}, sum(1000, 3*time.Millisecond, 100*us), sum(1000, 4500*us, 500*us), sum(1000, 0, 400*us)),
		// 10 sessions: 600 − 300 = 300 µs ✗; +3.5 ms ✗.
		row(scenario{modeAsync, appBatch, 1000, 10}, sum(1000, 3*time.Millisecond, 100*us), sum(1000, 6500*us, 600*us), sum(1000, 0, 400*us)),
		// max: sidecars 100 − (80 − 50) = 70 µs = 1.4× raw ✓; 0.95× the floor ✓.
		row(scenario{modeAsync, appBatch, 0, 1}, sum(8000, 0, 50*us), sum(3800, 0, 100*us), sum(4000, 0, 80*us)),
		// 160 − 30 = 130 µs = 2.6× ✗; 0.5× ✗.
		row(scenario{modeAsync, appBatch, 0, 10}, sum(8000, 0, 50*us), sum(2000, 0, 160*us), sum(4000, 0, 80*us)),
	})
	rep.setAcceptance(acceptanceResult{relay: benchutil.Latencies{4 * time.Millisecond, 9 * time.Millisecond},
		raw: benchutil.Latencies{2 * time.Millisecond, 3 * time.Millisecond}, floor: benchutil.Latencies{time.Millisecond}})
	rep.setMemory(1000, sessionCost{rss0: 100 << 20, rss1: 100<<20 + 1000*20<<10, sidecarG0: 30, sidecarG1: 2030, sidecarG2: 30})
	want := map[string]string{
		"sidecar CPU per event, 1000/s, 1 session(s)":                             "✓",
		"sidecar CPU per event, 1000/s, 10 session(s)":                            "✗",
		"relay p99 − raw p99, 1000/s, 1 session(s)":                               "✓",
		"relay p99 − raw p99, 1000/s, 10 session(s)":                              "✗",
		"sidecar CPU per event, max rate, 1 session(s)":                           "✓",
		"sidecar CPU per event, max rate, 10 session(s)":                          "✗",
		"throughput against the floor, mode=async/app=batch/rate=max/sessions=1":  "✓",
		"throughput against the floor, mode=async/app=batch/rate=max/sessions=10": "✗",
		"task acceptance p50":                                                     "✓", // 4 ms (nearest rank of two)
		"task acceptance p99":                                                     "✗", // 9 > 3 + 5
		"RSS per live session":                                                    "✗", // 20 KiB
		"sidecar goroutines after sessions end":                                   "✓",
	}
	var text strings.Builder
	for _, l := range rep.lines([]int{1, 10}) {
		text.WriteString(l.String() + "\n")
		mark, _, _ := strings.Cut(l.String(), " ")
		if w, ok := want[l.id]; !ok || mark != w {
			t.Errorf("%s: got %s, want %q", l.id, mark, w)
		}
	}
	checkReport(t, text.String(), func() []string {
		var ids []string
		for id := range want {
			ids = append(ids, id)
		}
		return ids
	}())
	// 79 − (123 − 35) < 0: no estimate, ✗ however small.
	neg := &targetReport{memory: map[int]sessionCost{}}
	neg.setRows([]benchRow{row(scenario{modeAsync, appBatch, 1000, 1}, sum(1000, 0, 35*us), sum(1000, 0, 79*us), sum(1000, 0, 123*us))})
	if l := neg.lines([]int{1})[0]; l.ok || !strings.Contains(l.String(), "no valid estimate") {
		t.Errorf("a negative estimate: %s", l)
	}
	// Of several modes, each target takes its best and says so: the
	// stream's valid estimate over async's negative one, async's p99
	// over the stream's.
	both := &targetReport{memory: map[int]sessionCost{}}
	both.setRows([]benchRow{
		row(scenario{modeAsync, appBatch, 1000, 1}, sum(1000, 3*time.Millisecond, 35*us), sum(1000, 4*time.Millisecond, 79*us), sum(1000, 0, 123*us)),
		row(scenario{modeStream, appStream, 1000, 1}, sum(1000, 3*time.Millisecond, 35*us), sum(1000, 6*time.Millisecond, 150*us), sum(1000, 0, 100*us)),
	})
	bl := both.lines([]int{1})
	if l := bl[0].String(); !bl[0].ok || !strings.Contains(l, "0.085 ms (mode=stream/app=stream, the best of 2 modes; the others: async/batch -0.009 ms;") {
		t.Errorf("the CPU target of two modes: %s", l)
	}
	if l := bl[2].String(); !bl[2].ok || !strings.Contains(l, "+1.00 ms (mode=async/app=batch, the best of 2 modes; the others: stream/stream +3.00 ms;") {
		t.Errorf("the p99 target of two modes: %s", l)
	}
	if !strings.Contains(text.String(), "Istio +2.65 ms p90") || !strings.Contains(text.String(), "Dapr ~0.48 vCPU per 1,000 req/s") {
		t.Errorf("the anchors are missing:\n%s", text.String())
	}
}
