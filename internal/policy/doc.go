// Package policy is the L3 policy decision of HCP: given a Callee, the
// authenticated caller, the CapabilityPolicies of the namespace and a task,
// may the task run, and within which limits? The callee sidecar's gate calls
// Decide before any side effect; the CapabilityPolicy controller uses the
// same compiled rules (SelectCallees, RuleCoverage, ValidateRules) so that
// what status reports is exactly what the gate enforces.
//
// The package is pure: no client, no clock, no I/O. Callers pass in what
// they read from their informers.
//
// # Semantics
//
// Default deny. A task is admitted only when at least one rule admits it
// entirely. A rule applies to a task when
//
//   - its policy is in the Callee's namespace and its calleeSelector matches
//     the Callee's labels (an empty selector matches every Callee);
//   - the caller matches spec.rules[].callers: its id is listed, "*" is
//     listed, or the selector matches the labels of the caller's Caller
//     object (ids and selector are alternatives: either one suffices). A
//     caller with no Caller object in the namespace (an external program,
//     or a Caller in another namespace sharing the vhost) has no labels:
//     selectors, even an empty one, never match it; only ids do;
//   - one of its capability patterns matches the capability name, where '*'
//     matches any run of characters, dots included ("cvd.*", "*").
//
// An applicable rule admits the task when the assessed risk is at most its
// maxRiskLevel, the task's data class is in its dataClassifications (all
// classes when omitted), the requested duration is at most its maxDuration,
// and the caller has fewer than maxConcurrentSessions active sessions on the
// Callee.
//
// Why "some rule admits it entirely" rather than "every applicable rule
// admits it": policies are additive grants. A broad rule ("every caller may
// read telemetry at R1") must not take away what a specific rule grants
// ("alpha may run synthesis up to R3"), otherwise adding a harmless policy
// could silently deny tasks that worked before. Rules are never combined
// into a grant that no single rule gives: a risk admitted by one rule and a
// duration admitted by another do not add up to an admission.
//
// The tightest limits apply. Once admitted, the session is bound by the
// limits of every rule that admitted it, combined tightest (Limits): the
// lowest maxRiskLevel, the intersection of the data classes, the shortest
// maxDuration, the lowest maxConcurrentSessions, further bounded by the
// capability's own dataClassification and maxDuration. By construction the
// task itself satisfies them. A task that names no duration is therefore
// bound by the shortest maxDuration among the rules admitting it; a caller
// that needs longer asks for it explicitly, and is then admitted only by the
// rules that allow it.
//
// Before any policy is consulted the capability must exist on the Callee
// (unknown_capability) and the task must fit the capability itself: the
// assessed risk is never below the capability's base riskLevel, a data class
// above the capability's dataClassification is refused
// (data_class_exceeds_policy), a duration above its maxDuration too
// (duration_exceeds_policy). After policy admission the Callee-wide cap
// spec.sessions.maxConcurrent is checked (concurrency_limit).
//
// When no rule admits the task, the reason names the rule that came closest:
// checks run in the order risk, data class, duration, concurrency, and the
// rule that failed latest wins (ties go to the first in policy-name, then
// rule order). A caller told concurrency_limit knows that waiting helps; one
// told risk_exceeds_policy knows it does not. When no rule even applies, the
// reason is not_authorized.
//
// Concurrency is counted per (caller, callee) over all the caller's
// non-terminal sessions on the Callee, whichever rule admitted them: the
// sessions do not record the admitting rule, and counting them all is the
// conservative choice.
//
// Policies or rules that are invalid in ways CEL cannot see (a label
// selector the API server accepted but labels cannot parse, an unparseable
// duration) admit nothing: the gate fails closed, and ValidateRules gives the
// controller the same errors to report in status.
package policy
