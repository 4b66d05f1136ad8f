package policy

import (
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

func callee(name, namespace string, lbls map[string]string, caps ...string) hcpv1alpha1.Callee {
	c := hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: lbls}}
	for _, n := range caps {
		c.Spec.Capabilities = append(c.Spec.Capabilities, hcpv1alpha1.Capability{Name: n, RiskLevel: hcpv1alpha1.RiskR1, DataClassification: hcpv1alpha1.DataT1})
	}
	return c
}

func caller(name, namespace string, lbls map[string]string) hcpv1alpha1.Caller {
	return hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: lbls}}
}

var (
	testCallees = []hcpv1alpha1.Callee{
		callee("lab-cvd", ns, map[string]string{"site": "lab"}, "cvd.run-synthesis", "cvd.read-telemetry"),
		callee("lab-xrd", ns, map[string]string{"site": "lab"}, "xrd.scan"),
		callee("dry", ns, map[string]string{"site": "dry"}, "sim.run"),
		callee("elsewhere", "other", map[string]string{"site": "lab"}, "cvd.run-synthesis"),
	}
	testCallers = []hcpv1alpha1.Caller{
		caller("alpha", ns, map[string]string{"team": "chem"}),
		caller("beta", ns, nil),
		caller("gamma", "other", map[string]string{"team": "chem"}),
	}
)

