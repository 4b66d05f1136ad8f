package v1alpha1_test

import (
	"os"
	"strings"
	"testing"

	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// The CRD markers repeat the protocol's patterns literally (this package
// imports core Kubernetes types only); this test keeps them from drifting.
func TestMarkersUseProtocolPatterns(t *testing.T) {
	for file, patterns := range map[string][]string{
		"callee_types.go":           {topology.IDPattern, task.CapabilityPattern},
		"caller_types.go":           {topology.IDPattern},
		"hcpsession_types.go":       {topology.IDPattern},
		"capabilitypolicy_types.go": {strings.TrimSuffix(strings.TrimPrefix(topology.IDPattern, "^"), "$")},
	} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range patterns {
			if !strings.Contains(string(src), p) {
				t.Errorf("%s does not use the protocol pattern %s", file, p)
			}
		}
	}
}
