package policy

import (
	"fmt"
	"slices"
	"strings"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// SelectCallees returns the sorted, distinct ids of the Callees in p's
// namespace that p's calleeSelector selects; nil when the selector is
// invalid (such a policy selects nothing).
func SelectCallees(p *hcpv1alpha1.CapabilityPolicy, callees []hcpv1alpha1.Callee) []string {
	cp := compile(p)
	return selectCallees(&cp, callees)
}

func selectCallees(cp *compiledPolicy, callees []hcpv1alpha1.Callee) []string {
	var ids []string
	for i := range callees {
		if cp.selects(&callees[i]) {
			ids = append(ids, callees[i].ID())
		}
	}
	return sortedSet(ids)
}

// SelectCallers returns the sorted, distinct ids of the Callers in p's
// namespace that some valid rule of p admits (by id, "*" or selector).
func SelectCallers(p *hcpv1alpha1.CapabilityPolicy, callers []hcpv1alpha1.Caller) []string {
	cp := compile(p)
	var ids []string
	for i := range callers {
		c := &callers[i]
		if !sameNamespace(cp.namespace, c.Namespace) {
			continue
		}
		for j := range cp.rules {
			if cp.rules[j].matchesCaller(KnownCaller(c)) {
				ids = append(ids, c.ID())
				break
			}
		}
	}
	return sortedSet(ids)
}

// RuleMatch is what one rule of a policy reaches among existing objects.
type RuleMatch struct {
	// Rule identifies the rule.
	Rule RuleRef
	// Invalid is true when the rule (or the policy's calleeSelector) is
	// invalid: it admits nothing (see ValidateRules).
	Invalid bool
	// Callees are the ids of the selected Callees offering at least one
	// capability the rule names.
	Callees []string
	// Callers are the ids of the Caller objects the rule admits.
	Callers []string
	// AnyCaller is true when the rule lists "*": it admits callers that have
	// no Caller object here too, so it is never reported as matching no
	// caller.
	AnyCaller bool
}

// Problem says why the rule matches nothing, or "" when it matches
// something.
func (m RuleMatch) Problem() string {
	switch {
	case m.Invalid:
		return fmt.Sprintf("rule %q is invalid and admits nothing", m.Rule.Name())
	case len(m.Callees) == 0 && !m.AnyCaller && len(m.Callers) == 0:
		return fmt.Sprintf("rule %q matches no capability of the selected Callees and no Caller", m.Rule.Name())
	case len(m.Callees) == 0:
		return fmt.Sprintf("rule %q matches no capability of the selected Callees", m.Rule.Name())
	case !m.AnyCaller && len(m.Callers) == 0:
		return fmt.Sprintf("rule %q matches no Caller in the namespace (callers by id from other namespaces still work)", m.Rule.Name())
	}
	return ""
}

// RuleCoverage reports, for every rule of p in order, which of the given
// Callees and Callers it reaches.
func RuleCoverage(p *hcpv1alpha1.CapabilityPolicy, callees []hcpv1alpha1.Callee, callers []hcpv1alpha1.Caller) []RuleMatch {
	cp := compile(p)
	valid := map[int]*compiledRule{}
	for i := range cp.rules {
		valid[cp.rules[i].ref.Index] = &cp.rules[i]
	}
	var selected []*hcpv1alpha1.Callee
	for i := range callees {
		if cp.selects(&callees[i]) {
			selected = append(selected, &callees[i])
		}
	}
	out := make([]RuleMatch, len(p.Spec.Rules))
	for i := range p.Spec.Rules {
		out[i].Rule = RuleRef{Policy: p.Name, Index: i, Rule: p.Spec.Rules[i].Name}
		r, ok := valid[i]
		if !ok || cp.callees == nil {
			out[i].Invalid = true
			continue
		}
		out[i].AnyCaller = r.anyCaller
		for _, c := range selected {
			if slices.ContainsFunc(c.Spec.Capabilities, func(capability hcpv1alpha1.Capability) bool {
				return r.matchesCapability(capability.Name)
			}) {
				out[i].Callees = append(out[i].Callees, c.ID())
			}
		}
		for j := range callers {
			c := &callers[j]
			if sameNamespace(cp.namespace, c.Namespace) && r.matchesCaller(KnownCaller(c)) {
				out[i].Callers = append(out[i].Callers, c.ID())
			}
		}
		out[i].Callees = sortedSet(out[i].Callees)
		out[i].Callers = sortedSet(out[i].Callers)
	}
	return out
}

// RulesMatchingNothing returns the names (Rule.Name) of the rules of p that
// match no selected Callee capability or no Caller, or are invalid.
func RulesMatchingNothing(p *hcpv1alpha1.CapabilityPolicy, callees []hcpv1alpha1.Callee, callers []hcpv1alpha1.Caller) []string {
	var names []string
	for _, m := range RuleCoverage(p, callees, callers) {
		if m.Problem() != "" {
			names = append(names, m.Rule.Name())
		}
	}
	return names
}

// ValidateRules checks what the CRD's schema and CEL rules cannot: label
// selectors that labels cannot parse (bad operators, keys or values),
// durations that do not fit, duplicate rule names. Every error is a
// *field.Error naming the offending field. A policy with errors is enforced
// only in part: an invalid calleeSelector disables the whole policy, an
// invalid rule disables that rule (duplicate names disable nothing).
func ValidateRules(p *hcpv1alpha1.CapabilityPolicy) []error {
	cp := compile(p)
	if len(cp.errs) == 0 {
		return nil
	}
	errs := make([]error, len(cp.errs))
	for i, err := range cp.errs {
		errs[i] = err
	}
	return errs
}

// Summary joins errors into one line for a condition message.
func Summary(errs []error) string {
	s := make([]string, len(errs))
	for i, err := range errs {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func sameNamespace(policyNS, objNS string) bool {
	return policyNS == "" || objNS == "" || policyNS == objNS
}

func sortedSet(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	slices.Sort(s)
	return slices.Compact(s)
}
