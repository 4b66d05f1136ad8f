package policy

import (
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// A decision depends on the count of active sessions only where a
// concurrency limit exists: the Callee's spec.sessions.maxConcurrent or a
// rule's maxConcurrentSessions, in any policy of the namespace (whether it
// matches the task is the gate's business). Without one, Gate gives the
// same verdict whatever Active says, and the count need not be taken.
func TestCountsSessions(t *testing.T) {
	limited := testPolicy(v1alpha1.RiskR3, "")
	limited.Spec.Rules = append(limited.Spec.Rules, v1alpha1.PolicyRule{Name: "other", Capabilities: []string{"synthesize"}, MaxConcurrentSessions: new(int32(2))})
	capped := testCallee()
	capped.Spec.Sessions.MaxConcurrent = new(int32(1))
	for _, tc := range []struct {
		name     string
		callee   *v1alpha1.Callee
		policies []v1alpha1.CapabilityPolicy
		want     bool
	}{
		{"no limit anywhere", testCallee(), []v1alpha1.CapabilityPolicy{testPolicy(v1alpha1.RiskR3, "")}, false},
		{"no policy", testCallee(), nil, false},
		{"a rule's maxConcurrentSessions", testCallee(), []v1alpha1.CapabilityPolicy{testPolicy(v1alpha1.RiskR3, ""), limited}, true},
		{"the Callee's maxConcurrent", capped, nil, true},
	} {
		if got := CountsSessions(tc.callee, tc.policies); got != tc.want {
			t.Errorf("%s: CountsSessions = %v, want %v", tc.name, got, tc.want)
		}
	}

	// Where it says false, Active does not change the verdict.
	in := GateInput{Callee: testCallee(), Caller: UnknownCaller("alpha"), Policies: []v1alpha1.CapabilityPolicy{testPolicy(v1alpha1.RiskR3, "")},
		Task: submit(nil), Now: time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)}
	zero := Gate(in)
	in.Active = Active{CallerOnCallee: 1 << 20, Callee: 1 << 20}
	if full := Gate(in); full.Admitted != zero.Admitted || full.Reason != zero.Reason || full.Counted {
		t.Fatalf("without a limit, Gate with a huge count %+v differs from Gate with none %+v", full, zero)
	}
}
