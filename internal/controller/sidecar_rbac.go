package controller

import (
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// The manager grants the sidecars their rights (internal/resource.RoleRules:
// a Role per Caller, a RoleBinding per Callee to the callee sidecars'
// ClusterRole); Kubernetes lets it grant only what it holds itself.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create;update

// explainMissingRole says what to do when the API server refused a callee's
// RoleBinding because the callee sidecars' ClusterRole does not exist (it
// reports that as a RoleBinding not found). The error stays a retried one:
// nothing watches ClusterRoles, and the next retry finds the role once it
// is installed.
func explainMissingRole(err error, clusterRole string) error {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || !apierrors.IsNotFound(err) {
		return err
	}
	if d := status.Status().Details; d == nil || d.Name != clusterRole {
		return err
	}
	return fmt.Errorf("the ClusterRole %s, which grants every callee sidecar its rights, does not exist: install it with the operator "+
		"(the Helm chart, or kubectl apply -k config/default), or name the installed one with --callee-sidecar-cluster-role: %w", clusterRole, err)
}
