// Package observability checks what the project ships for Prometheus and
// Grafana (the chart's rules/hcp.rules.yaml and dashboards/hcp.json, their
// kustomize copies, the chart templates that carry them) against the code:
// every expression parses as PromQL, and every metric and label it reads is
// exported by the manager or the hcp-sidecar.
package observability

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
)

// repoRoot is the repository's top directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func readFile(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// metric is one exported metric: its name and variable labels.
type metric struct {
	name   string
	labels []string
	source string
}

var descRE = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

// describe lists the metrics c describes. Desc has no accessors for its
// name; its String form is stable ("Desc{fqName: ..., variableLabels: {a,b}}").
func describe(t *testing.T, c prometheus.Collector, source string) []metric {
	t.Helper()
	ch := make(chan *prometheus.Desc, 1024)
	go func() { c.Describe(ch); close(ch) }()
	var out []metric
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		var ls []string
		if m[2] != "" {
			ls = strings.Split(m[2], ",")
		}
		out = append(out, metric{name: m[1], labels: ls, source: source})
	}
	return out
}

// exported is every metric the project's two binaries serve, by name:
// the hcp-sidecar's collectors (internal/sidecar/metrics, as cmd/hcp-sidecar
// registers them) and the manager's registry (controller-runtime's, with
// the session collector the HCPSession controller registers on it).
func exported(t *testing.T) map[string]metric {
	t.Helper()
	sidecar := prometheus.NewRegistry()
	metrics.New(sidecar)
	out := map[string]metric{}
	add := func(ms []metric) {
		for _, m := range ms {
			out[m.name] = m
			// A histogram is scraped as _bucket, _sum and _count.
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[m.name+s] = metric{name: m.name + s, labels: append(slices.Clone(m.labels), "le"), source: m.source}
			}
		}
	}
	add(describe(t, sidecar, "hcp-sidecar"))
	manager, ok := crmetrics.Registry.(prometheus.Collector)
	if !ok {
		t.Fatalf("controller-runtime's registry %T cannot be described", crmetrics.Registry)
	}
	add(describe(t, manager, "manager (controller-runtime)"))
	add(describe(t, controller.NewSessionCollector(nil, nil), "manager (hcp_operator)"))
	return out
}

// external metrics the broker group of the rules reads: RabbitMQ's
// rabbitmq_prometheus plugin (per-object endpoint), not this project. HCP
// has no queue depth of its own.
var external = map[string][]string{
	"rabbitmq_queue_messages_ready": {"vhost", "queue"},
}

// targetLabels are added by the scrape (Prometheus and the Prometheus
// Operator), or by the PodMonitor's relabelings (callee, caller).
var targetLabels = []string{"namespace", "pod", "job", "instance", "container", "endpoint", "service", "callee", "caller"}

// grafanaVars replaces the dashboard's variables with values PromQL parses.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "${namespace}", ".*", "$namespace", ".*", "${callee}", ".*", "$callee", ".*")

type rule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

func loadRules(t *testing.T, data []byte) ruleGroups {
	t.Helper()
	var g ruleGroups
	if err := yaml.UnmarshalStrict(data, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T, data []byte) dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// queries are the PromQL expressions of the rules and the dashboard, named.
func queries(t *testing.T) map[string]string {
	t.Helper()
	q := map[string]string{}
	for _, g := range loadRules(t, readFile(t, "charts/hcp-operator/rules/hcp.rules.yaml")).Groups {
		for _, r := range g.Rules {
			q["rule "+g.Name+"/"+r.Alert+r.Record] = r.Expr
		}
	}
	d := loadDashboard(t, readFile(t, "charts/hcp-operator/dashboards/hcp.json"))
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			q[fmt.Sprintf("panel %q %s", p.Title, tg.RefID)] = grafanaVars.Replace(tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		// label_values(SELECTOR, LABEL): Grafana's, not PromQL; check the selector.
		s, _ := v.Query.(map[string]any)["query"].(string)
		m := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`).FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("variable %s: query %q is not label_values(selector, label)", v.Name, s)
		}
		q["variable "+v.Name] = grafanaVars.Replace(m[1])
	}
	return q
}

var promql = parser.NewParser(parser.Options{})

// TestQueriesReadExportedMetrics parses every expression of the rules and
// the dashboard and checks every metric it selects, and every label it
// matches on, against what the binaries export.
func TestQueriesReadExportedMetrics(t *testing.T) {
	have := exported(t)
	used := map[string]bool{}
	qs := queries(t)
	if len(qs) < 30 {
		t.Fatalf("only %d queries found", len(qs))
	}
	for _, name := range slices.Sorted(maps.Keys(qs)) {
		expr, err := promql.ParseExpr(qs[name])
		if err != nil {
			t.Errorf("%s: %v\n%s", name, err, qs[name])
			continue
		}
		for _, sel := range parser.ExtractSelectors(expr) {
			var metricName string
			for _, m := range sel {
				if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
					metricName = m.Value
				}
			}
			if metricName == "" {
				t.Errorf("%s: a selector without a metric name: %v", name, sel)
				continue
			}
			used[metricName] = true
			var allowed []string
			if ls, ok := external[metricName]; ok {
				allowed = ls
			} else if m, ok := have[metricName]; ok {
				allowed = append(slices.Clone(targetLabels), m.labels...)
			} else {
				t.Errorf("%s: metric %s is exported by neither the manager nor the hcp-sidecar", name, metricName)
				continue
			}
			for _, m := range sel {
				if m.Name != model.MetricNameLabel && !slices.Contains(allowed, m.Name) {
					t.Errorf("%s: %s has no label %q (it has %v)", name, metricName, m.Name, allowed)
				}
			}
		}
	}
	t.Logf("%d queries read %d metrics", len(qs), len(used))
}

// TestMonitoringDocListsEveryHCPMetric: docs/monitoring.md's metric tables
// name every hcp_* metric the binaries export, and no other hcp_* metric.
func TestMonitoringDocListsEveryHCPMetric(t *testing.T) {
	doc := string(readFile(t, "docs/monitoring.md"))
	var names []string
	for n, m := range exported(t) {
		if strings.HasPrefix(n, "hcp_") && n == m.name && !strings.HasSuffix(n, "_bucket") && !strings.HasSuffix(n, "_sum") && !strings.HasSuffix(n, "_count") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) < 16 {
		t.Fatalf("only %d hcp_ metrics found: %v", len(names), names)
	}
	for _, n := range names {
		if !strings.Contains(doc, "| `"+n+"` |") {
			t.Errorf("docs/monitoring.md has no table row for %s", n)
		}
	}
	have := exported(t)
	for _, m := range regexp.MustCompile("\\| `(hcp_[a-z_]+)` \\|").FindAllStringSubmatch(doc, -1) {
		if _, ok := have[m[1]]; !ok {
			t.Errorf("docs/monitoring.md lists %s, which nothing exports", m[1])
		}
	}
}
