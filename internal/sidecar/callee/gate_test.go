package callee

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

func TestIdentify(t *testing.T) {
	for _, tc := range []struct {
		userID, want, wantErr string
	}{
		{"caller.alpha@/hcp", "alpha", ""},
		{"", "", "no user_id"},
		{"guest", "", "not an HCP broker user"},
		{"callee.lab@/hcp", "", "not a caller"},
		{"caller.alpha@/other", "", "vhost"},
		{"caller.Alpha@/hcp", "", "not an HCP broker user"},
	} {
		got, err := identify(tc.userID, "/hcp")
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("identify(%q) error = %v, want containing %q", tc.userID, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("identify(%q) = %q, %v; want %q", tc.userID, got, err, tc.want)
		}
	}
}

func TestDecodeSubmitRejectsBadDeclaredRisk(t *testing.T) {
	b, _ := json.Marshal(&task.TaskSubmit{
		CallerID: "alpha", CalleeID: "lab", Capability: "analyze", Intent: "do it",
		Inputs: json.RawMessage(`{}`), Metadata: json.RawMessage(`{"risk_level":"R9"}`),
	})
	if _, err := decodeSubmit(b); err == nil || !strings.Contains(err.Error(), "metadata.risk_level") {
		t.Fatalf("decodeSubmit = %v, want a metadata.risk_level error", err)
	}
}

func TestDerivedIDIsStableUUIDv4(t *testing.T) {
	a, b := derivedID("reply", "s1"), derivedID("reply", "s1")
	if a != b || !envelope.IsUUIDv4(a) || a == derivedID("reply", "s2") {
		t.Fatalf("derivedID: %s %s", a, b)
	}
}
