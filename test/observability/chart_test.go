package observability

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	s := strings.ToLower(strings.TrimSpace(heading))
	s = regexp.MustCompile("[^a-z0-9 _-]").ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

// TestAlertRules: every alert has a severity, a summary, a description and
// a runbook that exists in docs/monitoring.md; names are unique; durations
// parse.
func TestAlertRules(t *testing.T) {
	groups := loadRules(t, readFile(t, "charts/hcp-operator/rules/hcp.rules.yaml"))
	anchors := map[string]bool{}
	for _, l := range strings.Split(string(readFile(t, "docs/monitoring.md")), "\n") {
		if h, ok := strings.CutPrefix(strings.TrimLeft(l, "#"), " "); ok && strings.HasPrefix(l, "#") {
			anchors[githubAnchor(h)] = true
		}
	}
	seen := map[string]bool{}
	const runbooks = "https://github.com/hcp-io/hcp-operator/blob/main/docs/monitoring.md#"
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" || seen[r.Alert] {
				t.Errorf("group %s: alert name %q empty or repeated", g.Name, r.Alert)
			}
			seen[r.Alert] = true
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s", r.Alert, a)
				}
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbooks)
			if !ok || !anchors[anchor] {
				t.Errorf("%s: runbook_url %q is not a heading of docs/monitoring.md", r.Alert, r.Annotations["runbook_url"])
			}
			if anchor != strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook anchor %q, want the alert's own section #%s", r.Alert, anchor, strings.ToLower(r.Alert))
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
		}
	}
	if n < 10 {
		t.Fatalf("%d alerts", n)
	}
}

// TestKustomizeRulesAreTheChartRules: config/prometheus carries the same
// groups as the chart.
func TestKustomizeRulesAreTheChartRules(t *testing.T) {
	var pr struct {
		Kind string     `json:"kind"`
		Spec ruleGroups `json:"spec"`
	}
	if err := yaml.Unmarshal(readFile(t, "config/prometheus/prometheusrule.yaml"), &pr); err != nil {
		t.Fatal(err)
	}
	chart := loadRules(t, readFile(t, "charts/hcp-operator/rules/hcp.rules.yaml"))
	if pr.Kind != "PrometheusRule" || !equality.Semantic.DeepEqual(pr.Spec, chart) {
		t.Fatal("config/prometheus/prometheusrule.yaml differs from charts/hcp-operator/rules/hcp.rules.yaml: copy the groups over")
	}
	kust := string(readFile(t, "config/prometheus/kustomization.yaml"))
	for _, f := range []string{"prometheusrule.yaml", "podmonitor.yaml", "monitor.yaml"} {
		if !strings.Contains(kust, "- "+f) {
			t.Errorf("config/prometheus/kustomization.yaml does not list %s", f)
		}
	}
}

// TestDashboardLayout: unique panel ids, every query panel on the
// ${datasource} variable, panels inside the 24-column grid and not
// overlapping.
func TestDashboardLayout(t *testing.T) {
	d := loadDashboard(t, readFile(t, "charts/hcp-operator/dashboards/hcp.json"))
	if d.UID == "" || d.Title == "" {
		t.Fatalf("uid %q title %q", d.UID, d.Title)
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	queries := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d repeated", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q outside the grid: %+v", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Fatalf("panels %q and %q overlap at %d,%d", other, p.Title, x, y)
				}
				taken[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %+v, %d targets", p.Title, p.Datasource, len(p.Targets))
		}
		queries += len(p.Targets)
	}
	if queries < 20 {
		t.Fatalf("%d queries", queries)
	}
}

// helm returns the helm binary: $HELM, else the Makefile's pinned one,
// built with `make helm` when missing (as hack/check-install.sh does).
func helm(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	root := repoRoot(t)
	m := regexp.MustCompile(`(?m)^HELM_VERSION \?= *(\S+)$`).FindSubmatch(readFile(t, "Makefile"))
	if m == nil {
		t.Fatal("no HELM_VERSION in the Makefile")
	}
	bin := filepath.Join(root, "bin", "helm-"+string(m[1]))
	if _, err := os.Stat(bin); err != nil {
		start := time.Now()
		cmd := exec.Command("make", "-s", "--no-print-directory", "helm")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make helm: %v\n%s", err, out)
		}
		t.Logf("built %s in %s", bin, time.Since(start).Round(time.Second))
	}
	return bin
}

