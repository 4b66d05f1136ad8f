package callee

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// DefaultMaxDuration applies when neither the task, the policy, the
// capability nor the Callee sets a max duration.
const DefaultMaxDuration = time.Hour

// identify returns the caller id of the broker-validated user_id of a
// command: the role must be caller and the vhost this sidecar's. A message
// without a valid user_id cannot be answered (there is no trustworthy reply
// address) and is discarded.
func identify(userID, vhost string) (string, error) {
	if userID == "" {
		return "", fmt.Errorf("the message has no user_id property: its sender is unauthenticated")
	}
	role, vh, id, err := topology.ParseUsername(userID)
	if err != nil {
		return "", fmt.Errorf("user_id %q is not an HCP broker user: %w", truncate(userID, 80), err)
	}
	if role != topology.RoleCaller {
		return "", fmt.Errorf("user_id %q is a %s, not a caller", truncate(userID, 80), role)
	}
	if vh != vhost {
		return "", fmt.Errorf("user_id %q belongs to vhost %q, not %q", truncate(userID, 80), vh, vhost)
	}
	return id, nil
}

// decodeSubmit decodes and validates a task_submit payload.
func decodeSubmit(payload []byte) (*task.TaskSubmit, error) {
	var ts task.TaskSubmit
	if err := json.Unmarshal(payload, &ts); err != nil {
		return nil, fmt.Errorf("invalid task_submit payload: %w", err)
	}
	if err := ts.Validate(); err != nil {
		return nil, err
	}
	if _, err := requestedRisk(&ts); err != nil {
		return nil, err
	}
	return &ts, nil
}

