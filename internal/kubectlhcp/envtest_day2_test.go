package kubectlhcp

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// -o and resubmit against a real API server.

func TestOutputCommands(t *testing.T) {
	e := apiServer(t)
	ns := namespace(t, e)
	run := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(40))
	done := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(10))
	setStatus(t, e, done, ended(hcpv1alpha1.SessionCompleted, "completed"))

	r := kubectlHCP(t, e, "", "sessions", "-n", ns, "-o", "json")
	var l struct {
		Kind  string `json:"kind"`
		Items []struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
			Columns  SessionColumns    `json:"columns"`
		} `json:"items"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.out), &l) != nil || l.Kind != "List" || len(l.Items) != 2 {
		t.Fatalf("sessions -o json: exit %d, not a List of 2", r.code)
	}
	byName := map[string]SessionColumns{}
	for _, it := range l.Items {
		byName[it.Metadata.Name] = it.Columns
		if len(it.Metadata.ManagedFields) != 0 {
			t.Error("managedFields printed")
		}
	}
	if c := byName[run.Name]; c.State != "RUNNING" || c.Progress != "40%" || c.DurationSeconds == nil {
		t.Errorf("running: %+v", c)
	}
	if c := byName[done.Name]; c.State != "COMPLETED" || c.Progress != "100%" {
		t.Errorf("completed: %+v", c)
	}
	r = kubectlHCP(t, e, "", "sessions", "-n", ns, "--state", "completed", "-o", "name")
	if r.code != 0 || r.out != "hcpsession.hcp.io/"+done.Name+"\n" {
		t.Errorf("sessions -o name: exit %d, %q", r.code, r.out)
	}
	r = kubectlHCP(t, e, "", "sessions", "-n", ns, "--callee", "nobody", "-o", "json")
	if r.code != 0 || !strings.Contains(r.out, `"items": []`) {
		t.Errorf("no sessions, -o json: exit %d, %q (want an empty List)", r.code, r.out)
	}
	r = kubectlHCP(t, e, "", "sessions", "-n", ns, "-o", "csv")
	if r.code != 1 || !strings.Contains(r.err, `-o "csv": not an output format (want one of wide, json, yaml`) {
		t.Errorf("-o csv: exit %d", r.code)
	}

	r = kubectlHCP(t, e, "", "describe", "-n", ns, run.Name[:8], "-o", "yaml")
	for _, want := range []string{"apiVersion: cli.hcp.io/v1alpha1", "kind: SessionDescription", "verdict: admitted", "  name: " + run.Name, "timeline:"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("describe -o yaml lacks %q", want)
		}
	}
	r = kubectlHCP(t, e, "", "describe", "-n", ns, run.Name[:8], "-o", "jsonpath={.columns.state}")
	if r.out != "RUNNING" {
		t.Errorf("describe -o jsonpath: %q", r.out)
	}
	r = kubectlHCP(t, e, "", "describe", "-n", ns, run.Name[:8], "-o", "name")
	if r.out != "hcpsession.hcp.io/"+run.Name+"\n" {
		t.Errorf("describe -o name: %q", r.out)
	}
}

// checkpointConfigMap stores the task as the callee sidecar does once the
// harness checkpoints.
func checkpointConfigMap(t *testing.T, e *testbed.Env, hs *hcpv1alpha1.HCPSession, taskJSON string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hcp-session-" + hs.Name, Namespace: hs.Namespace},
		Data: map[string]string{"task.json": taskJSON, "checkpoint-id": "ckpt-004"}}
	if err := e.Client.Create(t.Context(), cm); err != nil {
		t.Fatal(err)
	}
}

func TestResubmitCommand(t *testing.T) {
	e := apiServer(t)
	ns := namespace(t, e)
	caller := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Name: "alpha-caller", Namespace: ns}, Spec: hcpv1alpha1.CallerSpec{CallerID: "alpha"}}
	if err := e.Client.Create(t.Context(), caller); err != nil {
		t.Fatal(err)
	}
	old := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(10))
	setStatus(t, e, old, ended(hcpv1alpha1.SessionFailed, "harness_failed"))
	checkpointConfigMap(t, e, old, `{"session_id":"`+old.Name+`","session_token":"secret","callee_id":"lab-cvd","capability":"cvd.run-synthesis",`+
		`"intent":"a test task","inputs":{"steps":7,"recipe":"s3://lab/r.yaml"},`+
		`"constraints":{"data_classification":"T2","max_risk_level":"R3","max_duration":"PT5M","deadline":"2026-11-25T17:00:00Z"}}`)
	fresh := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(0))
	srv, got := fakeCallerSidecar(t, fresh.Name, TaskView{MessageID: "7f1c0000-0000-4000-8000-000000000001", Status: "accepted", SessionID: fresh.Name, RiskLevel: "R2"})

	r := kubectlHCP(t, e, "", "resubmit", "-n", ns, old.Name[:8], "--sidecar-url", srv.URL)
	for _, want := range []string{
		"resubmitting session " + old.Name + " (cvd.run-synthesis on lab-cvd for alpha, FAILED); the task from ConfigMap hcp-session-" + old.Name,
		"accepted: session " + fresh.Name,
		"NAME ", fresh.Name + "   lab-cvd",
	} {
		if !strings.Contains(r.out, want) {
			t.Errorf("resubmit lacks %q", want)
		}
	}
	if r.code != 0 || len(*got) != 1 {
		t.Fatalf("resubmit: exit %d, %d submits", r.code, len(*got))
	}
	req := (*got)[0]
	if req.MessageID != "" || req.CalleeID != "lab-cvd" || req.Capability != "cvd.run-synthesis" || req.Intent != "a test task" ||
		string(req.Inputs) != `{"steps":7,"recipe":"s3://lab/r.yaml"}` || req.Constraints.DataClassification != "T2" ||
		req.Constraints.MaxRiskLevel != "R3" || req.Constraints.MaxDuration.String() != "PT5M" || req.Constraints.Deadline != nil {
		t.Errorf("the sidecar got %+v", req)
	}

	// Overrides, and -o name: only the new session on stdout.
	r = kubectlHCP(t, e, "", "resubmit", "-n", ns, old.Name, "--sidecar-url", srv.URL, "--data-class", "t1", "--intent", "again", "-o", "name")
	if r.code != 0 || r.out != "hcpsession.hcp.io/"+fresh.Name+"\n" || !strings.Contains(r.err, "accepted: session") {
		t.Errorf("-o name: exit %d, %q", r.code, r.out)
	}
	if req := (*got)[1]; req.Constraints.DataClassification != "T1" || req.Intent != "again" || req.Constraints.MaxRiskLevel != "R3" {
		t.Errorf("overrides: %+v", req)
	}

	// Refused: a session that has not ended, unless --force.
	r = kubectlHCP(t, e, "", "resubmit", "-n", ns, fresh.Name, "--sidecar-url", srv.URL)
	if r.code != 1 || !strings.Contains(r.err, "is RUNNING: a resubmit now would run the task twice at once") || len(*got) != 2 {
		t.Errorf("running: exit %d", r.code)
	}
	// No stored task: the inputs must be given; the constraints are the
	// session's.
	plain := newSession(t, e, ns, uuid.NewString(), "lab-cvd", "alpha", runningStatus(10))
	setStatus(t, e, plain, ended(hcpv1alpha1.SessionCompleted, "completed"))
	r = kubectlHCP(t, e, "", "resubmit", "-n", ns, plain.Name, "--sidecar-url", srv.URL)
	if r.code != 1 || !strings.Contains(r.err, "the inputs of session "+plain.Name+" are not stored in the cluster") || !strings.Contains(r.err, "give them with --inputs") {
		t.Errorf("no stored task: exit %d", r.code)
	}
	r = kubectlHCP(t, e, "", "resubmit", "-n", ns, fresh.Name, "--force", "--inputs", `{"steps":1}`, "--sidecar-url", srv.URL, "-o", "json")
	if r.code != 0 || !strings.Contains(r.out, `"kind": "HCPSession"`) {
		t.Errorf("--force --inputs: exit %d", r.code)
	}
	if req := (*got)[2]; string(req.Inputs) != `{"steps":1}` || req.Constraints.DataClassification != "T1" || req.Constraints.MaxDuration.String() != "PT10M" || req.Constraints.MaxRiskLevel != "" {
		t.Errorf("from the session's spec: %+v", req)
	}
	// The Caller is found by id; none has it.
	other := newSession(t, e, ns, "", "lab-cvd", "nobody", runningStatus(10))
	setStatus(t, e, other, ended(hcpv1alpha1.SessionCompleted, "completed"))
	r = kubectlHCP(t, e, "", "resubmit", "-n", ns, other.Name, "--inputs", "{}", "--sidecar-url", srv.URL)
	if r.code != 1 || !strings.Contains(r.err, `no Caller with id "nobody" in namespace `+ns+` submits for this session: give --caller NAME`) {
		t.Errorf("no Caller: exit %d", r.code)
	}
}
