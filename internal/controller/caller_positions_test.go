package controller

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// TestCallerPositionInAnotherNamespace: Callers "named" (id client) and
// "stranger" in namespace A, a Callee and a CapabilityPolicy naming both in
// namespace B. With the grants the manager applies in B and the admission
// policies of config/admission, a caller sidecar records its position
// (status.callerAckedSequence) in its own caller id's sessions in B, and
// nothing else: not another caller's session's position (the stranger is
// granted B too: the policy, not RBAC, refuses it), not the state of its
// own session; a Caller B's policy does not name may not write there at all.
func TestCallerPositionInAnotherNamespace(t *testing.T) {
	a, b := newNamespace(t, "positions-callers-"), newNamespace(t, "positions-callees-")
	dumpOnFailure(t, a)
	dumpOnFailure(t, b)
	vhost := testVhost(b)
	withHarness := func(id string) func(*hcpv1alpha1.Caller) { return callerWithHarness(vhost, id) }
	callee := newCallee(b, "lab", func(c *hcpv1alpha1.Callee) { c.Spec.Harness.Replicas = new(int32(0)) })
	named, stranger, outsider := newCaller(a, "named", withHarness("client")), newCaller(a, "stranger", withHarness("stranger")),
		newCaller(a, "outsider", withHarness("outsider"))
	pol := &hcpv1alpha1.CapabilityPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: "lab-users"},
		Spec: hcpv1alpha1.CapabilityPolicySpec{Rules: []hcpv1alpha1.PolicyRule{{
			Callers: hcpv1alpha1.CallerMatch{IDs: []string{"client", "stranger"}}, Capabilities: []string{"cvd.run"}, MaxRiskLevel: hcpv1alpha1.RiskR2,
		}}},
	}
	create(t, callee, named, stranger, outsider, pol)
	for _, o := range []client.Object{callee, named, stranger, outsider} {
		claimedKey(t, o)
	}
	eventually(t, "both named Callers granted "+b, all(sessionNamespaces(named, b), sessionNamespaces(stranger, b)))

	session := &hcpv1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: uuid.NewString(), Labels: map[string]string{
			hcpv1alpha1.LabelCalleeID: "lab", hcpv1alpha1.LabelCallerID: "client"}},
		Spec: hcpv1alpha1.HCPSessionSpec{CalleeID: "lab", CallerID: "client", Capability: "cvd.run", TaskMessageID: uuid.NewString(), RiskLevel: hcpv1alpha1.RiskR2},
	}
	session.Spec.SessionID = session.Name
	create(t, session)
	installAdmissionPolicies(t)

	patch := func(c client.Client, mutate func(*hcpv1alpha1.HCPSessionStatus)) error {
		var hs hcpv1alpha1.HCPSession
		if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(session), &hs); err != nil {
			return err
		}
		orig := hs.DeepCopy()
		mutate(&hs.Status)
		return c.Status().Patch(t.Context(), &hs, client.MergeFrom(orig))
	}
	position := func(seq int64) func(*hcpv1alpha1.HCPSessionStatus) {
		return func(st *hcpv1alpha1.HCPSessionStatus) { st.CallerAckedSequence = seq }
	}
	namedSA, strangerSA := callerSA(t, a, "hcp-caller-named"), callerSA(t, a, "hcp-caller-stranger")
	// The bindings reach the admission plugin asynchronously.
	eventually(t, "the policies in effect", func(context.Context) error {
		if cell, err := classify(patch(strangerSA, position(99))); cell != byVAP {
			return fmt.Errorf("the stranger's write of another caller's position: %s (%v), want denied by a policy", cell, err)
		}
		return nil
	})

	if err := patch(namedSA, position(7)); err != nil {
		t.Fatalf("the caller's sidecar records its position in its session in %s: %v", b, err)
	}
	var hs hcpv1alpha1.HCPSession
	if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(session), &hs); err != nil || hs.Status.CallerAckedSequence != 7 {
		t.Fatalf("callerAckedSequence %d (%v), want 7", hs.Status.CallerAckedSequence, err)
	}
	for _, c := range []struct {
		what   string
		as     client.Client
		mutate func(*hcpv1alpha1.HCPSessionStatus)
		want   string
	}{
		{"the stranger records a position in another caller's session", strangerSA, position(99), byVAP},
		{"the caller changes its session's state", namedSA, func(st *hcpv1alpha1.HCPSessionStatus) { st.State = hcpv1alpha1.SessionCompleted }, byVAP},
		{"a Caller the policy does not name records a position", callerSA(t, a, "hcp-caller-outsider"), position(99), byRBAC},
	} {
		if cell, err := classify(patch(c.as, c.mutate)); cell != c.want {
			t.Errorf("%s: %s (%v), want %s", c.what, cell, err, c.want)
		}
	}
	if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(session), &hs); err != nil {
		t.Fatal(err)
	}
	if hs.Status.CallerAckedSequence != 7 || hs.Status.State != "" {
		t.Errorf("after the refused writes: callerAckedSequence %d, state %q, want 7 and none", hs.Status.CallerAckedSequence, hs.Status.State)
	}
	if cell, err := classify(namedSA.Delete(t.Context(), &hs)); cell != byRBAC {
		t.Errorf("the caller deletes its session in %s: %s (%v), want Forbidden by RBAC", b, cell, err)
	}
}
