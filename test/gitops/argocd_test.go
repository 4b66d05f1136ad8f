// Package gitops tests what the project gives GitOps tools: the Argo CD
// health checks in charts/hcp-operator/argocd (run here with a Go Lua
// interpreter the way Argo CD runs them) against objects shaped as the
// operator and the sidecar write them, and their agreement with kstatus
// (Flux, kpt, kubectl wait).
package gitops

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	lua "github.com/yuin/gopher-lua"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
)

func argocdDir(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "charts", "hcp-operator", "argocd")
}

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(argocdDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// health is what an Argo CD health script returns.
type health struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

// toLua converts decoded JSON as Argo CD does (objects and arrays become
// tables, arrays indexed from 1).
func toLua(L *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case map[string]any:
		t := L.NewTable()
		for k, e := range x {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	case []any:
		t := L.NewTable()
		for _, e := range x {
			t.Append(toLua(L, e))
		}
		return t
	case string:
		return lua.LString(x)
	case bool:
		return lua.LBool(x)
	case float64:
		return lua.LNumber(x)
	case int64:
		return lua.LNumber(x)
	case nil:
		return lua.LNil
	}
	panic(fmt.Sprintf("%T", v))
}

// runHealth runs script with obj as Argo CD's resource health check does:
// a state with only the base, table and package libraries, obj global,
// the returned table read as {status, message}.
func runHealth(t *testing.T, script string, obj map[string]any) health {
	t.Helper()
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}} {
		L.Push(L.NewFunction(lib.open))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}
	// JSON numbers, as Argo CD sees them after decoding the object.
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var decoded map[string]any
	if err := json.Unmarshal(b, &decoded); err != nil {
		t.Fatal(err)
	}
	L.SetGlobal("obj", toLua(L, decoded))
	if err := L.DoString(script); err != nil {
		t.Fatalf("the script fails: %v", err)
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("the script returned %v, not a table", L.Get(-1))
	}
	h := health{Status: lua.LVAsString(ret.RawGetString("status")), Message: lua.LVAsString(ret.RawGetString("message"))}
	switch h.Status {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown":
	default:
		t.Fatalf("status %q is not an Argo CD health status", h.Status)
	}
	return h
}

// agrees: the Argo CD health and the kstatus of one object say the same.
func agrees(t *testing.T, obj map[string]any, h health) {
	t.Helper()
	res, err := kstatus.Compute(&unstructured.Unstructured{Object: obj})
	if err != nil {
		t.Fatal(err)
	}
	want := map[kstatus.Status][]string{
		kstatus.CurrentStatus:    {"Healthy", "Suspended"},     // ScaledToZero: what the spec asks for
		kstatus.InProgressStatus: {"Progressing", "Suspended"}, // a harness's own pause is in progress for kstatus
		kstatus.FailedStatus:     {"Degraded"},
	}[res.Status]
	for _, w := range want {
		if h.Status == w {
			return
		}
	}
	t.Errorf("Argo CD says %s (%s), kstatus %s (%s)", h.Status, h.Message, res.Status, res.Message)
}

func toMap(t *testing.T, o k8sruntime.Object) map[string]any {
	t.Helper()
	m, err := k8sruntime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestHCPSessionHealth: sessions in every state, their status and
// conditions derived as the callee sidecar writes them.
func TestHCPSessionHealth(t *testing.T) {
	script := read(t, "hcpsession.lua")
	pct := int32(42)
	for _, tc := range []struct {
		name   string
		st     v1alpha1.HCPSessionStatus
		health string
		msg    string
	}{
		{"undecided claim", v1alpha1.HCPSessionStatus{}, "Progressing", "decide"},
		{"running with progress", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRunning, Reason: "accepted",
			Progress: &v1alpha1.SessionProgress{Stage: "synthesis", Percent: &pct, Message: "step 8 of 20"}}, "Progressing", "RUNNING 42% synthesis: step 8 of 20"},
		{"running, no progress yet", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRunning, Reason: "accepted"}, "Progressing", "RUNNING: accepted"},
		{"aborting", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionAborting, Reason: "abort_requested"}, "Progressing", "ABORTING"},
		{"handed over", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionPaused, Reason: "harness_moved", Message: "handed over by pod p-0"}, "Progressing", "PAUSED: harness_moved: handed over by pod p-0"},
		{"paused by its harness", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionPaused, Reason: "waiting_for_sample"}, "Suspended", "PAUSED: waiting_for_sample"},
		{"completed", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionCompleted, Reason: "completed",
			Result: &v1alpha1.SessionResult{Summary: "20 steps"}}, "Healthy", "COMPLETED: 20 steps"},
		{"failed", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionFailed, Reason: "timeout",
			Error: &v1alpha1.SessionError{Code: "timeout", Message: "the session exceeded PT10M"}}, "Degraded", "FAILED: timeout: the session exceeded PT10M"},
		{"aborted", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionAborted, Reason: "abort_timeout"}, "Degraded", "ABORTED: abort_timeout"},
		{"rejected", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRejected, Reason: "concurrency_limit", Message: "at most 2 sessions"}, "Degraded", "REJECTED: concurrency_limit: at most 2 sessions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := &v1alpha1.HCPSession{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HCPSession"},
				ObjectMeta: metav1.ObjectMeta{Name: "7d0c1e5a-9c3f-4d1e-8a7b-0c6d5e4f3a21", Namespace: "lab", Generation: 1},
				Spec:       v1alpha1.HCPSessionSpec{CalleeID: "cvd", CallerID: "alpha", Capability: "cvd.run"},
				Status:     tc.st,
			}
			status.SetConditions(&hs.Status, time.Now())
			obj := toMap(t, hs)
			h := runHealth(t, script, obj)
			if h.Status != tc.health || !strings.Contains(h.Message, tc.msg) {
				t.Errorf("got %s %q, want %s containing %q", h.Status, h.Message, tc.health, tc.msg)
			}
			if tc.st.State != "" {
				agrees(t, obj, h)
			}
		})
	}
}

