package resource

import (
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// A caller sidecar's read of HCPSessions in another namespace: a Role and
// a RoleBinding in the Callee's namespace, one pair per (Caller, namespace).
// The sidecar of a new pod verifies a session it has no record of by
// reading its HCPSession, which lives in the Callee's namespace (stream
// seed, internal/sidecar/caller). The operator decides the namespaces
// (internal/controller, caller_grants.go).
//
// The Role grants get, not list or watch, and patch of the status, where
// the sidecar records its position (status.callerAckedSequence: a new pod
// resumes from it). Admission narrows that write (config/admission,
// policy 1) to callerAckedSequence of the sessions of the caller id the
// Role names in CallerPositionsResource: RBAC cannot tell one session
// from another, and a session's caller id is immutable.
//
// The Role grants get, not list or watch. The sidecar knows the name it
// reads (the session id), and an HCPSession carries the caller, the
// capability and the task's intent: list would show a caller every
// session of the namespace, other tenants' callers' included. get hands
// out only what a caller can name, and a session id is derived from the
// task's message id, which only its caller knows.
//
// A Role's owner must be in its namespace: these carry no owner reference.
// Their labels name the Caller (LabelCaller, LabelCallerNamespace), which
// is how the operator finds them to update or delete them, and how a
// platform team audits them:
//
//	kubectl get roles,rolebindings -A -l hcp.io/caller-namespace=NS,hcp.io/caller=NAME

// SessionReaderName is the name of s's Role and RoleBinding in another
// namespace: hcp-sessions.{namespace}.{name}. The dots keep it apart from
// any BaseName there (a Caller's or Callee's names come after "hcp-caller-"
// or "hcp-callee-"), and the namespace tells two Callers of one name apart.
func SessionReaderName(s Subject) string {
	return truncateName("hcp-sessions."+s.Namespace+"."+s.Name, maxNameLength)
}

// SessionReaderLabels are the labels of s's objects in other namespaces.
func SessionReaderLabels(s Subject) map[string]string {
	l := s.Labels()
	l[hcpv1alpha1.LabelCallerNamespace] = s.Namespace
	return l
}

// CallerPositionsResource is the resource of no API that a Role names to
// let a caller sidecar record its position in the HCPSessions of one
// caller id in the Role's namespace (resourceNames: the id; verb
// CallerPositionsVerb). The admission policy asks the authorizer about it;
// the API server serves nothing of that name.
const CallerPositionsResource = "callerpositions"

// CallerPositionsVerb is the verb of CallerPositionsResource.
const CallerPositionsVerb = "record"

// SessionReaderRules: get HCPSessions, patch their status, and record
// positions in the sessions of caller id callerID; nothing else.
func SessionReaderRules(callerID string) []rbacv1.PolicyRule {
	group := hcpv1alpha1.GroupVersion.Group
	return []rbacv1.PolicyRule{
		{APIGroups: []string{group}, Resources: []string{resourceSessions}, Verbs: []string{verbGet}},
		{APIGroups: []string{group}, Resources: []string{resourceSessions + "/status"}, Verbs: []string{verbPatch}},
		{APIGroups: []string{group}, Resources: []string{CallerPositionsResource}, ResourceNames: []string{callerID}, Verbs: []string{CallerPositionsVerb}},
	}
}

// SessionReaderRole is s's Role in namespace ns.
func SessionReaderRole(s Subject, ns string) *rbacv1.Role {
	return &rbacv1.Role{ObjectMeta: sessionReaderMeta(s, ns), Rules: SessionReaderRules(s.ID)}
}

// SessionReaderRoleBinding binds SessionReaderRole in ns to s's sidecar
// ServiceAccount (in s's namespace).
func SessionReaderRoleBinding(s Subject, ns string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: sessionReaderMeta(s, ns),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: SessionReaderName(s)},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: s.BaseName(), Namespace: s.Namespace}},
	}
}

func sessionReaderMeta(s Subject, ns string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: SessionReaderName(s), Namespace: ns, Labels: SessionReaderLabels(s)}
}
