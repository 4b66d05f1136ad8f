package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// DefaultMaxDuration applies when neither the task, the policy, the
// capability nor the Callee sets a max duration.
const DefaultMaxDuration = time.Hour

// GateInput is everything the L3 gate decides on. The callee sidecar reads
// it from its informers; the gate itself does no I/O.
type GateInput struct {
	Now time.Time
	// Callee is the Callee the task was sent to.
	Callee *hcpv1alpha1.Callee
	// Caller is the authenticated caller (its id from the broker-validated
	// user_id) and its Caller object's labels.
	Caller Caller
	// Policies are the CapabilityPolicies of the Callee's namespace.
	Policies []hcpv1alpha1.CapabilityPolicy
	// Active counts the non-terminal sessions.
	Active Active
	// Task passed task.TaskSubmit.Validate and RequestedRisk.
	Task *task.TaskSubmit
}

// Verdict is the gate's decision.
type Verdict struct {
	Admitted bool
	// Reason is the task_rejected reason code; empty when admitted.
	Reason  task.ReasonCode
	Message string
	// Risk is the assessed risk (empty when rejected before assessment).
	Risk task.RiskLevel
	// MaxDuration of the admitted session.
	MaxDuration time.Duration
	// DataClass is the class the task was judged by: its own
	// constraints.data_classification, or, when it has none, the
	// capability's (empty when rejected before the capability was found).
	DataClass task.DataClass
	// Counted is true when a concurrency limit (a rule's
	// maxConcurrentSessions or the Callee's spec.sessions.maxConcurrent)
	// bounds the admission, so Active must be exact for it to hold.
	Counted bool
}

// Reject is a verdict refusing a task.
func Reject(reason task.ReasonCode, format string, args ...any) Verdict {
	return Verdict{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// RequestedRisk is the risk the task itself declares, metadata.risk_level
// (optional): a caller that knows its inputs make the task riskier than the
// capability's base level says so, and the assessment is never below it.
func RequestedRisk(ts *task.TaskSubmit) (task.RiskLevel, error) {
	m := bytes.TrimSpace(ts.Metadata)
	if len(m) == 0 || string(m) == "null" {
		return "", nil
	}
	var md struct {
		RiskLevel *string `json:"risk_level"`
	}
	if err := json.Unmarshal(m, &md); err != nil || md.RiskLevel == nil {
		return "", nil
	}
	r, err := task.ParseRiskLevel(*md.RiskLevel)
	if err != nil {
		return "", fmt.Errorf("invalid task_submit: metadata.risk_level: %w", err)
	}
	return r, nil
}

// CountsSessions reports whether a decision on callee under policies (the
// namespace's) can depend on GateInput.Active: whether a concurrency limit
// exists at all, the Callee's spec.sessions.maxConcurrent or any rule's
// maxConcurrentSessions. Without one the verdict is the same whatever the
// count, so the gate need not take it: counting lists every session of
// the callee still cached, terminal ones included (kept for
// ttlAfterFinished, a day by default), once per task.
func CountsSessions(callee *hcpv1alpha1.Callee, policies []hcpv1alpha1.CapabilityPolicy) bool {
	if callee.Spec.Sessions.MaxConcurrent != nil {
		return true
	}
	for i := range policies {
		for j := range policies[i].Spec.Rules {
			if policies[i].Spec.Rules[j].MaxConcurrentSessions != nil {
				return true
			}
		}
	}
	return false
}

// Gate is the L3 gate after identity parsing, expiry and deduplication, in
// the order of DESIGN.md section 4: caller identity matches caller_id →
// callee_id matches → capability exists → risk assessment → data class
// within the capability's → CapabilityPolicy (Decide) → within the task's
// own max_risk_level → the session's max duration and deadline.
//
// A task that does not say how sensitive its data is (the spec makes
// constraints.data_classification optional) is judged as the most sensitive
// data its capability may handle: a policy must admit that class, so
// leaving it out never widens what a caller may do.
func Gate(in GateInput) Verdict {
	ts := in.Task
	if ts.CallerID != in.Caller.ID {
		return Reject(task.ReasonNotAuthorized, "caller_id %q does not match the authenticated sender %q (AMQP user_id)", ts.CallerID, in.Caller.ID)
	}
	if calleeID := in.Callee.ID(); ts.CalleeID != calleeID {
		return Reject(task.ReasonMalformed, "callee_id %q does not match this callee %q", ts.CalleeID, calleeID)
	}
	class, implied := ts.Constraints.DataClassification, ""
	if c := findCapability(in.Callee, ts.Capability); c != nil && class == "" {
		class = task.DataClass(c.DataClassification)
		implied = fmt.Sprintf(" (the task has no constraints.data_classification; it is judged as %s, the class of capability %q)", class, c.Name)
	}
	requested, _ := RequestedRisk(ts) // checked by the decoder
	d := Decide(in.Callee, in.Caller, in.Policies, Task{
		Capability: ts.Capability,
		Risk:       hcpv1alpha1.RiskLevel(requested),
		DataClass:  hcpv1alpha1.DataClass(class),
		Duration:   ts.Constraints.MaxDuration.Std(),
	}, in.Active)
	risk := task.RiskLevel(d.Risk)
	if !d.Admitted {
		msg := d.Message
		if d.Reason == task.ReasonDataClassExceedsPolicy {
			msg += implied
		}
		v := Verdict{Reason: d.Reason, Message: msg, Risk: risk}
		if risk != "" {
			v.DataClass = class
		}
		return v
	}
	counted := d.Limits.MaxConcurrentSessions > 0 || in.Callee.Spec.Sessions.MaxConcurrent != nil

	if ceiling := ts.Constraints.MaxRiskLevel; ceiling != "" && ceiling.Less(risk) {
		return Verdict{Reason: task.ReasonRiskExceedsPolicy, Risk: risk, DataClass: class,
			Message: fmt.Sprintf("assessed risk %s exceeds the task's own constraints.max_risk_level %s", risk, ceiling)}
	}

	maxDur := ts.Constraints.MaxDuration.Std()
	if maxDur <= 0 {
		maxDur = d.Limits.MaxDuration
	}
	if maxDur <= 0 {
		maxDur = CalleeDuration(in.Callee.Spec.Sessions.DefaultMaxDuration, DefaultMaxDuration)
	}
	if dl := ts.Constraints.Deadline; dl != nil {
		if left := dl.Sub(in.Now); left < maxDur {
			maxDur = left
		}
	}
	// The session token carries whole seconds: a session shorter than one
	// second cannot be issued a token that is valid at all.
	if maxDur < time.Second {
		return Verdict{Reason: task.ReasonExpired, Risk: risk, DataClass: class,
			Message: fmt.Sprintf("constraints.deadline leaves %s, less than the one second a session needs", maxDur)}
	}
	return Verdict{Admitted: true, Risk: risk, MaxDuration: maxDur, Message: d.Message, DataClass: class, Counted: counted}
}

// CalleeDuration parses one of the Callee's ISO 8601 durations, def when it
// is unset or invalid (the CRD validates it).
func CalleeDuration(s hcpv1alpha1.ISO8601Duration, def time.Duration) time.Duration {
	if s != "" {
		if d, err := task.ParseDuration(string(s)); err == nil && d > 0 {
			return d
		}
	}
	return def
}
