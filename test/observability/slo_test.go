package observability

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/promqltest"
)

// phase is a stretch of minutes during which a counter grows by perMin
// each minute.
type phase struct {
	minutes int
	perMin  float64
}

// counterSeries renders a counter scraped once a minute through phases,
// as the values of a promqltest load command.
func counterSeries(phases ...phase) string {
	var b strings.Builder
	v := 0.0
	b.WriteString("0")
	for _, p := range phases {
		for range p.minutes {
			v += p.perMin
			fmt.Fprintf(&b, " %g", v)
		}
	}
	return b.String()
}

// sessions is the hcp_sessions_total of one callee's sidecar pod.
type sessions struct {
	capability, outcome string
	phases              []phase
}

// load renders the series of callee lab-cvd in namespace lab as promqltest
// loads them, one sample a minute, and returns the minutes they span.
func load(series ...sessions) (string, int) {
	var b strings.Builder
	b.WriteString("load 1m\n")
	span := 0
	for _, s := range series {
		n := 0
		for _, p := range s.phases {
			n += p.minutes
		}
		span = max(span, n)
		fmt.Fprintf(&b, "  hcp_sessions_total{namespace=%q, pod=\"lab-cvd-0\", callee=\"lab-cvd\", capability=%q, outcome=%q} %s\n",
			"lab", s.capability, s.outcome, counterSeries(s.phases...))
	}
	return b.String(), span
}

// alertExpr is the expression of the named alert of rules/hcp.rules.yaml.
func alertExpr(t *testing.T, name string) string {
	t.Helper()
	for _, g := range loadRules(t, readFile(t, "charts/hcp-operator/rules/hcp.rules.yaml")).Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return r.Expr
			}
		}
	}
	t.Fatalf("no alert %s", name)
	return ""
}

// firing evaluates expr with Prometheus' engine over the loaded series at
// their last minute, and returns what it fires for: the capabilities.
func firing(t *testing.T, expr, input string, at int) []string {
	t.Helper()
	st := promqltest.LoadedStorage(t, input)
	t.Cleanup(func() { _ = st.Close() })
	ng := promqltest.NewTestEngine(t, false, 0, 10_000_000)
	q, err := ng.NewInstantQuery(context.Background(), st, nil, expr, time.Unix(0, 0).Add(time.Duration(at)*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	res := q.Exec(context.Background())
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range vec {
		if s.Metric.Get("namespace") != "lab" || s.Metric.Get("callee") != "lab-cvd" || s.Metric.Len() != 3 {
			t.Errorf("alert labels %s: want namespace, callee, capability", s.Metric)
		}
		out = append(out, fmt.Sprintf("%s=%.3f", s.Metric.Get("capability"), s.F))
	}
	sort.Strings(out)
	return out
}

// TestSessionSLOAlerts evaluates the two burn-rate alerts of the session
// SLO (99 % of the sessions that ran complete) with Prometheus' engine on
// histories of hcp_sessions_total: what pages, what opens a ticket, what
// does not count against the objective, and that an alert resolves once
// the failures stop.
func TestSessionSLOAlerts(t *testing.T) {
	fast, slow := alertExpr(t, "HCPSessionSLOFastBurn"), alertExpr(t, "HCPSessionSLOSlowBurn")
	steady := func(minutes int, perMin float64) []phase { return []phase{{minutes, perMin}} }
	for _, tc := range []struct {
		name       string
		series     []sessions
		fast, slow []string
	}{
		{
			name: "healthy: 0.5 % fail",
			series: []sessions{
				{"run", "COMPLETED", steady(4400, 199)},
				{"run", "FAILED", steady(4400, 1)},
			},
		},
		{
			name: "an outage in the last hour: a third fail, pages at once",
			series: []sessions{
				{"run", "COMPLETED", []phase{{300, 10}, {60, 6}}},
				{"run", "FAILED", []phase{{300, 0}, {60, 3}}},
			},
			fast: []string{"run=0.333"},
			slow: []string{"run=0.051"}, // and a ticket: 5 % of the day's sessions failed
		},
		{
			name: "10 % fail for 6 hours: the 6-hour window pages",
			series: []sessions{
				{"run", "COMPLETED", steady(400, 9)},
				{"run", "TIMED_OUT", steady(400, 1)},
			},
			fast: []string{"run=0.100"},
			slow: []string{"run=0.100"},
		},
		{
			name: "4 % fail for a day: a ticket, no page",
			series: []sessions{
				{"run", "COMPLETED", steady(1500, 24)},
				{"run", "FAILED", steady(1500, 1)},
			},
			slow: []string{"run=0.040"},
		},
		{
			name: "1.5 % fail for three days: a ticket",
			series: []sessions{
				{"run", "COMPLETED", steady(4400, 197)},
				{"run", "FAILED", steady(4400, 3)},
			},
			slow: []string{"run=0.015"},
		},
		{
			// The short windows (5 and 30 minutes) see no failure: the page
			// resolves; the ticket's (2 hours) still does.
			name: "the failures stopped 40 minutes ago: the page resolves",
			series: []sessions{
				{"run", "COMPLETED", []phase{{360, 6}, {40, 10}}},
				{"run", "FAILED", []phase{{360, 4}, {40, 0}}},
			},
			slow: []string{"run=0.360"},
		},
		{
			name: "aborts and rejections do not count against the objective",
			series: []sessions{
				{"run", "COMPLETED", steady(400, 10)},
				{"run", "ABORTED", steady(400, 10)},
				{"run", "REJECTED", steady(400, 50)},
				{"", "REJECTED", steady(400, 50)},
			},
		},
		{
			name: "per capability: only the failing one fires",
			series: []sessions{
				{"run", "COMPLETED", steady(400, 10)},
				{"plan", "COMPLETED", steady(400, 5)},
				{"plan", "FAILED", steady(400, 5)},
			},
			fast: []string{"plan=0.500"},
			slow: []string{"plan=0.500"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			input, at := load(tc.series...)
			if got := firing(t, fast, input, at); strings.Join(got, ",") != strings.Join(tc.fast, ",") {
				t.Errorf("HCPSessionSLOFastBurn fires for %v, want %v", got, tc.fast)
			}
			if got := firing(t, slow, input, at); strings.Join(got, ",") != strings.Join(tc.slow, ",") {
				t.Errorf("HCPSessionSLOSlowBurn fires for %v, want %v", got, tc.slow)
			}
		})
	}
}
