package policy

import (
	"cmp"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

func testCallee() *v1alpha1.Callee {
	return &v1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Name: "lab", Namespace: "ns", Labels: map[string]string{"tier": "lab"}},
		Spec: v1alpha1.CalleeSpec{
			Capabilities: []v1alpha1.Capability{
				{Name: "analyze", RiskLevel: v1alpha1.RiskR1, DataClassification: v1alpha1.DataT2, MaxDuration: "PT2H"},
				{Name: "synthesize", RiskLevel: v1alpha1.RiskR3, DataClassification: v1alpha1.DataT3},
			},
			Sessions: v1alpha1.SessionsSpec{DefaultMaxDuration: "PT30M"},
		},
	}
}

func testPolicy(maxRisk v1alpha1.RiskLevel, maxDuration v1alpha1.ISO8601Duration) v1alpha1.CapabilityPolicy {
	return v1alpha1.CapabilityPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec: v1alpha1.CapabilityPolicySpec{Rules: []v1alpha1.PolicyRule{{
			Name:         "alpha",
			Callers:      v1alpha1.CallerMatch{IDs: []string{"alpha"}},
			Capabilities: []string{"*"},
			MaxRiskLevel: maxRisk,
			MaxDuration:  maxDuration,
		}}},
	}
}

// classPolicy admits alpha everything, for tasks of the given classes only.
func classPolicy(classes ...v1alpha1.DataClass) v1alpha1.CapabilityPolicy {
	p := testPolicy(v1alpha1.RiskR5, "")
	p.Spec.Rules[0].DataClassifications = classes
	return p
}

func submit(mut func(*task.TaskSubmit)) *task.TaskSubmit {
	ts := &task.TaskSubmit{
		CallerID: "alpha", CalleeID: "lab", Capability: "analyze", Intent: "do it",
		Inputs:      json.RawMessage(`{}`),
		Constraints: task.Constraints{DataClassification: task.T1},
	}
	if mut != nil {
		mut(ts)
	}
	return ts
}