// cond is a status condition as the hcp-operator writes it (all
// transitioned at the same time); gen is its observedGeneration, 0 for
// none.
type cond struct {
	typ, status, reason, message string
	gen                          int64
}

// object is kind/name in namespace lab as the API machinery decodes it
// (integers int64, as kstatus wants them), with metadata.generation gen
// and, unless observed is 0 (no status yet), status.observedGeneration
// observed and conds.
func object(kind, name string, gen, observed int64, conds ...cond) map[string]any {
	obj := map[string]any{
		"apiVersion": "hcp.io/v1alpha1",
		"kind":       kind,
		"metadata":   map[string]any{"name": name, "namespace": "lab", "generation": gen},
	}
	if observed == 0 {
		return obj
	}
	cs := make([]any, 0, len(conds))
	for _, c := range conds {
		m := map[string]any{"type": c.typ, "status": c.status, "reason": c.reason, "message": c.message, "lastTransitionTime": "2026-11-25T10:00:00Z"}
		if c.gen != 0 {
			m["observedGeneration"] = c.gen
		}
		cs = append(cs, m)
	}
	obj["status"] = map[string]any{"observedGeneration": observed, "conditions": cs}
	return obj
}

// Objects as the hcp-operator writes them (the shapes of TestKstatus in
// internal/controller).
var (
	readyCallee = object("Callee", "lab-cvd", 2, 2,
		cond{"TopologyReady", "True", "Reconciled", "6 topology objects ready", 2},
		cond{"HarnessReady", "True", "DeploymentAvailable", "Deployment hcp-callee-lab-cvd available; 2/2 replicas ready", 2},
		cond{"Ready", "True", "Reconciled", "topology declared and harness available", 2})
	pendingCallee = object("Callee", "lab-cvd", 1, 1,
		cond{"TopologyReady", "False", "TopologyPending", "Queue hcp-callee-lab-cvd: not yet declared by the messaging-topology-operator", 0},
		cond{"Ready", "False", "TopologyPending", "TopologyReady: Queue hcp-callee-lab-cvd: not yet declared by the messaging-topology-operator", 0},
		cond{"Reconciling", "True", "TopologyPending", "TopologyReady: Queue hcp-callee-lab-cvd: not yet declared by the messaging-topology-operator", 0})
	brokenCallee = object("Callee", "lab-cvd", 1, 1,
		cond{"Ready", "False", "BrokerSecretNotFound", "connection Secret lab/rmq not found", 0},
		cond{"Stalled", "True", "BrokerSecretNotFound", "connection Secret lab/rmq not found", 0})
	// Scaled to zero (by hand, or by KEDA on an empty queue): Ready=True
	// with reason ScaledToZero, HarnessReady False, neither Reconciling
	// nor Stalled.
	scaledToZeroCallee = object("Callee", "lab-cvd", 3, 3,
		cond{"TopologyReady", "True", "Reconciled", "6 topology objects ready", 3},
		cond{"HarnessReady", "False", "ScaledToZero", "Deployment hcp-callee-lab-cvd is scaled to zero (spec.harness.replicas: 0)", 3},
		cond{"Ready", "True", "ScaledToZero", "HarnessReady: Deployment hcp-callee-lab-cvd is scaled to zero (spec.harness.replicas: 0)", 3})
	// A Ready Callee whose spec just changed: Ready is stale.
	editedCallee = object("Callee", "lab-cvd", 3, 2,
		cond{"Ready", "True", "Reconciled", "topology declared and harness available", 0})
	// Written by an operator before Reconciling and Stalled: Ready alone.
	olderCaller = object("Caller", "alpha", 1, 1,
		cond{"Ready", "False", "TopologyPending", "TopologyReady: User hcp-caller-alpha: not yet declared", 0})
	readyCaller = object("Caller", "alpha", 1, 1,
		cond{"Ready", "True", "Reconciled", "topology declared and harness available", 0})
	newCaller     = object("Caller", "alpha", 1, 0)
	invalidPolicy = object("CapabilityPolicy", "lab", 4, 4,
		cond{"Ready", "False", "InvalidSelector", "The policy admits nothing until fixed: spec.calleeSelector: Invalid value", 0},
		cond{"RulesMatched", "False", "InvalidSelector", "spec.calleeSelector is invalid", 0},
		cond{"Stalled", "True", "InvalidSelector", "The policy admits nothing until fixed: spec.calleeSelector: Invalid value", 0})
)

