package policy

import (
	"fmt"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// RuleRef names one rule of one policy.
type RuleRef struct {
	// Policy is the CapabilityPolicy's name.
	Policy string
	// Index is the rule's position in spec.rules.
	Index int
	// Rule is the rule's name; empty when the rule has none.
	Rule string
}

// Name is the rule's name, or "rules[i]" for an unnamed rule.
func (r RuleRef) Name() string {
	if r.Rule != "" {
		return r.Rule
	}
	return fmt.Sprintf("rules[%d]", r.Index)
}

// String is "policy/rule".
func (r RuleRef) String() string { return r.Policy + "/" + r.Name() }

// describe is the rule in a sentence: `rule "x" of CapabilityPolicy "p"`.
func (r RuleRef) describe() string {
	return fmt.Sprintf("rule %q of CapabilityPolicy %q", r.Name(), r.Policy)
}

// compiledPolicy is a CapabilityPolicy parsed once: selectors built,
// durations parsed. A policy whose calleeSelector is invalid has a nil
// callees selector and selects nothing; an invalid rule is left out.
type compiledPolicy struct {
	name      string
	namespace string
	callees   labels.Selector
	rules     []compiledRule
	// skipped counts the rules left out as invalid.
	skipped int
	errs    field.ErrorList
}

type compiledRule struct {
	ref           RuleRef
	anyCaller     bool
	ids           map[string]bool
	selector      labels.Selector // nil: no selector
	patterns      []string
	maxRisk       task.RiskLevel
	classes       map[hcpv1alpha1.DataClass]bool // nil: every class
	maxDuration   time.Duration                  // 0: no limit
	maxConcurrent int32                          // 0: no limit
}

var rulesPath = field.NewPath("spec", "rules")

// compile parses p. Errors are also kept in the result so that Decide and
// ValidateRules agree on what is invalid.
func compile(p *hcpv1alpha1.CapabilityPolicy) compiledPolicy {
	cp := compiledPolicy{name: p.Name, namespace: p.Namespace}
	if sel, err := selector(&p.Spec.CalleeSelector, field.NewPath("spec", "calleeSelector")); err != nil {
		cp.errs = append(cp.errs, err)
	} else {
		cp.callees = sel
	}
	names := map[string]int{}
	for i := range p.Spec.Rules {
		r := &p.Spec.Rules[i]
		path := rulesPath.Index(i)
		if r.Name != "" {
			if j, dup := names[r.Name]; dup {
				cp.errs = append(cp.errs, field.Duplicate(path.Child("name"),
					fmt.Sprintf("%s (also the name of spec.rules[%d]): rule names must be unique to tell rules apart in status and audit logs", r.Name, j)))
			} else {
				names[r.Name] = i
			}
		}
		cr, errs := compileRule(p.Name, i, r, path)
		if len(errs) > 0 {
			cp.errs = append(cp.errs, errs...)
			cp.skipped++
			continue
		}
		cp.rules = append(cp.rules, cr)
	}
	return cp
}

func compileRule(policy string, i int, r *hcpv1alpha1.PolicyRule, path *field.Path) (compiledRule, field.ErrorList) {
	var errs field.ErrorList
	cr := compiledRule{
		ref:      RuleRef{Policy: policy, Index: i, Rule: r.Name},
		ids:      map[string]bool{},
		patterns: r.Capabilities,
		maxRisk:  task.RiskLevel(r.MaxRiskLevel),
	}
	for _, id := range r.Callers.IDs {
		if id == AnyCallerID {
			cr.anyCaller = true
		}
		cr.ids[id] = true
	}
	if r.Callers.Selector != nil {
		sel, err := selector(r.Callers.Selector, path.Child("callers", "selector"))
		if err != nil {
			errs = append(errs, err)
		}
		cr.selector = sel
	}
	if len(r.Callers.IDs) == 0 && r.Callers.Selector == nil {
		errs = append(errs, field.Required(path.Child("callers"), "set callers.ids or callers.selector"))
	}
	if len(r.Capabilities) == 0 {
		errs = append(errs, field.Required(path.Child("capabilities"), "list at least one capability name or pattern"))
	}
	for j, c := range r.Capabilities {
		if c == "" {
			errs = append(errs, field.Invalid(path.Child("capabilities").Index(j), c, "must not be empty"))
		}
	}
	if !cr.maxRisk.Valid() {
		errs = append(errs, field.NotSupported(path.Child("maxRiskLevel"), r.MaxRiskLevel, levelStrings(task.RiskLevels())))
	}
	if len(r.DataClassifications) > 0 {
		cr.classes = map[hcpv1alpha1.DataClass]bool{}
		for j, c := range r.DataClassifications {
			if !task.DataClass(c).Valid() {
				errs = append(errs, field.NotSupported(path.Child("dataClassifications").Index(j), c, levelStrings(task.DataClasses())))
			}
			cr.classes[c] = true
		}
	}
	if r.MaxDuration != "" {
		d, err := task.ParseDuration(string(r.MaxDuration))
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(path.Child("maxDuration"), r.MaxDuration, err.Error()))
		case d <= 0:
			errs = append(errs, field.Invalid(path.Child("maxDuration"), r.MaxDuration, "must be longer than zero: a zero maxDuration admits no task"))
		default:
			cr.maxDuration = d
		}
	}
	if r.MaxConcurrentSessions != nil {
		if *r.MaxConcurrentSessions < 1 {
			errs = append(errs, field.Invalid(path.Child("maxConcurrentSessions"), *r.MaxConcurrentSessions, "must be at least 1"))
		}
		cr.maxConcurrent = *r.MaxConcurrentSessions
	}
	return cr, errs
}

