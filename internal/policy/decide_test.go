package policy

import (
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

const ns = "lab"

// labCVD is the spec's example callee.
func labCVD() *hcpv1alpha1.Callee {
	return &hcpv1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Name: "lab-cvd", Namespace: ns, Labels: map[string]string{"site": "lab", "tier": "wet"}},
		Spec: hcpv1alpha1.CalleeSpec{Capabilities: []hcpv1alpha1.Capability{
			{Name: "cvd.run-synthesis", RiskLevel: hcpv1alpha1.RiskR3, DataClassification: hcpv1alpha1.DataT2, MaxDuration: "PT72H"},
			{Name: "cvd.read-telemetry", RiskLevel: hcpv1alpha1.RiskR1, DataClassification: hcpv1alpha1.DataT1},
			{Name: "cvd.calibrate", RiskLevel: hcpv1alpha1.RiskR2, DataClassification: hcpv1alpha1.DataT4, MaxDuration: "PT1H"},
		}},
	}
}

func pol(name string, sel map[string]string, rules ...hcpv1alpha1.PolicyRule) hcpv1alpha1.CapabilityPolicy {
	return hcpv1alpha1.CapabilityPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: hcpv1alpha1.CapabilityPolicySpec{
			CalleeSelector: metav1.LabelSelector{MatchLabels: sel},
			Rules:          rules,
		},
	}
}

// rule builds a rule admitting ids to capabilities up to risk; options
// tweak it.
func rule(name string, ids []string, caps []string, risk hcpv1alpha1.RiskLevel, opts ...func(*hcpv1alpha1.PolicyRule)) hcpv1alpha1.PolicyRule {
	r := hcpv1alpha1.PolicyRule{Name: name, Callers: hcpv1alpha1.CallerMatch{IDs: ids}, Capabilities: caps, MaxRiskLevel: risk}
	for _, o := range opts {
		o(&r)
	}
	return r
}

func classes(c ...hcpv1alpha1.DataClass) func(*hcpv1alpha1.PolicyRule) {
	return func(r *hcpv1alpha1.PolicyRule) { r.DataClassifications = c }
}

func maxDur(d hcpv1alpha1.ISO8601Duration) func(*hcpv1alpha1.PolicyRule) {
	return func(r *hcpv1alpha1.PolicyRule) { r.MaxDuration = d }
}

func maxConc(n int32) func(*hcpv1alpha1.PolicyRule) {
	return func(r *hcpv1alpha1.PolicyRule) { r.MaxConcurrentSessions = ptr.To(n) }
}

func callerSel(s *metav1.LabelSelector) func(*hcpv1alpha1.PolicyRule) {
	return func(r *hcpv1alpha1.PolicyRule) { r.Callers.Selector = s }
}

var (
	alpha        = Caller{ID: "alpha", Labels: map[string]string{"team": "chem"}, Known: true}
	alphaUnknown = UnknownCaller("alpha")
	beta         = Caller{ID: "beta", Known: true}
	ids          = func(s ...string) []string { return s }
	synth        = func(risk hcpv1alpha1.RiskLevel, class hcpv1alpha1.DataClass, d time.Duration) Task {
		return Task{Capability: "cvd.run-synthesis", Risk: risk, DataClass: class, Duration: d}
	}
	alphaSynthR3 = pol("alpha-synthesis", nil, rule("alpha-r3", ids("alpha"), ids("cvd.run-synthesis"), hcpv1alpha1.RiskR3))
)