func TestConditionsHealth(t *testing.T) {
	script := read(t, "conditions.lua")
	for _, tc := range []struct {
		name          string
		obj           map[string]any
		health, msg   string
		kstatusAgrees bool
	}{
		{"ready Callee", readyCallee, "Healthy", "Reconciled: topology declared", true},
		{"Callee waiting for the topology operator", pendingCallee, "Progressing", "TopologyPending: TopologyReady: Queue", true},
		{"Callee without its broker Secret", brokenCallee, "Degraded", "BrokerSecretNotFound: connection Secret lab/rmq not found", true},
		{"Callee scaled to zero", scaledToZeroCallee, "Suspended", "ScaledToZero: HarnessReady: Deployment hcp-callee-lab-cvd is scaled to zero", true},
		{"edited Callee", editedCallee, "Progressing", "generation 3", true},
		{"Caller from an older operator", olderCaller, "Progressing", "TopologyPending", true},
		{"ready Caller", readyCaller, "Healthy", "Reconciled", true},
		// kstatus calls an object without status Current; Argo CD waits.
		{"new Caller", newCaller, "Progressing", "Waiting for the hcp-operator", false},
		{"invalid CapabilityPolicy", invalidPolicy, "Degraded", "InvalidSelector: The policy admits nothing", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := runHealth(t, script, tc.obj)
			if h.Status != tc.health || !strings.Contains(h.Message, tc.msg) {
				t.Errorf("got %s %q, want %s containing %q", h.Status, h.Message, tc.health, tc.msg)
			}
			if tc.kstatusAgrees {
				agrees(t, tc.obj, h)
			}
		})
	}
}

// TestSnippetsCarryTheScripts: argocd-cm.yaml and argo-cd-values.yaml hold
// the scripts unchanged, under Argo CD's keys for the four kinds.
func TestSnippetsCarryTheScripts(t *testing.T) {
	want := map[string]string{
		"resource.customizations.health.hcp.io_HCPSession":       read(t, "hcpsession.lua"),
		"resource.customizations.health.hcp.io_Callee":           read(t, "conditions.lua"),
		"resource.customizations.health.hcp.io_Caller":           read(t, "conditions.lua"),
		"resource.customizations.health.hcp.io_CapabilityPolicy": read(t, "conditions.lua"),
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.UnmarshalStrict([]byte(read(t, "argocd-cm.yaml")), &cm); err != nil {
		t.Fatal(err)
	}
	var values struct {
		Configs struct {
			CM map[string]string `json:"cm"`
		} `json:"configs"`
	}
	if err := yaml.UnmarshalStrict([]byte(read(t, "argo-cd-values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	for file, got := range map[string]map[string]string{"argocd-cm.yaml": cm.Data, "argo-cd-values.yaml": values.Configs.CM} {
		if len(got) != len(want) {
			t.Errorf("%s has %d keys, want %d", file, len(got), len(want))
		}
		for k, script := range want {
			if got[k] != script {
				t.Errorf("%s: %s is not the script file: regenerate it (docs/gitops.md)", file, k)
			}
		}
	}
}

// TestScaledToZeroIsCurrent: a Callee scaled to zero is done as far as
// kstatus goes (Flux's --wait, kpt, cli-utils' status poller): Current,
// not Failed, so KEDA's scale-to-zero does not fail a Kustomization;
// Argo CD shows it Suspended.
func TestScaledToZeroIsCurrent(t *testing.T) {
	res, err := kstatus.Compute(&unstructured.Unstructured{Object: scaledToZeroCallee})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != kstatus.CurrentStatus {
		t.Errorf("kstatus %s (%s), want Current", res.Status, res.Message)
	}
	if h := runHealth(t, read(t, "conditions.lua"), scaledToZeroCallee); h.Status != "Suspended" {
		t.Errorf("Argo CD says %s (%s), want Suspended", h.Status, h.Message)
	}
}
