package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

func policyCallee(name string, lbls map[string]string, caps ...string) hcpv1alpha1.Callee {
	c := hcpv1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
		Spec: hcpv1alpha1.CalleeSpec{
			Harness: hcpv1alpha1.HarnessSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "harness", Image: "ghcr.io/hcp-io/hcp-sample-callee:latest"}},
			}}},
		},
	}
	for _, n := range caps {
		c.Spec.Capabilities = append(c.Spec.Capabilities, hcpv1alpha1.Capability{Name: n, RiskLevel: hcpv1alpha1.RiskR1, DataClassification: hcpv1alpha1.DataT1})
	}
	return c
}

func policyCaller(name string, lbls map[string]string) hcpv1alpha1.Caller {
	return hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
}

func materialsPolicy(rules ...hcpv1alpha1.PolicyRule) *hcpv1alpha1.CapabilityPolicy {
	if len(rules) == 0 {
		rules = []hcpv1alpha1.PolicyRule{{
			Name: "alpha-up-to-r3", Callers: hcpv1alpha1.CallerMatch{IDs: []string{"alpha"}},
			Capabilities: []string{"cvd.*"}, MaxRiskLevel: hcpv1alpha1.RiskR3,
		}}
	}
	return &hcpv1alpha1.CapabilityPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "materials-lab", Generation: 3},
		Spec: hcpv1alpha1.CapabilityPolicySpec{
			CalleeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"lab": "materials"}},
			Rules:          rules,
		},
	}
}

