package policy

import (
	"fmt"
	"strings"
	"time"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// Caller is the caller a decision is about, identified by the broker
// (validated user_id), never by the payload alone.
type Caller struct {
	// ID is the caller id.
	ID string
	// Labels of the caller's Caller object.
	Labels map[string]string
	// Known is true when a Caller object with this id exists in the Callee's
	// namespace. Label selectors match known callers only: a Caller object
	// without labels and a caller with no object both have nil Labels, but
	// only the first is matched by an empty selector.
	Known bool
}

// KnownCaller describes a caller that has a Caller object.
func KnownCaller(c *hcpv1alpha1.Caller) Caller {
	return Caller{ID: c.ID(), Labels: c.Labels, Known: true}
}

// UnknownCaller describes a caller with no Caller object in the namespace
// (an external program, or a Caller in another namespace sharing the vhost).
func UnknownCaller(id string) Caller { return Caller{ID: id} }

// Task is what a task_submit asks for, as the gate assessed it.
type Task struct {
	// Capability named by the task.
	Capability string
	// Risk is the assessed risk. Decide never goes below the capability's
	// base risk; empty means "the base risk".
	Risk hcpv1alpha1.RiskLevel
	// DataClass declared by the task (constraints.data_classification).
	DataClass hcpv1alpha1.DataClass
	// Duration is the requested constraints.max_duration; zero when the task
	// names none (the session is then bound by Limits.MaxDuration).
	Duration time.Duration
}

// Active counts non-terminal sessions at the time of the decision.
type Active struct {
	// CallerOnCallee counts the caller's sessions on this Callee (checked
	// against maxConcurrentSessions).
	CallerOnCallee int
	// Callee counts all sessions on this Callee, every caller and replica
	// (checked against spec.sessions.maxConcurrent).
	Callee int
}

// Limits are the effective limits of an admitted task: those of every rule
// that admitted it, combined tightest, and bounded by the capability's own.
type Limits struct {
	// MaxRiskLevel is the lowest maxRiskLevel of the admitting rules.
	MaxRiskLevel hcpv1alpha1.RiskLevel
	// DataClassifications are the classes every admitting rule and the
	// capability allow, in increasing order.
	DataClassifications []hcpv1alpha1.DataClass
	// MaxDuration is the shortest maxDuration of the admitting rules and the
	// capability; zero when none sets one.
	MaxDuration time.Duration
	// MaxConcurrentSessions is the lowest maxConcurrentSessions of the
	// admitting rules; zero when none sets one.
	MaxConcurrentSessions int32
}

// Decision is the outcome of Decide.
type Decision struct {
	// Admitted is true when the task may run.
	Admitted bool
	// Reason is the task_rejected reason code; empty when admitted.
	Reason task.ReasonCode
	// Message explains the decision for humans, naming the policy and rule.
	Message string
	// Risk is the risk the decision was made for: the assessed risk, raised
	// to the capability's base risk. Empty when the capability is unknown.
	Risk hcpv1alpha1.RiskLevel
	// Limits in force for the admitted session; zero when denied.
	Limits Limits
	// Rules are the rules that admitted the task, or, when denied, the rules
	// that applied to the caller and capability but refused a limit.
	Rules []RuleRef
}

// Decide runs the L3 policy decision for one task (see the package
// documentation for the semantics). policies are the CapabilityPolicies of
// the Callee's namespace; those of other namespaces are ignored.
func Decide(callee *hcpv1alpha1.Callee, caller Caller, policies []hcpv1alpha1.CapabilityPolicy, t Task, active Active) Decision {
	capability := findCapability(callee, t.Capability)
	if capability == nil {
		return deny(task.ReasonUnknownCapability, "callee %q offers no capability %q", callee.ID(), t.Capability)
	}
	class := task.DataClass(t.DataClass)
	if !class.Valid() {
		return deny(task.ReasonMalformed, "data classification %q is not one of %s", t.DataClass, strings.Join(levelStrings(task.DataClasses()), ", "))
	}
	if t.Risk != "" && !task.RiskLevel(t.Risk).Valid() {
		return deny(task.ReasonMalformed, "risk level %q is not one of %s", t.Risk, strings.Join(levelStrings(task.RiskLevels()), ", "))
	}
	if t.Duration < 0 {
		return deny(task.ReasonMalformed, "requested duration %s is negative", t.Duration)
	}
	base := task.RiskLevel(capability.RiskLevel)
	risk := task.RiskLevel(t.Risk).Max(base)

	d := checkCapability(callee, capability, class, t.Duration)
	if d != nil {
		d.Risk = hcpv1alpha1.RiskLevel(risk)
		return *d
	}

	// Collect the rules that apply to this caller and capability.
	var selecting, invalid []string
	var applicable []*compiledRule
	for _, cp := range compileAll(policies, callee.Namespace) {
		if cp.callees == nil {
			invalid = append(invalid, cp.name)
			continue
		}
		if !cp.selects(callee) {
			continue
		}
		selecting = append(selecting, cp.name)
		if cp.skipped > 0 {
			invalid = append(invalid, cp.name)
		}
		for i := range cp.rules {
			r := &cp.rules[i]
			if r.matchesCaller(caller) && r.matchesCapability(t.Capability) {
				applicable = append(applicable, r)
			}
		}
	}
	if len(applicable) == 0 {
		d := notAuthorized(callee, caller, t.Capability, selecting, invalid)
		d.Risk = hcpv1alpha1.RiskLevel(risk)
		return d
	}

	// Admitted iff one applicable rule admits the task entirely.
	var admitting []*compiledRule
	best := struct {
		stage  int
		reason task.ReasonCode
		msg    string
	}{stage: -1}
	for _, r := range applicable {
		stage, reason, msg := r.check(callee, caller, t, risk, base, active)
		if stage == stageAdmitted {
			admitting = append(admitting, r)
			continue
		}
		if stage > best.stage {
			best.stage, best.reason, best.msg = stage, reason, msg
		}
	}
	if len(admitting) == 0 {
		return Decision{Reason: best.reason, Message: best.msg, Risk: hcpv1alpha1.RiskLevel(risk), Rules: refs(applicable)}
	}

	if limit := callee.Spec.Sessions.MaxConcurrent; limit != nil && active.Callee >= int(*limit) {
		return Decision{
			Reason:  task.ReasonConcurrencyLimit,
			Message: fmt.Sprintf("callee %q already runs %d sessions, its spec.sessions.maxConcurrent is %d", callee.ID(), active.Callee, *limit),
			Risk:    hcpv1alpha1.RiskLevel(risk),
			Rules:   refs(admitting),
		}
	}

	msg := fmt.Sprintf("admitted by %s", admitting[0].ref.describe())
	if len(admitting) > 1 {
		others := make([]string, 0, len(admitting)-1)
		for _, r := range admitting[1:] {
			others = append(others, r.ref.String())
		}
		msg += fmt.Sprintf(" (also admitted by %s; the tightest limits apply)", strings.Join(others, ", "))
	}
	return Decision{
		Admitted: true,
		Message:  msg,
		Risk:     hcpv1alpha1.RiskLevel(risk),
		Limits:   combine(admitting, capability),
		Rules:    refs(admitting),
	}
}

// Stages of a rule check, in order; the later a rule fails, the closer it
// came to admitting the task.
const (
	stageRisk = iota
	stageDataClass
	stageDuration
	stageConcurrency
	stageAdmitted
)

func (r *compiledRule) check(callee *hcpv1alpha1.Callee, caller Caller, t Task, risk, base task.RiskLevel, active Active) (int, task.ReasonCode, string) {
	if r.maxRisk.Less(risk) {
		assessed := fmt.Sprintf("assessed risk %s", risk)
		if risk == base && task.RiskLevel(t.Risk) != risk {
			assessed += fmt.Sprintf(" (the base risk of capability %q)", t.Capability)
		}
		return stageRisk, task.ReasonRiskExceedsPolicy,
			fmt.Sprintf("%s exceeds maxRiskLevel %s of %s", assessed, r.maxRisk, r.ref.describe())
	}
	if r.classes != nil && !r.classes[t.DataClass] {
		return stageDataClass, task.ReasonDataClassExceedsPolicy,
			fmt.Sprintf("data classification %s is not among the dataClassifications %s of %s", t.DataClass, classList(r.classes), r.ref.describe())
	}
	if r.maxDuration > 0 && t.Duration > r.maxDuration {
		return stageDuration, task.ReasonDurationExceedsPolicy,
			fmt.Sprintf("requested duration %s exceeds maxDuration %s of %s", task.FormatDuration(t.Duration), task.FormatDuration(r.maxDuration), r.ref.describe())
	}
	if r.maxConcurrent > 0 && active.CallerOnCallee >= int(r.maxConcurrent) {
		return stageConcurrency, task.ReasonConcurrencyLimit,
			fmt.Sprintf("caller %q already has %d active sessions on callee %q, the maxConcurrentSessions of %s is %d",
				caller.ID, active.CallerOnCallee, callee.ID(), r.ref.describe(), r.maxConcurrent)
	}
	return stageAdmitted, "", ""
}

// checkCapability applies the capability's own limits, before any policy.
func checkCapability(callee *hcpv1alpha1.Callee, c *hcpv1alpha1.Capability, class task.DataClass, requested time.Duration) *Decision {
	if task.DataClass(c.DataClassification).Less(class) {
		d := deny(task.ReasonDataClassExceedsPolicy, "data classification %s exceeds %s, the most sensitive class capability %q of callee %q may handle",
			class, c.DataClassification, c.Name, callee.ID())
		return &d
	}
	limit, err := capabilityMaxDuration(c)
	if err != nil {
		d := deny(task.ReasonInternal, "capability %q of callee %q has an invalid maxDuration: %v", c.Name, callee.ID(), err)
		return &d
	}
	if limit > 0 && requested > limit {
		d := deny(task.ReasonDurationExceedsPolicy, "requested duration %s exceeds maxDuration %s of capability %q of callee %q",
			task.FormatDuration(requested), task.FormatDuration(limit), c.Name, callee.ID())
		return &d
	}
	return nil
}

func notAuthorized(callee *hcpv1alpha1.Callee, caller Caller, capability string, selecting, invalid []string) Decision {
	var msg string
	if len(selecting) == 0 {
		msg = fmt.Sprintf("no CapabilityPolicy selects callee %q, so no caller is admitted (default deny)", callee.ID())
	} else {
		who := fmt.Sprintf("caller %q", caller.ID)
		if !caller.Known {
			who += " (no Caller object in the namespace, so only rules listing its id apply)"
		}
		msg = fmt.Sprintf("no rule of CapabilityPolicy %s admits %s to capability %q of callee %q (default deny)",
			quoteJoin(selecting), who, capability, callee.ID())
	}
	if len(invalid) > 0 {
		msg += fmt.Sprintf("; CapabilityPolicy %s is invalid in part and ignored there, see its status", quoteJoin(invalid))
	}
	return deny(task.ReasonNotAuthorized, "%s", msg)
}

// combine folds the admitting rules' limits, tightest, with the capability's.
func combine(rules []*compiledRule, c *hcpv1alpha1.Capability) Limits {
	var l Limits
	l.MaxRiskLevel = hcpv1alpha1.RiskLevel(rules[0].maxRisk)
	l.MaxDuration, _ = capabilityMaxDuration(c) // checked valid by checkCapability
	for _, r := range rules {
		if r.maxRisk.Less(task.RiskLevel(l.MaxRiskLevel)) {
			l.MaxRiskLevel = hcpv1alpha1.RiskLevel(r.maxRisk)
		}
		if r.maxDuration > 0 && (l.MaxDuration == 0 || r.maxDuration < l.MaxDuration) {
			l.MaxDuration = r.maxDuration
		}
		if r.maxConcurrent > 0 && (l.MaxConcurrentSessions == 0 || r.maxConcurrent < l.MaxConcurrentSessions) {
			l.MaxConcurrentSessions = r.maxConcurrent
		}
	}
	for _, class := range task.DataClasses() {
		if task.DataClass(c.DataClassification).Less(class) {
			break
		}
		allowed := true
		for _, r := range rules {
			if r.classes != nil && !r.classes[hcpv1alpha1.DataClass(class)] {
				allowed = false
				break
			}
		}
		if allowed {
			l.DataClassifications = append(l.DataClassifications, hcpv1alpha1.DataClass(class))
		}
	}
	return l
}

func capabilityMaxDuration(c *hcpv1alpha1.Capability) (time.Duration, error) {
	if c.MaxDuration == "" {
		return 0, nil
	}
	return task.ParseDuration(string(c.MaxDuration))
}

func findCapability(callee *hcpv1alpha1.Callee, name string) *hcpv1alpha1.Capability {
	for i := range callee.Spec.Capabilities {
		if callee.Spec.Capabilities[i].Name == name {
			return &callee.Spec.Capabilities[i]
		}
	}
	return nil
}

func deny(reason task.ReasonCode, format string, args ...any) Decision {
	return Decision{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

func refs(rules []*compiledRule) []RuleRef {
	out := make([]RuleRef, len(rules))
	for i, r := range rules {
		out[i] = r.ref
	}
	return out
}

func classList(classes map[hcpv1alpha1.DataClass]bool) string {
	var s []string
	for _, c := range task.DataClasses() {
		if classes[hcpv1alpha1.DataClass(c)] {
			s = append(s, string(c))
		}
	}
	return "[" + strings.Join(s, " ") + "]"
}

func quoteJoin(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