// requestedRisk is the risk the task itself declares, metadata.risk_level
// (optional): a caller that knows its inputs make the task riskier than the
// capability's base level says so, and the assessment is never below it.
func requestedRisk(ts *task.TaskSubmit) (task.RiskLevel, error) {
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

// gateInput is what the L3 gate decides on, read from the informers; the
// gate itself does no I/O.
type gateInput struct {
	Now time.Time
	// Callee is this sidecar's Callee object.
	Callee *v1alpha1.Callee
	// CallerID is the authenticated caller (from user_id).
	CallerID string
	// Caller describes the caller for policy selectors.
	Caller policy.Caller
	// Policies are the CapabilityPolicies of the namespace.
	Policies []v1alpha1.CapabilityPolicy
	// Active counts non-terminal sessions.
	Active policy.Active
	Task   *task.TaskSubmit
}

// verdict is the gate's decision.
type verdict struct {
	Admitted bool
	Reason   task.ReasonCode
	Message  string
	// Risk is the assessed risk (empty when rejected before assessment).
	Risk task.RiskLevel
	// MaxDuration of the admitted session.
	MaxDuration time.Duration
	// DataClass is the class the task was judged by: its own
	// constraints.data_classification, or, when it has none, the
	// capability's (empty when rejected before the capability was found).
	DataClass task.DataClass
}

func reject(reason task.ReasonCode, format string, args ...any) verdict {
	return verdict{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// decide runs the L3 gate steps after identity parsing, expiry and
// deduplication, in the order of DESIGN.md section 4: caller identity
// matches caller_id → callee_id matches → capability exists → risk
// assessment → data class within the capability's → CapabilityPolicy →
// within the task's own max_risk_level. It assumes ts passed Validate.
func decide(in gateInput) verdict {
	ts := in.Task
	if ts.CallerID != in.CallerID {
		return reject(task.ReasonNotAuthorized, "caller_id %q does not match the authenticated sender %q (AMQP user_id)", ts.CallerID, in.CallerID)
	}
	calleeID := in.Callee.ID()
	if ts.CalleeID != calleeID {
		return reject(task.ReasonMalformed, "callee_id %q does not match this callee %q", ts.CalleeID, calleeID)
	}
	var capability *v1alpha1.Capability
	for i := range in.Callee.Spec.Capabilities {
		if in.Callee.Spec.Capabilities[i].Name == ts.Capability {
			capability = &in.Callee.Spec.Capabilities[i]
			break
		}
	}
	if capability == nil {
		return reject(task.ReasonUnknownCapability, "callee %q offers no capability %q", calleeID, ts.Capability)
	}

	// Risk: at least the capability's base level, never below what the task
	// itself declares.
	requested, _ := requestedRisk(ts) // validated by decodeSubmit
	risk := task.MaxRiskLevel(task.RiskLevel(capability.RiskLevel), requested)

	// A task that does not say how sensitive its data is (the spec makes
	// constraints.data_classification optional) is judged as the most
	// sensitive data the capability may handle: a policy must admit that
	// class, so leaving it out never widens what a caller may do.
	class, implied := ts.Constraints.DataClassification, ""
	if class == "" {
		class = task.DataClass(capability.DataClassification)
		implied = fmt.Sprintf(" (the task has no constraints.data_classification; it is judged as %s, the class of capability %q)", class, capability.Name)
	}
	if task.DataClass(capability.DataClassification).Less(class) {
		v := reject(task.ReasonDataClassExceedsPolicy, "data classification %s exceeds %s, the most sensitive class capability %q may handle", class, capability.DataClassification, capability.Name)
		v.Risk, v.DataClass = risk, class
		return v
	}

	d := policy.Decide(in.Callee, in.Caller, in.Policies, policy.Task{
		Capability: ts.Capability,
		Risk:       v1alpha1.RiskLevel(risk),
		DataClass:  v1alpha1.DataClass(class),
		Duration:   ts.Constraints.MaxDuration.Std(),
	}, in.Active)
	if !d.Admitted {
		msg := d.Message
		if d.Reason == task.ReasonDataClassExceedsPolicy {
			msg += implied
		}
		return verdict{Reason: d.Reason, Message: msg, Risk: task.RiskLevel(d.Risk), DataClass: class}
	}
	risk = task.RiskLevel(d.Risk)

	if ceiling := ts.Constraints.MaxRiskLevel; ceiling != "" && ceiling.Less(risk) {
		return verdict{Reason: task.ReasonRiskExceedsPolicy, Risk: risk, DataClass: class,
			Message: fmt.Sprintf("assessed risk %s exceeds the task's own constraints.max_risk_level %s", risk, ceiling)}
	}

	maxDur := ts.Constraints.MaxDuration.Std()
	if maxDur <= 0 {
		maxDur = d.Limits.MaxDuration
	}
	if maxDur <= 0 {
		maxDur = defaultMaxDuration(in.Callee)
	}
	if dl := ts.Constraints.Deadline; dl != nil {
		if left := dl.Sub(in.Now); left < maxDur {
			maxDur = left
		}
	}
	// The session token carries whole seconds: a session shorter than one
	// second cannot be issued a token that is valid at all.
	if maxDur < time.Second {
		return verdict{Reason: task.ReasonExpired, Risk: risk, DataClass: class,
			Message: fmt.Sprintf("constraints.deadline leaves %s, less than the one second a session needs", maxDur)}
	}
	return verdict{Admitted: true, Risk: risk, MaxDuration: maxDur, Message: d.Message, DataClass: class}
}

func defaultMaxDuration(c *v1alpha1.Callee) time.Duration {
	if s := c.Spec.Sessions.DefaultMaxDuration; s != "" {
		if d, err := task.ParseDuration(string(s)); err == nil && d > 0 {
			return d
		}
	}
	return DefaultMaxDuration
}

func calleeDuration(s v1alpha1.ISO8601Duration, def time.Duration) time.Duration {
	if s != "" {
		if d, err := task.ParseDuration(string(s)); err == nil && d > 0 {
			return d
		}
	}
	return def
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Do not cut a UTF-8 sequence in half.
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// oneLine makes an error message fit a log line and a status field.
func oneLine(s string, n int) string {
	return truncate(strings.Join(strings.Fields(s), " "), n)
}
