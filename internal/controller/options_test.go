package controller

import (
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/hcp-io/hcp-operator/internal/resource"
)

// TestCacheOptionsDefaultBrokerNamespace: with watched namespaces and a
// default connection Secret elsewhere (the chart's watchNamespaces with
// defaultBroker.secret.create), Secrets are cached in both, through one
// ByObject entry: a second *corev1.Secret key would leave it to chance
// which of the two controller-runtime keeps, and the manager then failed
// half its starts with "unknown namespace for the cache".
func TestCacheOptionsDefaultBrokerNamespace(t *testing.T) {
	opts := CacheOptions(Options{WatchNamespaces: []string{"team-a"}, DefaultBroker: &resource.DefaultBroker{Namespace: "hcp-system", Name: "broker"}})
	var secretEntries int
	for obj, by := range opts.ByObject {
		if _, ok := obj.(*corev1.Secret); !ok {
			continue
		}
		secretEntries++
		if got := slices.Sorted(maps.Keys(by.Namespaces)); !slices.Equal(got, []string{"hcp-system", "team-a"}) {
			t.Errorf("Secrets cached in %v, want [hcp-system team-a]", got)
		}
		if by.Label == nil || by.Label.String() != resource.LabelTopologyOperator+"="+resource.TopologyOperatorLabelValue {
			t.Errorf("Secret label selector %v", by.Label)
		}
	}
	if secretEntries != 1 {
		t.Errorf("%d ByObject entries for Secrets, want 1", secretEntries)
	}
	if got := slices.Sorted(maps.Keys(opts.DefaultNamespaces)); !slices.Equal(got, []string{"team-a"}) {
		t.Errorf("DefaultNamespaces %v, want [team-a]", got)
	}
}
