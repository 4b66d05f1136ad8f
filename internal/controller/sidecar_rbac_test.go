package controller

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/internal/resource"
)

// TestCalleeRoleFromBeforeRetired: a Callee whose sidecar held a Role of
// its own (as every Callee did before the callee sidecars' ClusterRole)
// keeps its binding to that ClusterRole, and loses the Role and the
// RoleBinding it controls.
func TestCalleeRoleFromBeforeRetired(t *testing.T) {
	ns := newNamespace(t, "retire-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "old")
	create(t, callee)
	base, _, _ := childNames("callee", "old")
	declarePrerequisites(t, ns, base)
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base + "-sidecar"}}
	eventually(t, "the Callee's binding to the callee sidecars' ClusterRole", exists(binding, callee))

	// What the operator of before created: a Role and RoleBinding named
	// like the ServiceAccount, with the operator's labels, controlled by
	// the Callee.
	if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(callee), callee); err != nil {
		t.Fatal(err)
	}
	sub := resource.ForCallee(callee)
	owner := []metav1.OwnerReference{sub.OwnerReference()}
	oldRole := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base, Labels: sub.Labels(), OwnerReferences: owner},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"hcp.io"}, Resources: []string{"callees"}, ResourceNames: []string{"old"}, Verbs: []string{"get"}}}}
	oldBinding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base, Labels: sub.Labels(), OwnerReferences: owner},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: base},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: base, Namespace: ns}}}
	create(t, oldRole, oldBinding)
	eventually(t, "the Role and RoleBinding from before are deleted", all(gone(oldRole), gone(oldBinding)))
	if err := exists(binding, callee)(t.Context()); err != nil {
		t.Fatalf("the binding to the ClusterRole went with them: %v", err)
	}
	if binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != resource.DefaultCalleeSidecarClusterRole {
		t.Errorf("role binding %s refers to %+v", binding.Name, binding.RoleRef)
	}
}

// TestExplainMissingRole: the API server's answer when a RoleBinding names
// a ClusterRole that does not exist (a RoleBinding "not found" named after
// the ClusterRole: seen from a manager without the role installed) gets
// the fix; other errors pass unchanged.
func TestExplainMissingRole(t *testing.T) {
	rb := schema.GroupResource{Group: rbacv1.GroupName, Resource: "rolebindings"}
	missing := fmt.Errorf("RoleBinding ns/hcp-callee-a-sidecar: %w", apierrors.NewNotFound(rb, "hcp-operator-callee-sidecar"))
	got := explainMissingRole(missing, "hcp-operator-callee-sidecar")
	if !strings.Contains(got.Error(), "the ClusterRole hcp-operator-callee-sidecar, which grants every callee sidecar its rights, does not exist") ||
		!errors.Is(got, missing) {
		t.Errorf("missing role: %v", got)
	}
	for _, err := range []error{
		apierrors.NewNotFound(rb, "something-else"),
		apierrors.NewForbidden(rb, "hcp-operator-callee-sidecar", errors.New("no")),
		errors.New("plain"),
	} {
		if got := explainMissingRole(err, "hcp-operator-callee-sidecar"); got != err {
			t.Errorf("%v became %v", err, got)
		}
	}
}