// TestCapabilityPolicyStatus checks the status computation on its own.
func TestCapabilityPolicyStatus(t *testing.T) {
	materials := map[string]string{"lab": "materials"}
	callees := []hcpv1alpha1.Callee{
		policyCallee("lab-cvd", materials, "cvd.run-synthesis", "cvd.read-telemetry"),
		policyCallee("lab-xrd", map[string]string{"lab": "xray"}, "xrd.scan"),
	}
	callers := []hcpv1alpha1.Caller{policyCaller("alpha", map[string]string{"team": "chem"}), policyCaller("beta", nil)}
	type cond struct{ status, reason, msg string }
	tests := []struct {
		name                string
		policy              *hcpv1alpha1.CapabilityPolicy
		callees             []hcpv1alpha1.Callee
		ready, matched      cond
		wantCallees, wantCr []string
	}{
		{
			name:        "every rule matches",
			policy:      materialsPolicy(),
			ready:       cond{"True", hcpv1alpha1.ReasonReconciled, "enforced by the sidecars of 1 selected Callee(s)"},
			matched:     cond{"True", hcpv1alpha1.ReasonAllRulesMatched, "Every rule matches"},
			wantCallees: []string{"lab-cvd"}, wantCr: []string{"alpha"},
		},
		{
			name:    "no Callee selected",
			policy:  materialsPolicy(),
			callees: callees[1:],
			ready:   cond{"True", hcpv1alpha1.ReasonReconciled, "0 selected Callee(s)"},
			matched: cond{"False", hcpv1alpha1.ReasonNoCalleesSelected, "spec.calleeSelector selects no Callee in namespace lab"},
			wantCr:  []string{"alpha"},
		},
		{
			name: "rules matching nothing are named",
			policy: materialsPolicy(
				hcpv1alpha1.PolicyRule{Name: "alpha", Callers: hcpv1alpha1.CallerMatch{IDs: []string{"alpha"}}, Capabilities: []string{"cvd.*"}, MaxRiskLevel: hcpv1alpha1.RiskR3},
				hcpv1alpha1.PolicyRule{Name: "xray", Callers: hcpv1alpha1.CallerMatch{IDs: []string{"beta"}}, Capabilities: []string{"xrd.*"}, MaxRiskLevel: hcpv1alpha1.RiskR1},
				hcpv1alpha1.PolicyRule{Callers: hcpv1alpha1.CallerMatch{IDs: []string{"omega"}}, Capabilities: []string{"cvd.read-*"}, MaxRiskLevel: hcpv1alpha1.RiskR1},
			),
			ready: cond{"True", hcpv1alpha1.ReasonReconciled, ""},
			matched: cond{"False", hcpv1alpha1.ReasonRuleMatchesNothing,
				`rule "xray" matches no capability of the selected Callees; rule "rules[2]" matches no Caller in the namespace`},
			wantCallees: []string{"lab-cvd"}, wantCr: []string{"alpha", "beta"},
		},
		{
			name: "invalid calleeSelector",
			policy: func() *hcpv1alpha1.CapabilityPolicy {
				p := materialsPolicy()
				p.Spec.CalleeSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpExists, Values: []string{"wet"}}}
				return p
			}(),
			ready:   cond{"False", hcpv1alpha1.ReasonInvalidSelector, "The policy admits nothing until fixed: spec.calleeSelector: Invalid value"},
			matched: cond{"False", hcpv1alpha1.ReasonInvalidSelector, "spec.calleeSelector is invalid"},
			wantCr:  []string{"alpha"},
		},
		{
			name: "invalid caller selector",
			policy: materialsPolicy(
				hcpv1alpha1.PolicyRule{Name: "alpha", Callers: hcpv1alpha1.CallerMatch{IDs: []string{"alpha"}}, Capabilities: []string{"cvd.*"}, MaxRiskLevel: hcpv1alpha1.RiskR3},
				hcpv1alpha1.PolicyRule{Name: "chem", Callers: hcpv1alpha1.CallerMatch{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "chem istry"}}}, Capabilities: []string{"*"}, MaxRiskLevel: hcpv1alpha1.RiskR1},
			),
			ready:       cond{"False", hcpv1alpha1.ReasonInvalidSelector, "Invalid rules admit nothing, the others are enforced: spec.rules[1].callers.selector"},
			matched:     cond{"False", hcpv1alpha1.ReasonRuleMatchesNothing, `rule "chem" is invalid and admits nothing`},
			wantCallees: []string{"lab-cvd"}, wantCr: []string{"alpha"},
		},
		{
			name: "invalid duration",
			policy: materialsPolicy(
				hcpv1alpha1.PolicyRule{Name: "zero", Callers: hcpv1alpha1.CallerMatch{IDs: []string{"alpha"}}, Capabilities: []string{"cvd.*"}, MaxRiskLevel: hcpv1alpha1.RiskR3, MaxDuration: "PT0S"},
			),
			ready:       cond{"False", hcpv1alpha1.ReasonInvalidRules, "spec.rules[0].maxDuration"},
			matched:     cond{"False", hcpv1alpha1.ReasonRuleMatchesNothing, `rule "zero" is invalid`},
			wantCallees: []string{"lab-cvd"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.policy
			p.Namespace = "lab"
			cs := tc.callees
			if cs == nil {
				cs = callees
			}
			setPolicyStatus(p, cs, callers)
			if p.Status.ObservedGeneration != 3 {
				t.Errorf("observedGeneration = %d, want 3", p.Status.ObservedGeneration)
			}
			if !slices.Equal(p.Status.MatchedCallees, tc.wantCallees) || !slices.Equal(p.Status.MatchedCallers, tc.wantCr) {
				t.Errorf("matched callees %v callers %v, want %v %v", p.Status.MatchedCallees, p.Status.MatchedCallers, tc.wantCallees, tc.wantCr)
			}
			for typ, want := range map[string]cond{hcpv1alpha1.ConditionReady: tc.ready, hcpv1alpha1.ConditionRulesMatched: tc.matched} {
				c := meta.FindStatusCondition(p.Status.Conditions, typ)
				if c == nil {
					t.Fatalf("no %s condition", typ)
				}
				if string(c.Status) != want.status || c.Reason != want.reason || !strings.Contains(c.Message, want.msg) || c.ObservedGeneration != 3 {
					t.Errorf("%s = %s/%s %q (gen %d), want %s/%s containing %q", typ, c.Status, c.Reason, c.Message, c.ObservedGeneration, want.status, want.reason, want.msg)
				}
			}
		})
	}

	t.Run("lastTransitionTime is kept while the status holds", func(t *testing.T) {
		p := materialsPolicy()
		p.Namespace = "lab"
		setPolicyStatus(p, callees, callers)
		old := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
		for i := range p.Status.Conditions {
			p.Status.Conditions[i].LastTransitionTime = old
		}
		before := p.DeepCopy()
		setPolicyStatus(p, callees, callers)
		if !equalStatus(before.Status, p.Status) {
			t.Errorf("recomputing an unchanged policy changed its status:\n%+v\n%+v", before.Status, p.Status)
		}
		setPolicyStatus(p, callees[1:], callers)
		if c := meta.FindStatusCondition(p.Status.Conditions, hcpv1alpha1.ConditionRulesMatched); c.LastTransitionTime.Equal(&old) {
			t.Errorf("RulesMatched went False but kept its lastTransitionTime")
		}
		if c := meta.FindStatusCondition(p.Status.Conditions, hcpv1alpha1.ConditionReady); !c.LastTransitionTime.Equal(&old) {
			t.Errorf("Ready stayed True but its lastTransitionTime moved")
		}
	})
}

func equalStatus(a, b hcpv1alpha1.CapabilityPolicyStatus) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}