// selector converts a label selector, reporting the API server's own
// message (bad operator, bad key, values where none belong) against path.
func selector(ls *metav1.LabelSelector, path *field.Path) (labels.Selector, *field.Error) {
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return nil, field.Invalid(path, field.OmitValueType{}, err.Error())
	}
	return sel, nil
}

// selects reports whether the policy selects the callee.
func (cp *compiledPolicy) selects(c *hcpv1alpha1.Callee) bool {
	if cp.callees == nil {
		return false
	}
	return sameNamespace(cp.namespace, c.Namespace) && cp.callees.Matches(labels.Set(c.Labels))
}

// matchesCaller reports whether the rule names or selects the caller.
func (r *compiledRule) matchesCaller(c Caller) bool {
	if r.anyCaller || r.ids[c.ID] {
		return true
	}
	return c.Known && r.selector != nil && r.selector.Matches(labels.Set(c.Labels))
}

// matchesCapability reports whether a capability pattern matches name.
func (r *compiledRule) matchesCapability(name string) bool {
	for _, p := range r.patterns {
		if Glob(p, name) {
			return true
		}
	}
	return false
}

// Glob reports whether name matches pattern, where '*' matches any run of
// characters (also none, also dots) and every other character matches
// itself.
func Glob(pattern, name string) bool {
	// Wildcard matching without recursion: on a mismatch, backtrack to the
	// last star and let it swallow one more character. Backtracking to the
	// last star only is enough because an earlier star could only swallow
	// what the later one can; the cost is at worst len(pattern)·len(name).
	p, n := 0, 0
	star, mark := -1, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, n
			p++
		case p < len(pattern) && pattern[p] == name[n]:
			p++
			n++
		case star >= 0:
			p = star + 1
			mark++
			n = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// compileAll compiles the policies of namespace ns (all when ns is empty),
// sorted by name so that decisions are deterministic.
func compileAll(policies []hcpv1alpha1.CapabilityPolicy, ns string) []compiledPolicy {
	out := make([]compiledPolicy, 0, len(policies))
	for i := range policies {
		p := &policies[i]
		if !sameNamespace(ns, p.Namespace) {
			continue
		}
		out = append(out, compile(p))
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func levelStrings[T ~string](ls []T) []string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = string(l)
	}
	return s
}
