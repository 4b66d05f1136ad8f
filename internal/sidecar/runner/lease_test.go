package runner

import (
	"testing"
	"time"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/lease"
)

func TestOwnerLeaseDuration(t *testing.T) {
	for _, tc := range []struct {
		in      hcpv1alpha1.ISO8601Duration
		want    time.Duration
		problem bool
	}{
		{"", lease.DefaultDuration, false},
		{"PT2M", 2 * time.Minute, false},
		{"PT15S", 15 * time.Second, false},
		{"PT5S", minLeaseDuration, true},
		{"P1M", lease.DefaultDuration, true},
	} {
		got, problem := ownerLeaseDuration(tc.in)
		if got != tc.want || (problem != "") != tc.problem {
			t.Errorf("ownerLeaseDuration(%q) = %s, %q; want %s, a problem: %v", tc.in, got, problem, tc.want, tc.problem)
		}
	}
}
