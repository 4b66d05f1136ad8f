package policy

import (
	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// Callers in other namespaces. A rule reaches a caller from another
// namespace only by its id or by "*" (a selector matches the labels of
// Caller objects in the policy's own namespace): these functions answer
// which policies can admit such a caller, for the operator's grant of
// HCPSession reads to it (internal/controller, caller_grants.go).

// AnyCallerID is the callers.ids entry that names every caller.
const AnyCallerID = "*"

// NamedCallerIDs returns the sorted, distinct caller ids the valid rules of
// p list in callers.ids, AnyCallerID included; nil when p's calleeSelector
// is invalid (the policy selects nothing).
func NamedCallerIDs(p *hcpv1alpha1.CapabilityPolicy) []string {
	cp := compile(p)
	if cp.callees == nil {
		return nil
	}
	var ids []string
	for i := range cp.rules {
		for id := range cp.rules[i].ids {
			ids = append(ids, id)
		}
	}
	return sortedSet(ids)
}

// NamesCallerFor reports whether p selects the callee and some valid rule of
// p lists callerID, or "*", in callers.ids: whether p can admit tasks of
// that caller to that callee whatever namespace the caller is in. The
// capability, risk and other limits are left aside: they vary per task.
func NamesCallerFor(p *hcpv1alpha1.CapabilityPolicy, callee *hcpv1alpha1.Callee, callerID string) bool {
	cp := compile(p)
	if !cp.selects(callee) {
		return false
	}
	for i := range cp.rules {
		if r := &cp.rules[i]; r.anyCaller || r.ids[callerID] {
			return true
		}
	}
	return false
}