func TestDecide(t *testing.T) {
	type want struct {
		admitted bool
		reason   task.ReasonCode
		msg      []string // substrings of Message
		risk     hcpv1alpha1.RiskLevel
		limits   *Limits
		rules    []string // RuleRef.String()
	}
	tests := []struct {
		name     string
		callee   func(*hcpv1alpha1.Callee)
		caller   Caller
		policies []hcpv1alpha1.CapabilityPolicy
		task     Task
		active   Active
		want     want
	}{
		// Before any policy: the capability itself.
		{
			name: "unknown capability", caller: alpha, policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task: Task{Capability: "cvd.teleport", DataClass: hcpv1alpha1.DataT1},
			want: want{reason: task.ReasonUnknownCapability, msg: []string{`callee "lab-cvd" offers no capability "cvd.teleport"`}},
		},
		{
			name: "missing data class is malformed", caller: alpha, policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task: synth(hcpv1alpha1.RiskR3, "", 0),
			want: want{reason: task.ReasonMalformed, msg: []string{`data classification ""`}},
		},
		{
			name: "unknown risk level is malformed", caller: alpha, policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task: synth("R9", hcpv1alpha1.DataT1, 0),
			want: want{reason: task.ReasonMalformed, msg: []string{`risk level "R9"`}},
		},
		{
			name: "negative duration is malformed", caller: alpha, policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, -time.Second),
			want: want{reason: task.ReasonMalformed, msg: []string{"negative"}},
		},
		{
			name: "data class above the capability's", caller: alpha, policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT3, 0),
			want: want{reason: task.ReasonDataClassExceedsPolicy, risk: hcpv1alpha1.RiskR3,
				msg: []string{`data classification T3 exceeds T2`, `capability "cvd.run-synthesis"`}},
		},
		{
			name: "duration above the capability's maxDuration", caller: alpha, policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 80*time.Hour),
			want: want{reason: task.ReasonDurationExceedsPolicy, risk: hcpv1alpha1.RiskR3,
				msg: []string{"requested duration PT80H exceeds maxDuration PT72H of capability"}},
		},

		// Default deny.
		{
			name: "no policy at all", caller: alpha,
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0),
			want: want{reason: task.ReasonNotAuthorized, risk: hcpv1alpha1.RiskR3, msg: []string{`no CapabilityPolicy selects callee "lab-cvd"`, "default deny"}},
		},
		{
			name: "policy of another namespace is ignored", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{func() hcpv1alpha1.CapabilityPolicy { p := alphaSynthR3; p.Namespace = "other"; return p }()},
			task:     synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0),
			want:     want{reason: task.ReasonNotAuthorized, risk: hcpv1alpha1.RiskR3, msg: []string{"no CapabilityPolicy selects"}},
		},
		{
			name: "calleeSelector selects other callees", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("dry-lab", map[string]string{"tier": "dry"}, rule("", ids("*"), ids("*"), hcpv1alpha1.RiskR5))},
			task:     synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0),
			want:     want{reason: task.ReasonNotAuthorized, msg: []string{"no CapabilityPolicy selects"}, risk: hcpv1alpha1.RiskR3},
		},
		{
			name: "caller not listed", caller: beta, policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0),
			want: want{reason: task.ReasonNotAuthorized, risk: hcpv1alpha1.RiskR3,
				msg: []string{`no rule of CapabilityPolicy "alpha-synthesis" admits caller "beta" to capability "cvd.run-synthesis"`}},
		},
		{
			name: "capability not listed", caller: alpha, policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task: Task{Capability: "cvd.read-telemetry", DataClass: hcpv1alpha1.DataT1},
			want: want{reason: task.ReasonNotAuthorized, risk: hcpv1alpha1.RiskR1, msg: []string{`capability "cvd.read-telemetry"`}},
		},
		{
			name: "selector never matches a caller without a Caller object, even when empty", caller: alphaUnknown,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("by-label", nil, rule("everyone-here", nil, ids("*"), hcpv1alpha1.RiskR5, callerSel(&metav1.LabelSelector{})))},
			task:     synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0),
			want:     want{reason: task.ReasonNotAuthorized, risk: hcpv1alpha1.RiskR3, msg: []string{"no Caller object in the namespace"}},
		},

		// Admission.
		{
			name: "admitted by id and exact capability", caller: alpha, policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT2, 0),
			want: want{admitted: true, risk: hcpv1alpha1.RiskR3, rules: []string{"alpha-synthesis/alpha-r3"},
				msg:    []string{`admitted by rule "alpha-r3" of CapabilityPolicy "alpha-synthesis"`},
				limits: &Limits{MaxRiskLevel: hcpv1alpha1.RiskR3, DataClassifications: []hcpv1alpha1.DataClass{"T1", "T2"}, MaxDuration: 72 * time.Hour}},
		},
		{
			name: "admitted by id for a caller without a Caller object", caller: alphaUnknown, policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task: synth(hcpv1alpha1.RiskR2, hcpv1alpha1.DataT1, time.Hour),
			want: want{admitted: true, risk: hcpv1alpha1.RiskR3, rules: []string{"alpha-synthesis/alpha-r3"}},
		},
		{
			name: "admitted by '*' and a glob", caller: beta,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("telemetry", map[string]string{"site": "lab"}, rule("", ids("*"), ids("cvd.read-*"), hcpv1alpha1.RiskR1))},
			task:     Task{Capability: "cvd.read-telemetry", DataClass: hcpv1alpha1.DataT1},
			want: want{admitted: true, risk: hcpv1alpha1.RiskR1, rules: []string{"telemetry/rules[0]"},
				msg:    []string{`rule "rules[0]" of CapabilityPolicy "telemetry"`},
				limits: &Limits{MaxRiskLevel: hcpv1alpha1.RiskR1, DataClassifications: []hcpv1alpha1.DataClass{"T1"}}},
		},
		{
			name: "admitted by caller selector", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("chem", nil, rule("chem-team", nil, ids("cvd.*"), hcpv1alpha1.RiskR3,
				callerSel(&metav1.LabelSelector{MatchLabels: map[string]string{"team": "chem"}})))},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT2, 0),
			want: want{admitted: true, risk: hcpv1alpha1.RiskR3, rules: []string{"chem/chem-team"}},
		},
		{
			name: "empty caller selector matches a Caller object without labels", caller: beta,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("all-here", nil, rule("", nil, ids("*"), hcpv1alpha1.RiskR3, callerSel(&metav1.LabelSelector{})))},
			task:     synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT2, 0),
			want:     want{admitted: true, risk: hcpv1alpha1.RiskR3, rules: []string{"all-here/rules[0]"}},
		},
		{
			name: "ids or selector: the id suffices when the selector does not match", caller: beta,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("mixed", nil, rule("", ids("beta"), ids("*"), hcpv1alpha1.RiskR3,
				callerSel(&metav1.LabelSelector{MatchLabels: map[string]string{"team": "chem"}})))},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT2, 0),
			want: want{admitted: true, risk: hcpv1alpha1.RiskR3},
		},

		// Limits of the applicable rule.
		{
			name: "risk above maxRiskLevel", caller: alpha, policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task: synth(hcpv1alpha1.RiskR4, hcpv1alpha1.DataT1, 0),
			want: want{reason: task.ReasonRiskExceedsPolicy, risk: hcpv1alpha1.RiskR4, rules: []string{"alpha-synthesis/alpha-r3"},
				msg: []string{`assessed risk R4 exceeds maxRiskLevel R3 of rule "alpha-r3" of CapabilityPolicy "alpha-synthesis"`}},
		},
		{
			name: "risk is never below the capability's base", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("low", nil, rule("r2", ids("alpha"), ids("*"), hcpv1alpha1.RiskR2))},
			task:     synth(hcpv1alpha1.RiskR1, hcpv1alpha1.DataT1, 0),
			want: want{reason: task.ReasonRiskExceedsPolicy, risk: hcpv1alpha1.RiskR3,
				msg: []string{`assessed risk R3 (the base risk of capability "cvd.run-synthesis") exceeds maxRiskLevel R2`}},
		},
		{
			name: "data class not allowed by the rule", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("public", nil, rule("public-only", ids("alpha"), ids("*"), hcpv1alpha1.RiskR5, classes(hcpv1alpha1.DataT1)))},
			task:     synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT2, 0),
			want: want{reason: task.ReasonDataClassExceedsPolicy, risk: hcpv1alpha1.RiskR3,
				msg: []string{`data classification T2 is not among the dataClassifications [T1] of rule "public-only"`}},
		},
		{
			name: "duration above the rule's maxDuration", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("short", nil, rule("short", ids("alpha"), ids("*"), hcpv1alpha1.RiskR5, maxDur("PT2H")))},
			task:     synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 3*time.Hour),
			want: want{reason: task.ReasonDurationExceedsPolicy, risk: hcpv1alpha1.RiskR3,
				msg: []string{`requested duration PT3H exceeds maxDuration PT2H of rule "short"`}},
		},
		{
			name: "concurrency limit reached", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("two", nil, rule("two", ids("alpha"), ids("*"), hcpv1alpha1.RiskR5, maxConc(2)))},
			task:     synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0), active: Active{CallerOnCallee: 2, Callee: 2},
			want: want{reason: task.ReasonConcurrencyLimit, risk: hcpv1alpha1.RiskR3,
				msg: []string{`caller "alpha" already has 2 active sessions on callee "lab-cvd", the maxConcurrentSessions of rule "two"`, "is 2"}},
		},
		{
			name: "below the concurrency limit", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("two", nil, rule("two", ids("alpha"), ids("*"), hcpv1alpha1.RiskR5, maxConc(2)))},
			task:     synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0), active: Active{CallerOnCallee: 1, Callee: 7},
			want: want{admitted: true, risk: hcpv1alpha1.RiskR3,
				limits: &Limits{MaxRiskLevel: hcpv1alpha1.RiskR5, DataClassifications: []hcpv1alpha1.DataClass{"T1", "T2"}, MaxDuration: 72 * time.Hour, MaxConcurrentSessions: 2}},
		},
		{
			name: "callee-wide maxConcurrent reached after policy admission", caller: alpha,
			callee:   func(c *hcpv1alpha1.Callee) { c.Spec.Sessions.MaxConcurrent = ptr.To[int32](4) },
			policies: []hcpv1alpha1.CapabilityPolicy{alphaSynthR3},
			task:     synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0), active: Active{CallerOnCallee: 0, Callee: 4},
			want: want{reason: task.ReasonConcurrencyLimit, risk: hcpv1alpha1.RiskR3, rules: []string{"alpha-synthesis/alpha-r3"},
				msg: []string{`callee "lab-cvd" already runs 4 sessions, its spec.sessions.maxConcurrent is 4`}},
		},

		// Several rules.
		{
			name: "the reason comes from the rule that came closest", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{
				pol("a-low-risk", nil, rule("low", ids("alpha"), ids("*"), hcpv1alpha1.RiskR1)),
				pol("b-one-at-a-time", nil, rule("single", ids("alpha"), ids("*"), hcpv1alpha1.RiskR5, maxConc(1))),
			},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0), active: Active{CallerOnCallee: 1, Callee: 1},
			want: want{reason: task.ReasonConcurrencyLimit, risk: hcpv1alpha1.RiskR3, msg: []string{`rule "single"`},
				rules: []string{"a-low-risk/low", "b-one-at-a-time/single"}},
		},
		{
			name: "ties go to the first policy by name, whatever the list order", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{
				pol("zeta", nil, rule("z", ids("alpha"), ids("*"), hcpv1alpha1.RiskR2)),
				pol("eta", nil, rule("e", ids("alpha"), ids("*"), hcpv1alpha1.RiskR1)),
			},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0),
			want: want{reason: task.ReasonRiskExceedsPolicy, risk: hcpv1alpha1.RiskR3, msg: []string{`rule "e" of CapabilityPolicy "eta"`},
				rules: []string{"eta/e", "zeta/z"}},
		},
		{
			name: "rules never combine: risk from one and duration from another do not admit", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("split", nil,
				rule("long-but-low", ids("alpha"), ids("*"), hcpv1alpha1.RiskR2, maxDur("PT72H")),
				rule("high-but-short", ids("alpha"), ids("*"), hcpv1alpha1.RiskR3, maxDur("PT1H")),
			)},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 2*time.Hour),
			want: want{reason: task.ReasonDurationExceedsPolicy, risk: hcpv1alpha1.RiskR3, msg: []string{`rule "high-but-short"`}},
		},
		{
			name: "several admitting rules: the tightest limits apply", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{
				pol("broad", map[string]string{"site": "lab"}, rule("everyone", ids("*"), ids("cvd.*"), hcpv1alpha1.RiskR3, classes(hcpv1alpha1.DataT1, hcpv1alpha1.DataT2), maxDur("PT24H"), maxConc(5))),
				pol("specific", nil, rule("alpha", ids("alpha"), ids("cvd.run-synthesis"), hcpv1alpha1.RiskR4, maxDur("PT72H"), maxConc(2))),
			},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT2, 0),
			want: want{admitted: true, risk: hcpv1alpha1.RiskR3, rules: []string{"broad/everyone", "specific/alpha"},
				msg:    []string{`admitted by rule "everyone" of CapabilityPolicy "broad" (also admitted by specific/alpha; the tightest limits apply)`},
				limits: &Limits{MaxRiskLevel: hcpv1alpha1.RiskR3, DataClassifications: []hcpv1alpha1.DataClass{"T1", "T2"}, MaxDuration: 24 * time.Hour, MaxConcurrentSessions: 2}},
		},
		{
			name: "a broad rule does not take away what a specific rule grants", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{
				pol("broad", nil, rule("everyone", ids("*"), ids("cvd.*"), hcpv1alpha1.RiskR3, maxDur("PT24H"))),
				pol("specific", nil, rule("alpha", ids("alpha"), ids("cvd.run-synthesis"), hcpv1alpha1.RiskR3, maxDur("PT72H"))),
			},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT2, 48*time.Hour),
			want: want{admitted: true, risk: hcpv1alpha1.RiskR3, rules: []string{"specific/alpha"},
				limits: &Limits{MaxRiskLevel: hcpv1alpha1.RiskR3, DataClassifications: []hcpv1alpha1.DataClass{"T1", "T2"}, MaxDuration: 72 * time.Hour}},
		},
		{
			name: "data classes: intersection of the rules, bounded by the capability", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{
				pol("p1", nil, rule("", ids("alpha"), ids("cvd.calibrate"), hcpv1alpha1.RiskR2, classes(hcpv1alpha1.DataT1, hcpv1alpha1.DataT3, hcpv1alpha1.DataT4))),
				pol("p2", nil, rule("", ids("*"), ids("*"), hcpv1alpha1.RiskR2, classes(hcpv1alpha1.DataT1, hcpv1alpha1.DataT2, hcpv1alpha1.DataT3))),
				pol("p3", nil, rule("", ids("alpha"), ids("cvd.*"), hcpv1alpha1.RiskR2)),
			},
			task: Task{Capability: "cvd.calibrate", DataClass: hcpv1alpha1.DataT3, Duration: 30 * time.Minute},
			want: want{admitted: true, risk: hcpv1alpha1.RiskR2, rules: []string{"p1/rules[0]", "p2/rules[0]", "p3/rules[0]"},
				limits: &Limits{MaxRiskLevel: hcpv1alpha1.RiskR2, DataClassifications: []hcpv1alpha1.DataClass{"T1", "T3"}, MaxDuration: time.Hour}},
		},

		// Invalid policies fail closed.
		{
			name: "a policy with an invalid calleeSelector admits nothing", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{func() hcpv1alpha1.CapabilityPolicy {
				p := pol("broken", nil, rule("", ids("*"), ids("*"), hcpv1alpha1.RiskR5))
				p.Spec.CalleeSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "site", Operator: "Like", Values: []string{"lab"}}}}
				return p
			}()},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0),
			want: want{reason: task.ReasonNotAuthorized, risk: hcpv1alpha1.RiskR3, msg: []string{`no CapabilityPolicy selects`, `CapabilityPolicy "broken" is invalid`}},
		},
		{
			name: "an invalid rule admits nothing", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("half-broken", nil,
				rule("bad-selector", ids("alpha"), ids("*"), hcpv1alpha1.RiskR5, callerSel(&metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "x"}})),
			)},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0),
			want: want{reason: task.ReasonNotAuthorized, risk: hcpv1alpha1.RiskR3, msg: []string{`no rule of CapabilityPolicy "half-broken"`, `"half-broken" is invalid in part`}},
		},
		{
			name: "the valid rules of a policy with an invalid rule still admit", caller: alpha,
			policies: []hcpv1alpha1.CapabilityPolicy{pol("half-broken", nil,
				rule("bad-duration", ids("alpha"), ids("*"), hcpv1alpha1.RiskR5, maxDur("PT0S")),
				rule("good", ids("alpha"), ids("*"), hcpv1alpha1.RiskR3),
			)},
			task: synth(hcpv1alpha1.RiskR3, hcpv1alpha1.DataT1, 0),
			want: want{admitted: true, risk: hcpv1alpha1.RiskR3, rules: []string{"half-broken/good"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			callee := labCVD()
			if tc.callee != nil {
				tc.callee(callee)
			}
			got := Decide(callee, tc.caller, tc.policies, tc.task, tc.active)
			t.Logf("decision: %+v", got)
			if got.Admitted != tc.want.admitted || got.Reason != tc.want.reason {
				t.Fatalf("admitted=%v reason=%q, want admitted=%v reason=%q (message: %s)", got.Admitted, got.Reason, tc.want.admitted, tc.want.reason, got.Message)
			}
			if got.Admitted && got.Reason != "" || !got.Admitted && !tc.want.reason.Valid() {
				t.Fatalf("inconsistent decision %+v", got)
			}
			for _, s := range tc.want.msg {
				if !strings.Contains(got.Message, s) {
					t.Errorf("message %q does not contain %q", got.Message, s)
				}
			}
			if got.Risk != tc.want.risk {
				t.Errorf("risk = %q, want %q", got.Risk, tc.want.risk)
			}
			if tc.want.limits != nil && !reflect.DeepEqual(got.Limits, *tc.want.limits) {
				t.Errorf("limits = %+v, want %+v", got.Limits, *tc.want.limits)
			}
			if !got.Admitted && !reflect.DeepEqual(got.Limits, Limits{}) {
				t.Errorf("denied decision carries limits %+v", got.Limits)
			}
			if tc.want.rules != nil {
				var names []string
				for _, r := range got.Rules {
					names = append(names, r.String())
				}
				if !reflect.DeepEqual(names, tc.want.rules) {
					t.Errorf("rules = %v, want %v", names, tc.want.rules)
				}
			}
		})
	}
}

func TestGlob(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"cvd.run-synthesis", "cvd.run-synthesis", true},
		{"cvd.run-synthesis", "cvd.run-synthesis2", false},
		{"cvd.run-synthesis", "cvd.run-synthesi", false},
		{"*", "anything.at.all", true},
		{"*", "", true},
		{"cvd.*", "cvd.run-synthesis", true},
		{"cvd.*", "cvd.", true},
		{"cvd.*", "cvd", false},
		{"cvd.*", "xcvd.run", false},
		{"*.read-*", "cvd.read-telemetry", true},
		{"*.read-*", "cvd.write-telemetry", false},
		{"*telemetry", "cvd.read-telemetry", true},
		{"a*b*c", "aXXbYYc", true},
		{"a*b*c", "aXXcYYb", false},
		{"a**c", "abc", true},
		{"a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false},
		{".", "x", false}, // '.' is literal, not a regexp
	}
	for _, tc := range tests {
		if got := Glob(tc.pattern, tc.name); got != tc.want {
			t.Errorf("Glob(%q, %q) = %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
}
