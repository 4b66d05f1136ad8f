package policy

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

func TestNamedCallerIDs(t *testing.T) {
	chem := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "chem"}}
	bad := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "bad value!"}}
	tests := []struct {
		name string
		p    hcpv1alpha1.CapabilityPolicy
		want []string
	}{
		{name: "ids of every rule, distinct and sorted", p: pol("p", nil,
			rule("", ids("beta", "alpha"), ids("*"), hcpv1alpha1.RiskR1),
			rule("", ids("alpha", "*"), ids("*"), hcpv1alpha1.RiskR1)), want: []string{"*", "alpha", "beta"}},
		{name: "a selector names no id", p: pol("p", nil, rule("", nil, ids("*"), hcpv1alpha1.RiskR1, callerSel(chem)))},
		{name: "an invalid rule names nobody", p: pol("p", nil,
			rule("", ids("beta"), ids("*"), hcpv1alpha1.RiskR1, callerSel(bad)),
			rule("", ids("alpha"), ids("*"), hcpv1alpha1.RiskR1)), want: []string{"alpha"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := NamedCallerIDs(&tc.p); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("NamedCallerIDs = %v, want %v", got, tc.want)
			}
		})
	}
	p := pol("p", nil, rule("", ids("alpha"), ids("*"), hcpv1alpha1.RiskR1))
	p.Spec.CalleeSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "site", Operator: "Like"}}
	if got := NamedCallerIDs(&p); got != nil {
		t.Errorf("a policy whose calleeSelector is invalid names %v, want nobody", got)
	}
}

// TestNamesCallerFor: true exactly when the policy selects the callee and a
// valid rule lists the id or "*", which is when Decide admits a task within
// the rule's limits from a caller with no Caller object in the callee's
// namespace (a caller of another namespace).
func TestNamesCallerFor(t *testing.T) {
	chem := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "chem"}}
	tests := []struct {
		name   string
		p      hcpv1alpha1.CapabilityPolicy
		caller string
		want   bool
	}{
		{name: "by id", p: pol("p", nil, rule("", ids("alpha"), ids("cvd.*"), hcpv1alpha1.RiskR3)), caller: "alpha", want: true},
		{name: "another id", p: pol("p", nil, rule("", ids("beta"), ids("cvd.*"), hcpv1alpha1.RiskR3)), caller: "alpha"},
		{name: "any caller", p: pol("p", nil, rule("", ids("*"), ids("cvd.*"), hcpv1alpha1.RiskR3)), caller: "alpha", want: true},
		{name: "a selector never reaches another namespace", p: pol("p", nil, rule("", nil, ids("*"), hcpv1alpha1.RiskR3, callerSel(chem))), caller: "alpha"},
		{name: "the callee not selected", p: pol("p", map[string]string{"site": "moon"}, rule("", ids("alpha"), ids("*"), hcpv1alpha1.RiskR3)), caller: "alpha"},
		{name: "the callee selected by label", p: pol("p", map[string]string{"site": "lab"}, rule("", ids("alpha"), ids("*"), hcpv1alpha1.RiskR3)), caller: "alpha", want: true},
		{name: "a policy of another namespace", p: func() hcpv1alpha1.CapabilityPolicy {
			p := pol("p", nil, rule("", ids("alpha"), ids("*"), hcpv1alpha1.RiskR3))
			p.Namespace = "other"
			return p
		}(), caller: "alpha"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := NamesCallerFor(&tc.p, labCVD(), tc.caller); got != tc.want {
				t.Errorf("NamesCallerFor = %v, want %v", got, tc.want)
			}
			d := Decide(labCVD(), UnknownCaller(tc.caller), []hcpv1alpha1.CapabilityPolicy{tc.p}, synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0), Active{})
			if d.Admitted != tc.want {
				t.Errorf("Decide for caller %q from another namespace: admitted %v (%s); NamesCallerFor %v", tc.caller, d.Admitted, d.Message, tc.want)
			}
		})
	}
}
