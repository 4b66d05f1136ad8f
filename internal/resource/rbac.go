package resource

import (
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// resourceSessions is the HCPSession resource in RBAC rules.
const resourceSessions = "hcpsessions"

// ServiceAccount is the harness pods' identity.
func ServiceAccount(s Subject) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: s.meta(s.BaseName())}
}

// RoleRules are exactly what the sidecar needs, in its namespace only.
//
// Callee sidecar: HCPSessions are its read model and dedup store (create on
// task_submit, status as events flow, delete of its own rejected
// duplicates), so full access to them; its own Callee (capabilities,
// session settings); CapabilityPolicies (the L3 gate) and Callers (rule
// caller selectors); Pods (get: a session whose pod is gone is closed as
// FAILED rather than left RUNNING); Events.
//
// Caller sidecar: reads HCPSessions (GET /hcp/v1/sessions/{id}) and writes
// their status's callerAckedSequence; its own Caller; Events.
func RoleRules(s Subject) []rbacv1.PolicyRule {
	group := hcpv1alpha1.GroupVersion.Group
	const get, list, watch, create, update, patch, del = "get", "list", "watch", "create", "update", "patch", "delete"
	var (
		read      = []string{get, list, watch}
		all       = []string{get, list, watch, create, update, patch, del}
		subStatus = []string{get, update, patch}
		record    = []string{create, patch}
	)
	events := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: record},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: record},
	}
	if s.Role == topology.RoleCallee {
		return append([]rbacv1.PolicyRule{
			{APIGroups: []string{group}, Resources: []string{resourceSessions}, Verbs: all},
			{APIGroups: []string{group}, Resources: []string{"hcpsessions/status"}, Verbs: subStatus},
			{APIGroups: []string{group}, Resources: []string{"callees"}, ResourceNames: []string{s.Name}, Verbs: read},
			{APIGroups: []string{group}, Resources: []string{"capabilitypolicies"}, Verbs: read},
			{APIGroups: []string{group}, Resources: []string{"callers"}, Verbs: read},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{get}},
			// The Lease of each sidecar (hcp-sidecar-<pod>) vouches for
			// its ownership of sessions; others read it before a takeover.
			// RBAC cannot name it in advance (pods come and go): the
			// admission policy callee-sidecar-objects (config/admission)
			// lets a sidecar write only its own pod's Lease.
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{get, "create", "update"}},
			// Session checkpoints (hcp-session-<id>), owned by their
			// HCPSession. ConfigMaps, not Secrets: see
			// internal/sidecar/checkpoint. The same policy confines writes
			// to ConfigMaps hcp-session-* labelled with the sidecar's own
			// Callee; the sidecar verifies each record's signature before
			// resuming from it.
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{get, "create", "update"}},
		}, events...)
	}
	return append([]rbacv1.PolicyRule{
		{APIGroups: []string{group}, Resources: []string{resourceSessions}, Verbs: read},
		{APIGroups: []string{group}, Resources: []string{"hcpsessions/status"}, Verbs: subStatus},
		{APIGroups: []string{group}, Resources: []string{"callers"}, ResourceNames: []string{s.Name}, Verbs: read},
		// /drain checks that the sidecar's own pod is being deleted.
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{get}},
	}, events...)
}

// Role grants RoleRules in the subject's namespace.
func Role(s Subject) *rbacv1.Role {
	return &rbacv1.Role{ObjectMeta: s.meta(s.BaseName()), Rules: RoleRules(s)}
}

// RoleBinding binds Role to ServiceAccount.
func RoleBinding(s Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: s.meta(s.BaseName()),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: s.BaseName()},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: s.BaseName(), Namespace: s.Namespace}},
	}
}