func TestSelectCallees(t *testing.T) {
	dup := callee("lab-cvd-2", ns, map[string]string{"site": "lab"})
	dup.Spec.CalleeID = "lab-cvd" // an IDConflict: listed once
	tests := []struct {
		name    string
		sel     metav1.LabelSelector
		callees []hcpv1alpha1.Callee
		want    []string
	}{
		{name: "by label, own namespace only", sel: metav1.LabelSelector{MatchLabels: map[string]string{"site": "lab"}}, callees: testCallees, want: []string{"lab-cvd", "lab-xrd"}},
		{name: "empty selector selects every Callee of the namespace", callees: testCallees, want: []string{"dry", "lab-cvd", "lab-xrd"}},
		{name: "expressions", sel: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "site", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"lab"}}}}, callees: testCallees, want: []string{"dry"}},
		{name: "nothing", sel: metav1.LabelSelector{MatchLabels: map[string]string{"site": "moon"}}, callees: testCallees},
		{name: "invalid selector selects nothing", sel: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "site", Operator: "Like"}}}, callees: testCallees},
		{name: "ids are distinct", sel: metav1.LabelSelector{MatchLabels: map[string]string{"site": "lab"}}, callees: append([]hcpv1alpha1.Callee{dup}, testCallees...), want: []string{"lab-cvd", "lab-xrd"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := pol("p", nil, rule("", ids("*"), ids("*"), hcpv1alpha1.RiskR1))
			p.Spec.CalleeSelector = tc.sel
			if got := SelectCallees(&p, tc.callees); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("SelectCallees = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSelectCallers(t *testing.T) {
	chem := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "chem"}}
	tests := []struct {
		name  string
		rules []hcpv1alpha1.PolicyRule
		want  []string
	}{
		{name: "by id", rules: []hcpv1alpha1.PolicyRule{rule("", ids("beta", "nobody"), ids("*"), hcpv1alpha1.RiskR1)}, want: []string{"beta"}},
		{name: "'*' is every Caller of the namespace", rules: []hcpv1alpha1.PolicyRule{rule("", ids("*"), ids("*"), hcpv1alpha1.RiskR1)}, want: []string{"alpha", "beta"}},
		{name: "by selector, own namespace only", rules: []hcpv1alpha1.PolicyRule{rule("", nil, ids("*"), hcpv1alpha1.RiskR1, callerSel(chem))}, want: []string{"alpha"}},
		{name: "union of the rules", rules: []hcpv1alpha1.PolicyRule{
			rule("", nil, ids("*"), hcpv1alpha1.RiskR1, callerSel(chem)),
			rule("", ids("beta"), ids("*"), hcpv1alpha1.RiskR1),
		}, want: []string{"alpha", "beta"}},
		{name: "invalid rules admit nobody", rules: []hcpv1alpha1.PolicyRule{
			rule("", ids("beta"), ids("*"), hcpv1alpha1.RiskR1, callerSel(&metav1.LabelSelector{MatchLabels: map[string]string{"team": "bad value!"}})),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := pol("p", nil, tc.rules...)
			if got := SelectCallers(&p, testCallers); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("SelectCallers = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRuleCoverage(t *testing.T) {
	p := pol("lab", map[string]string{"site": "lab"},
		rule("alpha-synthesis", ids("alpha"), ids("cvd.run-synthesis"), hcpv1alpha1.RiskR3),
		rule("everyone-reads", ids("*"), ids("*.read-*"), hcpv1alpha1.RiskR1),
		rule("no-such-capability", ids("alpha"), ids("sim.*"), hcpv1alpha1.RiskR1), // sim.run exists, but on a Callee not selected
		rule("no-such-caller", ids("omega"), ids("xrd.*"), hcpv1alpha1.RiskR1),
		rule("", ids("omega"), ids("nothing"), hcpv1alpha1.RiskR1),
		rule("broken", ids("alpha"), ids("*"), hcpv1alpha1.RiskR1, maxDur("PT0S")),
	)
	got := RuleCoverage(&p, testCallees, testCallers)
	want := []RuleMatch{
		{Rule: RuleRef{"lab", 0, "alpha-synthesis"}, Callees: []string{"lab-cvd"}, Callers: []string{"alpha"}},
		{Rule: RuleRef{"lab", 1, "everyone-reads"}, Callees: []string{"lab-cvd"}, Callers: []string{"alpha", "beta"}, AnyCaller: true},
		{Rule: RuleRef{"lab", 2, "no-such-capability"}, Callers: []string{"alpha"}},
		{Rule: RuleRef{"lab", 3, "no-such-caller"}, Callees: []string{"lab-xrd"}},
		{Rule: RuleRef{"lab", 4, ""}},
		{Rule: RuleRef{"lab", 5, "broken"}, Invalid: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("RuleCoverage:\n got %+v\nwant %+v", got, want)
	}
	problems := []string{
		"",
		"",
		`rule "no-such-capability" matches no capability of the selected Callees`,
		`rule "no-such-caller" matches no Caller in the namespace`,
		`rule "rules[4]" matches no capability of the selected Callees and no Caller`,
		`rule "broken" is invalid and admits nothing`,
	}
	for i, m := range got {
		if p := m.Problem(); (p == "") != (problems[i] == "") || !strings.HasPrefix(p, problems[i]) {
			t.Errorf("rule %d: Problem() = %q, want prefix %q", i, p, problems[i])
		}
	}
	if names := RulesMatchingNothing(&p, testCallees, testCallers); !reflect.DeepEqual(names, []string{"no-such-capability", "no-such-caller", "rules[4]", "broken"}) {
		t.Errorf("RulesMatchingNothing = %v", names)
	}

	// A '*' rule with no Caller object at all still matches (callers from
	// other namespaces or outside the cluster), but one naming ids does not.
	if names := RulesMatchingNothing(&p, testCallees, nil); !reflect.DeepEqual(names, []string{"alpha-synthesis", "no-such-capability", "no-such-caller", "rules[4]", "broken"}) {
		t.Errorf("RulesMatchingNothing without callers = %v", names)
	}

	// An invalid calleeSelector makes every rule invalid.
	p.Spec.CalleeSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Exists", Values: []string{"v"}}}
	for _, m := range RuleCoverage(&p, testCallees, testCallers) {
		if !m.Invalid {
			t.Errorf("rule %s not invalid under an invalid calleeSelector", m.Rule)
		}
	}
}

func TestValidateRules(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*hcpv1alpha1.CapabilityPolicy)
		want   []string // "field: substring", in order
	}{
		{name: "valid", mutate: func(*hcpv1alpha1.CapabilityPolicy) {}},
		{
			name: "calleeSelector with an unknown operator",
			mutate: func(p *hcpv1alpha1.CapabilityPolicy) {
				p.Spec.CalleeSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "site", Operator: "Like", Values: []string{"lab"}}}
			},
			want: []string{`spec.calleeSelector: Invalid value: "Like" is not a valid label selector operator`},
		},
		{
			name: "calleeSelector In without values",
			mutate: func(p *hcpv1alpha1.CapabilityPolicy) {
				p.Spec.CalleeSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "site", Operator: metav1.LabelSelectorOpIn}}
			},
			want: []string{"spec.calleeSelector: "},
		},
		{
			name: "callers.selector with a bad key",
			mutate: func(p *hcpv1alpha1.CapabilityPolicy) {
				p.Spec.Rules[1].Callers.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"-bad": "x"}}
			},
			want: []string{"spec.rules[1].callers.selector: "},
		},
		{
			name:   "duplicate rule names",
			mutate: func(p *hcpv1alpha1.CapabilityPolicy) { p.Spec.Rules[1].Name = p.Spec.Rules[0].Name },
			want:   []string{`spec.rules[1].name: Duplicate value: "first (also the name of spec.rules[0])`},
		},
		{
			name:   "zero maxDuration",
			mutate: func(p *hcpv1alpha1.CapabilityPolicy) { p.Spec.Rules[0].MaxDuration = "PT0S" },
			want:   []string{"spec.rules[0].maxDuration: Invalid value: \"PT0S\": must be longer than zero"},
		},
		{
			name:   "maxDuration too long to represent",
			mutate: func(p *hcpv1alpha1.CapabilityPolicy) { p.Spec.Rules[0].MaxDuration = "PT9999999999H" },
			want:   []string{"spec.rules[0].maxDuration: Invalid value"},
		},
		{
			name:   "no callers",
			mutate: func(p *hcpv1alpha1.CapabilityPolicy) { p.Spec.Rules[0].Callers = hcpv1alpha1.CallerMatch{} },
			want:   []string{"spec.rules[0].callers: Required value"},
		},
		{
			name:   "no capabilities",
			mutate: func(p *hcpv1alpha1.CapabilityPolicy) { p.Spec.Rules[0].Capabilities = nil },
			want:   []string{"spec.rules[0].capabilities: Required value"},
		},
		{
			name: "bad enums",
			mutate: func(p *hcpv1alpha1.CapabilityPolicy) {
				p.Spec.Rules[0].MaxRiskLevel = "R6"
				p.Spec.Rules[0].DataClassifications = []hcpv1alpha1.DataClass{"T5"}
			},
			want: []string{`spec.rules[0].maxRiskLevel: Unsupported value: "R6"`, `spec.rules[0].dataClassifications[0]: Unsupported value: "T5"`},
		},
		{
			name:   "maxConcurrentSessions below 1",
			mutate: func(p *hcpv1alpha1.CapabilityPolicy) { p.Spec.Rules[0].MaxConcurrentSessions = new(int32) },
			want:   []string{"spec.rules[0].maxConcurrentSessions: Invalid value: 0"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := pol("p", map[string]string{"site": "lab"},
				rule("first", ids("alpha"), ids("cvd.*"), hcpv1alpha1.RiskR3, maxDur("PT72H"), maxConc(2), classes(hcpv1alpha1.DataT1)),
				rule("second", nil, ids("*"), hcpv1alpha1.RiskR1, callerSel(&metav1.LabelSelector{MatchLabels: map[string]string{"team": "chem"}})),
			)
			tc.mutate(&p)
			errs := ValidateRules(&p)
			if len(errs) != len(tc.want) {
				t.Fatalf("ValidateRules = %v, want %d errors %v", errs, len(tc.want), tc.want)
			}
			for i, err := range errs {
				if _, ok := err.(*field.Error); !ok {
					t.Errorf("error %d is %T, want *field.Error", i, err)
				}
				if !strings.Contains(err.Error(), tc.want[i]) {
					t.Errorf("error %d = %q, want it to contain %q", i, err, tc.want[i])
				}
			}
		})
	}
}

func TestRuleRef(t *testing.T) {
	if got := (RuleRef{Policy: "p", Index: 2}).String(); got != "p/rules[2]" {
		t.Errorf("unnamed: %q", got)
	}
	if got := (RuleRef{Policy: "p", Index: 2, Rule: "r"}).String(); got != "p/r" {
		t.Errorf("named: %q", got)
	}
}
