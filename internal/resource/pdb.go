package resource

import (
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// PodDisruptionBudget is the harness pods' PodDisruptionBudget
// (spec.harness.podDisruptionBudget), named like the Deployment and
// selecting its pods.
func PodDisruptionBudget(s Subject, spec hcpv1alpha1.PodDisruptionBudgetSpec) *policyv1.PodDisruptionBudget {
	spec = *spec.DeepCopy()
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: s.meta(s.BaseName()),
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable:   spec.MinAvailable,
			MaxUnavailable: spec.MaxUnavailable,
			Selector:       &metav1.LabelSelector{MatchLabels: s.SelectorLabels()},
		},
	}
}