// render runs helm template on the chart and returns its objects.
func render(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	cmd := exec.Command(helm(t), append([]string{"template", "hcp-operator", filepath.Join(repoRoot(t), "charts", "hcp-operator"), "--namespace", "hcp-system"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, stderr.String())
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("decoding the rendering: %v", err)
		}
		if m != nil {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	return objs
}

func find(objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind {
			return o
		}
	}
	return nil
}

// TestChartMonitoring renders the chart with the monitoring values on and
// off: the PrometheusRule carries the rules file unchanged (its Prometheus
// templates untouched by Helm), the ConfigMap the dashboard byte for byte
// under the Grafana sidecar's label, the PodMonitor the relabelings the
// rules rely on.
func TestChartMonitoring(t *testing.T) {
	if testing.Short() {
		t.Skip("runs helm")
	}
	off := render(t)
	for _, k := range []string{"PrometheusRule", "PodMonitor"} {
		if find(off, k) != nil {
			t.Errorf("default values render a %s", k)
		}
	}
	for _, o := range off {
		if o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-dashboard") {
			t.Errorf("default values render the dashboard ConfigMap")
		}
	}

	on := render(t, "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.labels.release=kube-prometheus",
		"--set", "grafanaDashboard.enabled=true", "--set", "grafanaDashboard.namespace=monitoring",
		"--set", "grafanaDashboard.sidecarLabel=dashboards.example.com/load", "--set", "grafanaDashboard.sidecarLabelValue=yes",
		"--set", "sidecarPodMonitor.enabled=true", "--set", "watchNamespaces={lab-a,lab-b}", "--set", "metrics.serviceMonitor.enabled=true")

	// The manager's hcp_operator_* series keep their own namespace label.
	if sm := find(on, "ServiceMonitor"); sm == nil {
		t.Error("no ServiceMonitor")
	} else if eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints"); len(eps) != 1 || eps[0].(map[string]any)["honorLabels"] != true {
		t.Errorf("ServiceMonitor endpoints %v: want honorLabels", eps)
	}

	pr := find(on, "PrometheusRule")
	if pr == nil {
		t.Fatal("no PrometheusRule")
	}
	if pr.GetAPIVersion() != "monitoring.coreos.com/v1" || pr.GetNamespace() != "hcp-system" || pr.GetLabels()["release"] != "kube-prometheus" {
		t.Errorf("PrometheusRule %s %s/%s labels %v", pr.GetAPIVersion(), pr.GetNamespace(), pr.GetName(), pr.GetLabels())
	}
	specJSON, err := yaml.Marshal(pr.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	if got, want := loadRules(t, specJSON), loadRules(t, readFile(t, "charts/hcp-operator/rules/hcp.rules.yaml")); !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("the PrometheusRule's spec is not rules/hcp.rules.yaml")
	}
	if !strings.Contains(string(specJSON), "{{ $labels.namespace }}") {
		t.Errorf("Helm rendered the alerts' Prometheus templates")
	}

	var cm *unstructured.Unstructured
	for _, o := range on {
		if o.GetKind() == "ConfigMap" && o.GetName() == "hcp-operator-dashboard" {
			cm = o
		}
	}
	if cm == nil {
		t.Fatal("no dashboard ConfigMap")
	}
	if cm.GetNamespace() != "monitoring" || cm.GetLabels()["dashboards.example.com/load"] != "yes" {
		t.Errorf("ConfigMap %s/%s labels %v", cm.GetNamespace(), cm.GetName(), cm.GetLabels())
	}
	data, _, _ := unstructured.NestedString(cm.Object, "data", "hcp.json")
	if want := strings.TrimRight(string(readFile(t, "charts/hcp-operator/dashboards/hcp.json")), "\n"); data != want {
		t.Errorf("the ConfigMap's hcp.json differs from dashboards/hcp.json (%d vs %d bytes)", len(data), len(want))
	}
	loadDashboard(t, []byte(data))

	pm := find(on, "PodMonitor")
	if pm == nil {
		t.Fatal("no PodMonitor")
	}
	ns, _, _ := unstructured.NestedStringSlice(pm.Object, "spec", "namespaceSelector", "matchNames")
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if strings.Join(ns, ",") != "lab-a,lab-b" || len(eps) != 1 {
		t.Fatalf("PodMonitor namespaces %v endpoints %v", ns, eps)
	}
	ep := eps[0].(map[string]any)
	relabel, _ := yaml.Marshal(ep["relabelings"])
	if ep["port"] != "probes" || !strings.Contains(string(relabel), "targetLabel: callee") || !strings.Contains(string(relabel), "targetLabel: caller") {
		t.Errorf("PodMonitor endpoint %v", ep)
	}
	// Without watchNamespaces it scrapes every namespace.
	if pm := find(render(t, "--set", "sidecarPodMonitor.enabled=true"), "PodMonitor"); pm == nil {
		t.Error("no PodMonitor")
	} else if anyNS, _, _ := unstructured.NestedBool(pm.Object, "spec", "namespaceSelector", "any"); !anyNS {
		t.Errorf("PodMonitor namespaceSelector %v", pm.Object["spec"])
	}
}