func TestGate(t *testing.T) {
	now := time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)
	allow := []v1alpha1.CapabilityPolicy{testPolicy(v1alpha1.RiskR3, "")}
	for _, tc := range []struct {
		name     string
		ts       *task.TaskSubmit
		policies []v1alpha1.CapabilityPolicy
		active   Active
		want     task.ReasonCode // "" = admitted
		risk     task.RiskLevel
		maxDur   time.Duration
		class    task.DataClass // the class judged by, when admitted (default T1)
		message  string         // in the rejection's message
	}{
		{name: "admitted with the capability's max duration", ts: submit(nil), policies: allow, risk: task.R1, maxDur: 2 * time.Hour},
		{name: "admitted with the callee default", ts: submit(func(t *task.TaskSubmit) { t.Capability = "synthesize" }), policies: allow, risk: task.R3, maxDur: 30 * time.Minute},
		{name: "task max_duration wins", ts: submit(func(t *task.TaskSubmit) { t.Constraints.MaxDuration = task.Duration(10 * time.Minute) }), policies: allow, risk: task.R1, maxDur: 10 * time.Minute},
		{name: "policy max duration bounds a task without one", ts: submit(nil), policies: []v1alpha1.CapabilityPolicy{testPolicy(v1alpha1.RiskR3, "PT5M")}, risk: task.R1, maxDur: 5 * time.Minute},
		{name: "deadline shortens the session", ts: submit(func(t *task.TaskSubmit) { t.Constraints.Deadline = task.TimestampPtr(now.Add(90 * time.Second)) }), policies: allow, risk: task.R1, maxDur: 90 * time.Second},
		{name: "deadline too close", ts: submit(func(t *task.TaskSubmit) { t.Constraints.Deadline = task.TimestampPtr(now.Add(300 * time.Millisecond)) }), policies: allow, want: task.ReasonExpired},
		{name: "spoofed caller_id", ts: submit(func(t *task.TaskSubmit) { t.CallerID = "mallory" }), policies: allow, want: task.ReasonNotAuthorized},
		{name: "other callee", ts: submit(func(t *task.TaskSubmit) { t.CalleeID = "other" }), policies: allow, want: task.ReasonMalformed},
		{name: "unknown capability", ts: submit(func(t *task.TaskSubmit) { t.Capability = "fly" }), policies: allow, want: task.ReasonUnknownCapability},
		{name: "data class above the capability's", ts: submit(func(t *task.TaskSubmit) { t.Constraints.DataClassification = task.T3 }), policies: allow, want: task.ReasonDataClassExceedsPolicy, risk: task.R1},
		{name: "no policy: default deny", ts: submit(nil), want: task.ReasonNotAuthorized},
		{name: "capability base risk above the policy", ts: submit(func(t *task.TaskSubmit) { t.Capability = "synthesize" }), policies: []v1alpha1.CapabilityPolicy{testPolicy(v1alpha1.RiskR2, "")}, want: task.ReasonRiskExceedsPolicy, risk: task.R3},
		{name: "declared risk raises the assessment", ts: submit(func(t *task.TaskSubmit) { t.Metadata = json.RawMessage(`{"risk_level":"R4"}`) }), policies: allow, want: task.ReasonRiskExceedsPolicy, risk: task.R4},
		{name: "declared risk never lowers it", ts: submit(func(t *task.TaskSubmit) {
			t.Capability = "synthesize"
			t.Metadata = json.RawMessage(`{"risk_level":"R1"}`)
		}), policies: allow, risk: task.R3, maxDur: 30 * time.Minute},
		{name: "above the task's own ceiling", ts: submit(func(t *task.TaskSubmit) {
			t.Capability = "synthesize"
			t.Constraints.MaxRiskLevel = task.R2
		}), policies: allow, want: task.ReasonRiskExceedsPolicy, risk: task.R3},
		{name: "duration above the capability's", ts: submit(func(t *task.TaskSubmit) { t.Constraints.MaxDuration = task.Duration(3 * time.Hour) }), policies: allow, want: task.ReasonDurationExceedsPolicy},
		// A spec-only caller may leave data_classification out: the task is
		// judged as the capability's class (analyze: T2).
		{name: "no data_classification: judged as the capability's class", ts: submit(func(t *task.TaskSubmit) { t.Constraints.DataClassification = "" }), policies: allow, risk: task.R1, maxDur: 2 * time.Hour, class: task.T2},
		{name: "no data_classification, the policy admits less than the capability's class", ts: submit(func(t *task.TaskSubmit) { t.Constraints.DataClassification = "" }),
			policies: []v1alpha1.CapabilityPolicy{classPolicy(v1alpha1.DataT1)}, want: task.ReasonDataClassExceedsPolicy, message: "has no constraints.data_classification; it is judged as T2"},
		{name: "callee-wide concurrency", ts: submit(nil), policies: allow, active: Active{Callee: 5, CallerOnCallee: 1}, want: task.ReasonConcurrencyLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := testCallee()
			if tc.active.Callee > 0 {
				cl.Spec.Sessions.MaxConcurrent = new(int32(5))
			}
			v := Gate(GateInput{Now: now, Callee: cl, Caller: UnknownCaller("alpha"), Policies: tc.policies, Active: tc.active, Task: tc.ts})
			if tc.want == "" {
				if !v.Admitted {
					t.Fatalf("rejected %s: %s", v.Reason, v.Message)
				}
				if v.Risk != tc.risk || v.MaxDuration != tc.maxDur {
					t.Fatalf("admitted with risk %s, max duration %s; want %s, %s", v.Risk, v.MaxDuration, tc.risk, tc.maxDur)
				}
				if want := cmp.Or(tc.class, tc.ts.Constraints.DataClassification); v.DataClass != want {
					t.Fatalf("judged as class %s, want %s", v.DataClass, want)
				}
				return
			}
			if v.Admitted || v.Reason != tc.want {
				t.Fatalf("verdict = %+v, want reason %s", v, tc.want)
			}
			if v.Message == "" || !strings.Contains(v.Message, tc.message) {
				t.Fatalf("rejection message %q, want one containing %q", v.Message, tc.message)
			}
			if tc.risk != "" && v.Risk != tc.risk {
				t.Fatalf("risk = %s, want %s", v.Risk, tc.risk)
			}
		})
	}
}
