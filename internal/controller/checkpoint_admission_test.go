package controller

import (
	"context"
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// TestForgedCheckpointRefusedByAdmission: the sidecar of Callee beta (its
// ServiceAccount, impersonated with a pod-bound token) forges a checkpoint
// record for a session of Callee alpha, labelled for alpha as alpha's
// sidecar labels it, through the sidecar's own checkpoint store: the API
// server refuses it (policy 4 of config/admission), both as a new record
// and over the one alpha saved, and refuses beta a write to alpha's pod's
// Lease. Alpha's own sidecar saves the same record.
func TestForgedCheckpointRefusedByAdmission(t *testing.T) {
	ctx := t.Context()
	ns := newNamespace(t, "ckpt-admission-")
	dumpOnFailure(t, ns)
	alpha, beta := newCallee(ns, "alpha"), newCallee(ns, "beta")
	create(t, alpha, beta)
	for _, c := range []*hcpv1alpha1.Callee{alpha, beta} {
		installSidecarRBAC(t, resource.ForCallee(c))
	}
	sid := uuid.NewString()
	hs := &hcpv1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: sid, Namespace: ns, Labels: map[string]string{
			hcpv1alpha1.LabelCallee: alpha.Name, hcpv1alpha1.LabelCalleeID: alpha.ID(), hcpv1alpha1.LabelCallerID: "client"}},
		Spec: hcpv1alpha1.HCPSessionSpec{SessionID: sid, CalleeID: alpha.ID(), CallerID: "client", Capability: "cvd.run",
			TaskMessageID: uuid.NewString(), RiskLevel: hcpv1alpha1.RiskR2, MaxDuration: "PT1H"},
	}
	create(t, hs)
	installAdmissionPolicies(t)

	_, alphaKey, _ := token.GenerateKey()
	_, betaKey, _ := token.GenerateKey()
	// as is a sidecar's checkpoint store as ServiceAccount sa of pod,
	// storing records labelled for Callee alpha (beta forges that).
	as := func(sa, pod string, k ed25519.PrivateKey) (*checkpoint.Store, client.Client) {
		cfg := rest.CopyConfig(testEnv.Config)
		cfg.Impersonate = rest.ImpersonationConfig{
			UserName: "system:serviceaccount:" + ns + ":" + sa,
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			Extra:    map[string][]string{"authentication.kubernetes.io/pod-name": {pod}},
		}
		c, err := client.New(cfg, client.Options{Scheme: testEnv.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		set, _ := token.NewKeySet(k.Public().(ed25519.PublicKey))
		return &checkpoint.Store{C: c, R: c, Namespace: ns, CalleeID: alpha.ID(), CalleeName: alpha.Name,
			Signer: func() ed25519.PrivateKey { return k }, Verifiers: func() token.KeySet { return set }}, c
	}
	own, ownC := as(saName(resource.ForCallee(alpha)), "hcp-callee-alpha-0", alphaKey)
	forger, forgerC := as(saName(resource.ForCallee(beta)), "hcp-callee-beta-0", betaKey)
	owner := checkpoint.Owner{Name: sid, UID: hs.UID, Decision: checkpoint.Decision{CallerID: "client", Capability: "cvd.run", Risk: "R2", MaxDuration: "PT1H"}}
	forged := []byte(`{"session_id":"` + sid + `","capability":"cvd.other","risk_level":"R4"}`)
	refused := func(what string, err error) {
		t.Helper()
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			t.Fatalf("%s: %v, want a denial by a ValidatingAdmissionPolicy", what, err)
		}
	}

	// The bindings reach the admission plugin asynchronously.
	eventually(t, "policy 4 in effect", func(ctx2 context.Context) error {
		err := forger.Save(ctx2, owner, 1, forged, checkpoint.Checkpoint{ID: "forged", Resumable: true})
		if err == nil {
			return errors.New("beta's sidecar created a checkpoint of alpha's session")
		}
		if !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			return err
		}
		return nil
	})
	refused("beta creates a checkpoint of alpha's session",
		forger.Save(ctx, owner, 1, forged, checkpoint.Checkpoint{ID: "forged", Resumable: true}))

	// Alpha's sidecar saves its record; beta cannot overwrite it.
	task := []byte(`{"session_id":"` + sid + `","capability":"cvd.run"}`)
	if err := own.Save(ctx, owner, 1, task, checkpoint.Checkpoint{ID: "ckpt-1", Resumable: true}); err != nil {
		t.Fatalf("alpha's sidecar saves its own checkpoint: %v", err)
	}
	refused("beta overwrites alpha's checkpoint",
		forger.Save(ctx, owner, 2, forged, checkpoint.Checkpoint{ID: "forged", Resumable: true}))
	rec, err := own.Load(ctx, owner)
	if err != nil || string(rec.Task) != string(task) || rec.Checkpoint.ID != "ckpt-1" {
		t.Fatalf("alpha's checkpoint after beta's attempts: %+v, %v", rec, err)
	}

	// Leases: each sidecar its own pod's only.
	lease := func(pod string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "hcp-sidecar-" + pod, Namespace: ns},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(pod)}}
	}
	if err := ownC.Create(ctx, lease("hcp-callee-alpha-0")); err != nil {
		t.Fatalf("alpha's sidecar creates its pod's Lease: %v", err)
	}
	refused("beta creates a Lease of alpha's pod", forgerC.Create(ctx, lease("hcp-callee-alpha-1")))
	var l coordinationv1.Lease
	if err := k8sClient.Get(ctx, key(ns, "hcp-sidecar-hcp-callee-alpha-0"), &l); err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity = ptr.To("hcp-callee-beta-0")
	refused("beta renews alpha's pod's Lease", forgerC.Update(ctx, &l))
}
