package controller

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// TestCallerSessionReadGrants: a Caller in namespace A whose id a
// CapabilityPolicy in namespace B names, for a Callee of B on its vhost,
// gets a Role and RoleBinding in B that let its sidecar get (not list)
// HCPSessions there, and status.sessionNamespaces says so; a Caller the
// policy does not name, and an external one it names, get nothing. When
// the policy stops naming it, the grant stays while a session of it
// remains in B, then goes; deleting the Caller deletes it.
func TestCallerSessionReadGrants(t *testing.T) {
	a, b := newNamespace(t, "grant-callers-"), newNamespace(t, "grant-callees-")
	dumpOnFailure(t, a)
	dumpOnFailure(t, b)
	vhost := testVhost(b)
	withHarness := func(id string) func(*hcpv1alpha1.Caller) { return callerWithHarness(vhost, id) }
	callee := newCallee(b, "lab", func(c *hcpv1alpha1.Callee) { c.Spec.Harness.Replicas = new(int32(0)) })
	named := newCaller(a, "named", withHarness("client"))
	stranger := newCaller(a, "stranger", withHarness("stranger"))
	external := newCaller(a, "external", func(c *hcpv1alpha1.Caller) { c.Spec.Broker.Vhost = vhost; c.Spec.CallerID = "ext" })
	pol := &hcpv1alpha1.CapabilityPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: "lab-users"},
		Spec: hcpv1alpha1.CapabilityPolicySpec{Rules: []hcpv1alpha1.PolicyRule{{
			Callers: hcpv1alpha1.CallerMatch{IDs: []string{"client", "ext"}}, Capabilities: []string{"cvd.run"}, MaxRiskLevel: hcpv1alpha1.RiskR2,
		}}},
	}
	create(t, callee, named, stranger, external, pol)
	for _, o := range []client.Object{callee, named, stranger, external} {
		claimedKey(t, o)
	}

	sub := resource.ForCaller(named)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: resource.SessionReaderName(sub)}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: resource.SessionReaderName(sub)}}
	eventually(t, "the named Caller may get HCPSessions in the Callee's namespace", all(
		exists(role, nil), exists(binding, nil), sessionNamespaces(named, b)))
	if want := resource.SessionReaderRules(sub.ID); !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("Role rules %+v, want %+v", role.Rules, want)
	}
	if want := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "hcp-caller-named", Namespace: a}}; !reflect.DeepEqual(binding.Subjects, want) ||
		binding.RoleRef.Name != role.Name {
		t.Errorf("RoleBinding subjects %+v role %s, want %+v role %s", binding.Subjects, binding.RoleRef.Name, want, role.Name)
	}
	// What the grant allows: get by name, nothing wider.
	sa := callerSA(t, a, "hcp-caller-named")
	if err := sa.Get(t.Context(), key(b, uuid.NewString()), &hcpv1alpha1.HCPSession{}); !apierrors.IsNotFound(err) {
		t.Errorf("get of an HCPSession in %s as the named caller's sidecar: %v, want NotFound (allowed)", b, err)
	}
	if err := sa.List(t.Context(), &hcpv1alpha1.HCPSessionList{}, client.InNamespace(b)); !apierrors.IsForbidden(err) {
		t.Errorf("list of HCPSessions in %s as the named caller's sidecar: %v, want Forbidden", b, err)
	}
	for _, c := range []*hcpv1alpha1.Caller{stranger, external} {
		s := resource.ForCaller(c)
		for _, o := range []client.Object{
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: resource.SessionReaderName(s)}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: resource.SessionReaderName(s)}},
		} {
			if err := gone(o)(t.Context()); err != nil {
				t.Errorf("Caller %s: %v", c.Name, err)
			}
		}
		if err := sessionNamespaces(c)(t.Context()); err != nil {
			t.Errorf("Caller %s: %v", c.Name, err)
		}
	}
	if err := callerSA(t, a, "hcp-caller-stranger").Get(t.Context(), key(b, uuid.NewString()), &hcpv1alpha1.HCPSession{}); !apierrors.IsForbidden(err) {
		t.Errorf("get of an HCPSession in %s as a caller the policy does not name: %v, want Forbidden", b, err)
	}

	// The policy stops naming it while a session of it remains: kept
	// until the session is gone.
	session := &hcpv1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: uuid.NewString(), Labels: map[string]string{
			hcpv1alpha1.LabelCalleeID: "lab", hcpv1alpha1.LabelCallerID: "client"}},
		Spec: hcpv1alpha1.HCPSessionSpec{CalleeID: "lab", CallerID: "client", Capability: "cvd.run", TaskMessageID: uuid.NewString(), RiskLevel: hcpv1alpha1.RiskR2},
	}
	session.Spec.SessionID = session.Name
	create(t, session)
	update(t, pol, func(p *hcpv1alpha1.CapabilityPolicy) { p.Spec.Rules[0].Callers.IDs = []string{"ext", "stranger"} })
	// The same change maps to both Callers: once the stranger's grant is
	// there, the named one's stays.
	eventually(t, "the stranger named", sessionNamespaces(stranger, b))
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if err := all(exists(role, nil), exists(binding, nil), sessionNamespaces(named, b))(t.Context()); err != nil {
			t.Fatalf("with a session of the caller left in %s: %v", b, err)
		}
	}
	if err := k8sClient.Delete(t.Context(), session); err != nil {
		t.Fatal(err)
	}
	update(t, named, func(c *hcpv1alpha1.Caller) { c.Annotations = map[string]string{"touch": "2"} })
	eventually(t, "the grant gone with the caller's last session", all(gone(role), gone(binding), sessionNamespaces(named)))

	// Named again, then deleted: the grant goes with the Caller.
	update(t, pol, func(p *hcpv1alpha1.CapabilityPolicy) { p.Spec.Rules[0].Callers.IDs = []string{"*"} })
	eventually(t, `named again (by "*")`, all(exists(role, nil), exists(binding, nil), sessionNamespaces(named, b)))
	if err := k8sClient.Delete(t.Context(), named); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the grant gone with the Caller", all(gone(role), gone(binding)))
	if err := sessionNamespaces(stranger, b)(t.Context()); err != nil {
		t.Errorf("another Caller's grant went too: %v", err)
	}
}

// sessionNamespaces checks a Caller's status.sessionNamespaces.
func sessionNamespaces(c *hcpv1alpha1.Caller, want ...string) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(c), c); err != nil {
			return err
		}
		if got := c.Status.SessionNamespaces; !slices.Equal(got, want) {
			return fmt.Errorf("Caller %s: status.sessionNamespaces %v, want %v", c.Name, got, want)
		}
		return nil
	}
}

// callerSA is a client acting as a caller sidecar's ServiceAccount.
func callerSA(t *testing.T, ns, sa string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(testEnv.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	c, err := client.New(cfg, client.Options{Scheme: testEnv.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// callerWithHarness makes a Caller one of caller id id on vhost, with a
// harness scaled to zero (so that it gets a sidecar's grants).
func callerWithHarness(vhost, id string) func(*hcpv1alpha1.Caller) {
	return func(c *hcpv1alpha1.Caller) {
		c.Spec.Broker.Vhost = vhost
		c.Spec.CallerID = id
		c.Spec.Harness = &hcpv1alpha1.HarnessSpec{Template: harnessTemplate("example.com/app:1"), Replicas: new(int32(0))}
	}
}