// TestCapabilityPolicyReconciler runs against the shared envtest suite (the
// real API server and the manager with every reconciler, suite_test.go):
// status follows the policy, the Callees and the Callers, and Events are
// recorded when a condition changes.
func TestCapabilityPolicyReconciler(t *testing.T) {
	ctx := t.Context()
	c := k8sClient
	ns := newNamespace(t, "policy-")
	create := func(o client.Object) {
		t.Helper()
		o.SetNamespace(ns)
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	callee := policyCallee("lab-cvd", map[string]string{"lab": "materials"}, "cvd.run-synthesis", "cvd.read-telemetry")
	alpha := policyCaller("alpha", map[string]string{"team": "chem"})
	create(&callee)
	create(&alpha)
	p := materialsPolicy()
	p.Generation = 0
	create(p)
	key := client.ObjectKeyFromObject(p)

	// expect waits until the policy's status satisfies check; the failure
	// says what the status showed instead.
	expect := func(what string, check func(*hcpv1alpha1.CapabilityPolicy) error) {
		t.Helper()
		var seen error // what the status last showed, rather than a deadline error
		err := testbed.Poll(ctx, 20*time.Second, func(ctx context.Context) error {
			var got hcpv1alpha1.CapabilityPolicy
			if err := c.Get(ctx, key, &got); err != nil {
				return err
			}
			if got.Status.ObservedGeneration != got.Generation {
				seen = fmt.Errorf("observedGeneration %d, generation %d", got.Status.ObservedGeneration, got.Generation)
				return seen
			}
			if err := check(&got); err != nil {
				seen = fmt.Errorf("%w; status: %+v", err, got.Status)
				return seen
			}
			return nil
		})
		if err != nil {
			if seen != nil {
				err = seen
			}
			t.Fatalf("%s: %v", what, err)
		}
	}
	condIs := func(typ string, status metav1.ConditionStatus, reason, msg string) func(*hcpv1alpha1.CapabilityPolicy) error {
		return func(p *hcpv1alpha1.CapabilityPolicy) error {
			cond := meta.FindStatusCondition(p.Status.Conditions, typ)
			if cond == nil || cond.Status != status || cond.Reason != reason || !strings.Contains(cond.Message, msg) || cond.ObservedGeneration != p.Generation {
				return fmt.Errorf("want %s=%s reason %s message containing %q", typ, status, reason, msg)
			}
			return nil
		}
	}
	all := func(checks ...func(*hcpv1alpha1.CapabilityPolicy) error) func(*hcpv1alpha1.CapabilityPolicy) error {
		return func(p *hcpv1alpha1.CapabilityPolicy) error {
			for _, f := range checks {
				if err := f(p); err != nil {
					return err
				}
			}
			return nil
		}
	}
	matches := func(callees, callers []string) func(*hcpv1alpha1.CapabilityPolicy) error {
		return func(p *hcpv1alpha1.CapabilityPolicy) error {
			if !slices.Equal(p.Status.MatchedCallees, callees) || !slices.Equal(p.Status.MatchedCallers, callers) {
				return fmt.Errorf("want matchedCallees %v matchedCallers %v", callees, callers)
			}
			return nil
		}
	}
	// update applies mutate to the live object; the other controllers of the
	// suite write Callees and Callers too, hence the retry on conflict.
	update := func(o client.Object, mutate func()) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
				return err
			}
			mutate()
			return c.Update(ctx, o)
		})
		if err != nil {
			t.Fatalf("update %T %s: %v", o, o.GetName(), err)
		}
	}
	setLabel := func(o client.Object, k, v string) func() {
		return func() {
			l := o.GetLabels()
			if l == nil {
				l = map[string]string{}
			}
			l[k] = v
			o.SetLabels(l)
		}
	}

	expect("the sample policy is Ready and every rule matches", all(
		condIs(hcpv1alpha1.ConditionReady, metav1.ConditionTrue, hcpv1alpha1.ReasonReconciled, "1 selected Callee(s)"),
		condIs(hcpv1alpha1.ConditionRulesMatched, metav1.ConditionTrue, hcpv1alpha1.ReasonAllRulesMatched, ""),
		matches([]string{"lab-cvd"}, []string{"alpha"}),
	))

	// No write when nothing changes: a Caller label change triggers a
	// reconcile (see the next step) that finds nothing to do.
	var steady hcpv1alpha1.CapabilityPolicy
	if err := c.Get(ctx, key, &steady); err != nil {
		t.Fatal(err)
	}
	update(&alpha, setLabel(&alpha, "unrelated", "x"))
	time.Sleep(2 * time.Second) // give the reconcile a chance to write, which it must not
	var after hcpv1alpha1.CapabilityPolicy
	if err := c.Get(ctx, key, &after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != steady.ResourceVersion {
		t.Errorf("the policy was written although nothing changed: resourceVersion %s -> %s, status %+v", steady.ResourceVersion, after.ResourceVersion, after.Status)
	}

	// A new rule for a caller that does not exist yet.
	update(p, func() {
		p.Spec.Rules = append(p.Spec.Rules, hcpv1alpha1.PolicyRule{
			Name: "omega-telemetry", Callers: hcpv1alpha1.CallerMatch{IDs: []string{"omega"}}, Capabilities: []string{"cvd.read-*"}, MaxRiskLevel: hcpv1alpha1.RiskR1,
		})
	})
	expect("a rule naming a missing Caller is reported", condIs(hcpv1alpha1.ConditionRulesMatched, metav1.ConditionFalse,
		hcpv1alpha1.ReasonRuleMatchesNothing, `rule "omega-telemetry" matches no Caller in the namespace`))

	// The Caller appears: the watch on Callers brings the status back.
	omega := policyCaller("omega", nil)
	create(&omega)
	expect("creating the Caller fixes it", all(
		condIs(hcpv1alpha1.ConditionRulesMatched, metav1.ConditionTrue, hcpv1alpha1.ReasonAllRulesMatched, ""),
		matches([]string{"lab-cvd"}, []string{"alpha", "omega"}),
	))

	// Callers by selector follow Caller labels.
	update(p, func() {
		p.Spec.Rules[1].Callers = hcpv1alpha1.CallerMatch{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ops"}}}
	})
	expect("a selector matching no Caller is reported", condIs(hcpv1alpha1.ConditionRulesMatched, metav1.ConditionFalse,
		hcpv1alpha1.ReasonRuleMatchesNothing, `rule "omega-telemetry" matches no Caller`))
	update(&omega, setLabel(&omega, "team", "ops"))
	expect("labelling the Caller fixes it", all(
		condIs(hcpv1alpha1.ConditionRulesMatched, metav1.ConditionTrue, hcpv1alpha1.ReasonAllRulesMatched, ""),
		matches([]string{"lab-cvd"}, []string{"alpha", "omega"}),
	))

	// The Callee leaves the selection: the watch on Callees notices.
	update(&callee, setLabel(&callee, "lab", "retired"))
	expect("no Callee selected", all(
		condIs(hcpv1alpha1.ConditionRulesMatched, metav1.ConditionFalse, hcpv1alpha1.ReasonNoCalleesSelected, "selects no Callee"),
		condIs(hcpv1alpha1.ConditionReady, metav1.ConditionTrue, hcpv1alpha1.ReasonReconciled, "0 selected Callee(s)"),
		matches(nil, []string{"alpha", "omega"}),
	))
	update(&callee, setLabel(&callee, "lab", "materials"))
	expect("selected again", condIs(hcpv1alpha1.ConditionRulesMatched, metav1.ConditionTrue, hcpv1alpha1.ReasonAllRulesMatched, ""))

	// Capabilities decide what rules match.
	update(&callee, func() { callee.Spec.Capabilities = callee.Spec.Capabilities[:1] })
	expect("a capability removed from the Callee", condIs(hcpv1alpha1.ConditionRulesMatched, metav1.ConditionFalse,
		hcpv1alpha1.ReasonRuleMatchesNothing, `rule "omega-telemetry" matches no capability of the selected Callees`))

	// What CEL cannot check: the API server accepts this selector, the
	// controller reports it.
	update(p, func() {
		p.Spec.CalleeSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "lab", Operator: "Equals", Values: []string{"materials"}}}}
	})
	expect("an invalid calleeSelector makes the policy not Ready", all(
		condIs(hcpv1alpha1.ConditionReady, metav1.ConditionFalse, hcpv1alpha1.ReasonInvalidSelector, `spec.calleeSelector: Invalid value: "Equals" is not a valid label selector operator`),
		matches(nil, []string{"alpha", "omega"}),
	))

	// Events: one per condition change, as a user sees them with kubectl
	// events --for capabilitypolicy/materials-lab.
	testbed.Eventually(t, 20*time.Second, "Events recorded for the condition changes", func(ctx context.Context) error {
		var list eventsv1.EventList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		seen := map[string]string{}
		for _, e := range list.Items {
			if e.Regarding.Kind == "CapabilityPolicy" && e.Regarding.Name == p.Name {
				seen[e.Reason] = e.Type
			}
		}
		want := map[string]string{
			hcpv1alpha1.ReasonReconciled:         corev1.EventTypeNormal,
			hcpv1alpha1.ReasonAllRulesMatched:    corev1.EventTypeNormal,
			hcpv1alpha1.ReasonRuleMatchesNothing: corev1.EventTypeWarning,
			hcpv1alpha1.ReasonNoCalleesSelected:  corev1.EventTypeWarning,
			hcpv1alpha1.ReasonInvalidSelector:    corev1.EventTypeWarning,
		}
		for reason, typ := range want {
			if seen[reason] != typ {
				return fmt.Errorf("no %s event with reason %s; seen %v", typ, reason, seen)
			}
		}
		return nil
	})
}
