package kubectlhcp

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// outputFor is -o as a command parses it from args.
func outputFor(t *testing.T, args ...string) *outputFlags {
	t.Helper()
	cmd := &cobra.Command{Use: "x"}
	o := addOutputFlags(cmd, "more")
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	return o
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run %s -update writes it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func goldenSessions() []hcpv1alpha1.HCPSession {
	r := running()
	r.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "hcp-sidecar", Operation: metav1.ManagedFieldsOperationUpdate}}
	return []hcpv1alpha1.HCPSession{r, completed(), rejected()}
}

func printSessions(t *testing.T, args ...string) string {
	t.Helper()
	o := outputFor(t, args...)
	if o.table() {
		t.Fatalf("%v is a table", args)
	}
	obj, err := sessionsObject(goldenSessions(), t0.Add(65*time.Second), o.showManagedFields(), o.format() == formatName)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := o.print(&b, obj); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestSessionsOutput(t *testing.T) {
	out := printSessions(t, "-o", "json")
	golden(t, "sessions.json", out)
	// What a script reads: the objects' fields, and the computed columns.
	var l struct {
		Kind  string `json:"kind"`
		Items []struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Metadata   metav1.ObjectMeta `json:"metadata"`
			Status     struct{ State string }
			Columns    SessionColumns `json:"columns"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("-o json is not JSON: %v", err)
	}
	if l.Kind != "List" || len(l.Items) != 3 {
		t.Fatalf("kind %q with %d items, want a List of 3", l.Kind, len(l.Items))
	}
	it := l.Items[0]
	if it.APIVersion != "hcp.io/v1alpha1" || it.Kind != "HCPSession" || it.Status.State != "RUNNING" {
		t.Errorf("item 0: %s %s state %s", it.APIVersion, it.Kind, it.Status.State)
	}
	if len(it.Metadata.ManagedFields) != 0 {
		t.Error("managedFields printed without --show-managed-fields")
	}
	c := it.Columns
	if c.Progress != "40%" || *c.Percent != 40 || c.Age != "65s" || c.AgeSeconds != 65 || c.Duration != "1m4s" || *c.DurationSeconds != 64 || c.LastEvent != "#14 3s ago" || *c.LastEventAgoSeconds != 3 {
		t.Errorf("running columns %+v", c)
	}
	if c := l.Items[2].Columns; c.State != "REJECTED" || c.Duration != "-" || c.DurationSeconds != nil || c.Progress != "-" {
		t.Errorf("rejected columns %+v", c)
	}

	golden(t, "sessions.yaml", printSessions(t, "-o", "yaml"))
	golden(t, "sessions.name", printSessions(t, "-o", "name"))
	if got := printSessions(t, "-o", "jsonpath={range .items[*]}{.metadata.name} {.columns.duration}{\"\\n\"}{end}"); got != "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10 1m4s\n9a0e3f1d-2c7b-4e10-8b1c-8f0e2d7a4c55 2m5s\n0f7c1d2e-3a4b-4c5d-9e6f-7a8b9c0d1e2f -\n" {
		t.Errorf("jsonpath: %q", got)
	}
	if got := printSessions(t, "--template", "{{range .items}}{{.columns.state}},{{end}}"); got != "RUNNING,COMPLETED,REJECTED," {
		t.Errorf("--template alone (go-template): %q", got)
	}
	if got := printSessions(t, "-o", "json", "--show-managed-fields"); !strings.Contains(got, `"manager": "hcp-sidecar"`) {
		t.Error("--show-managed-fields dropped managedFields")
	}
}

func TestOutputFormats(t *testing.T) {
	for _, c := range []struct {
		args         []string
		table, wide  bool
		errSubstring string
	}{
		{args: nil, table: true},
		{args: []string{"-o", "wide"}, table: true, wide: true},
		{args: []string{"-o", "json"}},
		{args: []string{"-o", "yaml"}},
		{args: []string{"-o", "name"}},
		{args: []string{"-o", "csv"}, errSubstring: `-o "csv": not an output format (want one of wide, json, yaml, kyaml, name,`},
	} {
		o := outputFor(t, c.args...)
		if o.table() != c.table || o.wide() != c.wide {
			t.Errorf("%v: table %v wide %v", c.args, o.table(), o.wide())
		}
		err := o.check()
		switch {
		case c.errSubstring == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.errSubstring != "" && (err == nil || !strings.Contains(err.Error(), c.errSubstring)):
			t.Errorf("%v: error %v, want %q", c.args, err, c.errSubstring)
		}
	}
}

func TestDescribeOutput(t *testing.T) {
	hs := completed()
	hs.UID = "5f0c3d1e-0000-4000-8000-000000000001"
	hs.Status.Conditions = []metav1.Condition{{Type: hcpv1alpha1.ConditionHandover, Status: "True", Reason: "TakenOver",
		Message: "handed over by its replica; resumed by pod hcp-callee-lab-cvd-7d9f-abcde", LastTransitionTime: metav1.Time{Time: t0.Add(40 * time.Second)}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: hs.Status.PodName}, Spec: corev1.PodSpec{NodeName: "hcp-local"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.250.0.7", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	d := Description{Session: &hs, Pod: pod, Policies: []string{"materials-lab"}}
	for _, f := range []string{"json", "yaml"} {
		o := outputFor(t, "-o", f)
		obj, err := descriptionObject(d, t0.Add(time.Hour), false)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := o.print(&b, obj); err != nil {
			t.Fatal(err)
		}
		golden(t, "describe."+f, b.String())
		if f != "json" {
			continue
		}
		var v SessionDescription
		if err := json.Unmarshal(b.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		if v.Decision.Verdict != "admitted" || v.Decision.Rule != "" || strings.Join(v.Decision.Policies, ",") != "materials-lab" ||
			v.Pod == nil || v.Pod.Status != "Running, ready" || v.Columns.Duration != "2m5s" || len(v.Timeline) == 0 {
			t.Errorf("description %+v", v)
		}
	}
}

func TestTopologyOutput(t *testing.T) {
	topo := HarnessTopology{
		Kind: "Callee", Name: "lab-cvd", Namespace: "lab", ID: "lab-cvd", Vhost: "/hcp", Username: "callee.lab-cvd@/hcp",
		TopologyReady: &metav1.Condition{Type: "TopologyReady", Status: "True", Reason: "Reconciled", LastTransitionTime: metav1.Time{Time: t0}},
		Broker:        "connection Secret lab/hcp-broker", Management: "http://127.0.0.1:15672 answers",
		Items: []TopologyItem{
			{What: "queue", BrokerName: "hcp.cmd.lab-cvd", Object: "Queue/hcp-callee-lab-cvd", Ready: "True", Details: "quorum, 3 messages (2 ready, 1 unacked), 1 consumers"},
		},
	}
	u, err := toObject(topologyView(topo), ViewGroupVersion.WithKind("HarnessTopology"))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := outputFor(t, "-o", "yaml").print(&b, list([]unstructured.Unstructured{*u})); err != nil {
		t.Fatal(err)
	}
	golden(t, "topology.yaml", b.String())
}
