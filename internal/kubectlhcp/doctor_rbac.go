package kubectlhcp

import (
	"context"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/internal/resource"
)

const checkCalleeSidecarRole = "callee sidecar role"

// calleeSidecarRole checks the ClusterRole each operator binds its callee
// sidecars to (the manager's --callee-sidecar-cluster-role, or its
// default) in deps, the operators' Deployments: without it, or without
// one of its rules, callee sidecars are refused what they need. Nothing to
// check when no operator Deployment is found (the operator check says so).
func (d *doctor) calleeSidecarRole(ctx context.Context, deps []appsv1.Deployment) []Check {
	var names []string
	for _, dep := range deps {
		name := resource.DefaultCalleeSidecarClusterRole
		for _, c := range dep.Spec.Template.Spec.Containers {
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--callee-sidecar-cluster-role="); ok {
					name = v
				}
			}
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	var out []Check
	want := resource.CalleeSidecarClusterRole("").Rules
	for _, name := range names {
		role := &rbacv1.ClusterRole{}
		switch err := d.c.Get(ctx, client.ObjectKey{Name: name}, role); {
		case apierrors.IsNotFound(err):
			out = append(out, Check{Name: checkCalleeSidecarRole, Status: CheckFail,
				Detail: "ClusterRole " + name + " not found: callee sidecars have no rights (docs/rbac.md)",
				Fix:    "install it with the operator: helm upgrade, or kubectl apply -k config/default"})
		case err != nil:
			out = append(out, Check{Name: checkCalleeSidecarRole, Status: CheckWarn, Detail: "cannot read ClusterRole " + name + ": " + oneLine(err.Error(), 150)})
		default:
			var missing []string
			for _, r := range want {
				if !slices.ContainsFunc(role.Rules, func(l rbacv1.PolicyRule) bool { return equality.Semantic.DeepEqual(l, r) }) {
					missing = append(missing, strings.Join(r.Resources, ",")+": "+strings.Join(r.Verbs, ","))
				}
			}
			if len(missing) > 0 {
				out = append(out, Check{Name: checkCalleeSidecarRole, Status: CheckFail,
					Detail: "ClusterRole " + name + " lacks rules the callee sidecars need: " + strings.Join(missing, "; "),
					Fix:    "reinstall it with this version of the operator: helm upgrade, or kubectl apply -k config/default"})
				continue
			}
			out = append(out, Check{Name: checkCalleeSidecarRole, Status: CheckOK, Detail: "ClusterRole " + name + " grants what callee sidecars need"})
		}
	}
	return out
}
