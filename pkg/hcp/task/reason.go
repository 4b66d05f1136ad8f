package task

// ReasonCode is the machine-readable reason carried by task_rejected.
type ReasonCode string

// Rejection reason codes (DESIGN.md section 4).
const (
	// ReasonMalformed: the envelope or payload failed validation.
	ReasonMalformed ReasonCode = "malformed"
	// ReasonExpired: expires_at (or the deadline) had passed on arrival.
	ReasonExpired ReasonCode = "expired"
	// ReasonNotAuthorized: the authenticated caller does not match caller_id,
	// or no policy rule admits this caller for this capability.
	ReasonNotAuthorized ReasonCode = "not_authorized"
	// ReasonUnknownCapability: the callee declares no such capability.
	ReasonUnknownCapability ReasonCode = "unknown_capability"
	// ReasonRiskExceedsPolicy: the assessed risk is above what the policy or
	// the caller's own max_risk_level allows.
	ReasonRiskExceedsPolicy ReasonCode = "risk_exceeds_policy"
	// ReasonDataClassExceedsPolicy: the data classification is not allowed by
	// the policy or the capability.
	ReasonDataClassExceedsPolicy ReasonCode = "data_class_exceeds_policy"
	// ReasonDurationExceedsPolicy: max_duration is above the policy's limit.
	ReasonDurationExceedsPolicy ReasonCode = "duration_exceeds_policy"
	// ReasonConcurrencyLimit: the policy's maxConcurrentSessions is reached.
	ReasonConcurrencyLimit ReasonCode = "concurrency_limit"
	// ReasonHarnessUnavailable: the harness could not take the task.
	ReasonHarnessUnavailable ReasonCode = "harness_unavailable"
	// ReasonInternal: the callee failed for a reason not listed above.
	ReasonInternal ReasonCode = "internal"
)

// ReasonCodes returns every defined reason code.
func ReasonCodes() []ReasonCode {
	return []ReasonCode{
		ReasonMalformed, ReasonExpired, ReasonNotAuthorized, ReasonUnknownCapability,
		ReasonRiskExceedsPolicy, ReasonDataClassExceedsPolicy, ReasonDurationExceedsPolicy,
		ReasonConcurrencyLimit, ReasonHarnessUnavailable, ReasonInternal,
	}
}

// Valid reports whether r is one of the defined reason codes.
func (r ReasonCode) Valid() bool {
	switch r {
	case ReasonMalformed, ReasonExpired, ReasonNotAuthorized, ReasonUnknownCapability,
		ReasonRiskExceedsPolicy, ReasonDataClassExceedsPolicy, ReasonDurationExceedsPolicy,
		ReasonConcurrencyLimit, ReasonHarnessUnavailable, ReasonInternal:
		return true
	}
	return false
}
