package resource

import (
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// resourceSessions is the HCPSession resource in RBAC rules.
const resourceSessions = "hcpsessions"

// The verbs of the sidecars' rules.
const (
	verbGet, verbList, verbWatch      = "get", "list", "watch"
	verbCreate, verbUpdate, verbPatch = "create", "update", "patch"
)

// ServiceAccount is the harness pods' identity.
func ServiceAccount(s Subject) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: s.meta(s.BaseName())}
}

// DefaultCalleeSidecarClusterRole is the ClusterRole every callee
// sidecar's RoleBinding grants, as the install names it without a prefix
// (the manager's --callee-sidecar-cluster-role; config/rbac,
// charts/hcp-operator/templates/sidecar-rbac.yaml).
const DefaultCalleeSidecarClusterRole = "hcp-operator-callee-sidecar"

// RoleRules are exactly what the sidecar needs, in its namespace only.
//
// Callee sidecar: HCPSessions are its read model and dedup store (create on
// task_submit, status as events flow, delete of its own rejected
// duplicates), so full access to them; Callees (its own: capabilities,
// session settings), CapabilityPolicies (the L3 gate) and Callers (rule
// caller selectors); Pods (get: a session whose pod is gone is closed as
// FAILED rather than left RUNNING); Events. The same for every callee
// sidecar, so one ClusterRole (CalleeSidecarClusterRole) holds them and
// each Callee's RoleBinding grants it in the Callee's namespace: no Role
// per Callee to write. A callee sidecar can therefore read the other
// Callees of its namespace, as it reads its Callers; admission, not RBAC,
// confines its writes to its own (config/admission).
//
// Caller sidecar: reads HCPSessions (GET /hcp/v1/sessions/{id}) and writes
// their status's callerAckedSequence; its own Caller; Events. Its Role
// names that Caller alone (resourceNames): the admission policy
// caller-sidecar-sessions identifies a caller sidecar's own Caller as
// the one Caller it may read, so callers keep a Role each.
func RoleRules(s Subject) []rbacv1.PolicyRule {
	if s.Role == topology.RoleCallee {
		return calleeSidecarRules()
	}
	group := hcpv1alpha1.GroupVersion.Group
	return append([]rbacv1.PolicyRule{
		{APIGroups: []string{group}, Resources: []string{resourceSessions}, Verbs: []string{verbGet, verbList, verbWatch}},
		{APIGroups: []string{group}, Resources: []string{"hcpsessions/status"}, Verbs: []string{verbGet, verbUpdate, verbPatch}},
		{APIGroups: []string{group}, Resources: []string{"callers"}, ResourceNames: []string{s.Name}, Verbs: []string{verbGet, verbList, verbWatch}},
		// /drain checks that the sidecar's own pod is being deleted.
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{verbGet}},
	}, eventRules()...)
}

func eventRules() []rbacv1.PolicyRule {
	record := []string{verbCreate, verbPatch}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: record},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: record},
	}
}

func calleeSidecarRules() []rbacv1.PolicyRule {
	group := hcpv1alpha1.GroupVersion.Group
	return append([]rbacv1.PolicyRule{
		{APIGroups: []string{group}, Resources: []string{resourceSessions}, Verbs: []string{verbGet, verbList, verbWatch, verbCreate, verbUpdate, verbPatch, "delete"}},
		{APIGroups: []string{group}, Resources: []string{"hcpsessions/status"}, Verbs: []string{verbGet, verbUpdate, verbPatch}},
		{APIGroups: []string{group}, Resources: []string{"callees", "callers", "capabilitypolicies"}, Verbs: []string{verbGet, verbList, verbWatch}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{verbGet}},
		// The Lease of each sidecar (hcp-sidecar-<pod>) vouches for
		// its ownership of sessions; others read it before a takeover.
		// RBAC cannot name it in advance (pods come and go): the
		// admission policy callee-sidecar-objects (config/admission)
		// lets a sidecar write only its own pod's Lease.
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{verbGet, verbCreate, verbUpdate}},
		// Session checkpoints (hcp-session-<id>), owned by their
		// HCPSession. ConfigMaps, not Secrets: see
		// internal/sidecar/checkpoint. The same policy confines writes
		// to ConfigMaps hcp-session-* labelled with the sidecar's own
		// Callee; the sidecar verifies each record's signature before
		// resuming from it.
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{verbGet, verbCreate, verbUpdate}},
	}, eventRules()...)
}

// CalleeSidecarClusterRole holds RoleRules of every callee sidecar, under
// name. The install ships it (hack/sidecarrbac writes config/rbac's and
// the chart's copies from it).
func CalleeSidecarClusterRole(name string) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      calleeSidecarRules(),
	}
}

// Role grants a caller sidecar RoleRules in the subject's namespace; nil
// for a callee (CalleeSidecarClusterRole).
func Role(s Subject) *rbacv1.Role {
	if s.Role == topology.RoleCallee {
		return nil
	}
	return &rbacv1.Role{ObjectMeta: s.meta(s.BaseName()), Rules: RoleRules(s)}
}

// RoleBinding binds a caller's Role to its ServiceAccount; nil for a
// callee (CalleeRoleBinding).
func RoleBinding(s Subject) *rbacv1.RoleBinding {
	if s.Role == topology.RoleCallee {
		return nil
	}
	return &rbacv1.RoleBinding{
		ObjectMeta: s.meta(s.BaseName()),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: s.BaseName()},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: s.BaseName(), Namespace: s.Namespace}},
	}
}

// CalleeRoleBinding grants a callee's ServiceAccount the ClusterRole
// clusterRole (CalleeSidecarClusterRole) in its namespace; nil for a
// caller. Its name is not the Role's of old (roleRef cannot change): the
// operator creates it before it deletes a Callee's Role and RoleBinding
// from before, so the sidecar never goes without its rights.
func CalleeRoleBinding(s Subject, clusterRole string) *rbacv1.RoleBinding {
	if s.Role != topology.RoleCallee {
		return nil
	}
	return &rbacv1.RoleBinding{
		ObjectMeta: s.meta(s.SidecarRoleBindingName()),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: s.BaseName(), Namespace: s.Namespace}},
	}
}
