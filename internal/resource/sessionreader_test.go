package resource

import (
	"reflect"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/validate/content"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestSessionReader: the Role grants get on HCPSessions, patch of their
// status and the caller id's positions only, in the Callee's namespace, to the caller sidecar's ServiceAccount; the objects
// carry no owner reference (the Caller is in another namespace) and labels
// that name the Caller; names are valid, bounded, and apart from every
// BaseName and from a namesake Caller of another namespace.
func TestSessionReader(t *testing.T) {
	s := Subject{Role: topology.RoleCaller, Name: "agent", Namespace: "team-a", UID: "u1", ID: "agent"}
	role, binding := SessionReaderRole(s, "lab"), SessionReaderRoleBinding(s, "lab")
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{"hcp.io"}, Resources: []string{"hcpsessions"}, Verbs: []string{"get"}},
		{APIGroups: []string{"hcp.io"}, Resources: []string{"hcpsessions/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"hcp.io"}, Resources: []string{"callerpositions"}, ResourceNames: []string{"agent"}, Verbs: []string{"record"}},
	}
	if !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("rules %+v, want %+v", role.Rules, want)
	}
	if role.Name != "hcp-sessions.team-a.agent" || binding.Name != role.Name || role.Namespace != "lab" || binding.Namespace != "lab" {
		t.Errorf("Role %s/%s, RoleBinding %s/%s", role.Namespace, role.Name, binding.Namespace, binding.Name)
	}
	if binding.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}) ||
		!reflect.DeepEqual(binding.Subjects, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "hcp-caller-agent", Namespace: "team-a"}}) {
		t.Errorf("RoleBinding %+v %+v", binding.RoleRef, binding.Subjects)
	}
	for _, m := range []map[string]string{role.Labels, binding.Labels} {
		if m[hcpv1alpha1.LabelCaller] != "agent" || m[hcpv1alpha1.LabelCallerNamespace] != "team-a" || m[hcpv1alpha1.LabelManagedBy] != hcpv1alpha1.ManagedByValue {
			t.Errorf("labels %v", m)
		}
	}
	if len(role.OwnerReferences)+len(binding.OwnerReferences) != 0 {
		t.Error("an object in another namespace than its owner's has an owner reference")
	}

	long := Subject{Role: topology.RoleCaller, Name: strings.Repeat("a.b", 80), Namespace: strings.Repeat("n", 63)}
	if n := SessionReaderName(long); len(n) > maxNameLength || len(content.IsPathSegmentName(n)) != 0 {
		t.Errorf("bad name %q (%d)", n, len(n))
	}
	other := s
	other.Namespace = "team-b"
	if SessionReaderName(other) == SessionReaderName(s) {
		t.Error("Callers of one name in two namespaces share a Role")
	}
	for _, peer := range []Subject{{Role: topology.RoleCaller, Name: "sessions.team-a.agent"}, {Role: topology.RoleCallee, Name: "sessions.team-a.agent"}} {
		if peer.BaseName() == SessionReaderName(s) {
			t.Errorf("%s's BaseName collides with the grant %s", peer.Kind(), peer.BaseName())
		}
	}
}
