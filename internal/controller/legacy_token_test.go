package controller

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestLegacyTokenSecretUpgrade: a Callee of an earlier version has its
// token keys in hcp-callee-N-token. The new manager moves the same keys
// into the credentials Secret (no new key: sessions in flight carry tokens
// signed with it), leaves the old Secret as it is while a pod of the
// Deployment may still mount it, empties it once the Deployment has
// rolled out without it, and a credentials Secret deleted after that
// gets a new key, not the old one back.
func TestLegacyTokenSecretUpgrade(t *testing.T) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, hcpv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	callee := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lab", UID: "uid-lab"}}
	v := calleeView(callee)
	keys, err := resource.NextTokenKeys(resource.TokenKeys{}, "", func() (ed25519.PrivateKey, error) {
		_, sk, err := token.GenerateKey()
		return sk, err
	})
	if err != nil {
		t.Fatal(err)
	}
	// What the earlier version wrote.
	legacy := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: v.sub.LegacyTokenSecretName(), Labels: map[string]string{resource.LabelTopologyOperator: "true"},
			OwnerReferences: []metav1.OwnerReference{v.sub.OwnerReference()}},
		Data: map[string][]byte{resource.TokenPrivateKeyKey: keys.PrivatePEM, resource.TokenPublicKeyKey: keys.PublicPEM, resource.TokenVerifyKeysKey: keys.VerifyPEM},
	}
	api := fake.NewClientBuilder().WithScheme(s).WithObjects(callee, legacy).Build()
	c := newCore(api, api, s, events.NewFakeRecorder(10), Options{}, topology.RoleCallee)
	ctx := context.Background()
	b := resource.Broker{Vhost: "/hcp", Identity: "id", AMQPURL: "amqp://rabbit:5672"}

	creds, err := c.ensureCredentials(ctx, v, b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(creds.Data[resource.TokenPrivateKeyKey], keys.PrivatePEM) || !bytes.Equal(creds.Data[resource.TokenVerifyKeysKey], keys.VerifyPEM) {
		t.Fatal("the credentials Secret did not adopt the earlier Secret's keys")
	}

	dep := resource.Deployment(resource.HarnessParams{Subject: v.sub, Harness: hcpv1alpha1.HarnessSpec{Template: harnessTemplate("app:1")}})
	dep.Generation, dep.Status.ObservedGeneration = 2, 2
	oldTemplate := dep.DeepCopy()
	oldTemplate.Spec.Template.Spec.Volumes = append(oldTemplate.Spec.Template.Spec.Volumes, corev1.Volume{Name: "hcp-token",
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: legacy.Name}}})
	rolling := dep.DeepCopy()
	rolling.Status.Replicas, rolling.Status.UpdatedReplicas = 3, 2
	unobserved := dep.DeepCopy()
	unobserved.Generation = 3
	for name, d := range map[string]*appsv1.Deployment{"no Deployment": nil, "a template mounting it": oldTemplate, "a rollout under way": rolling, "a generation not yet observed": unobserved} {
		if err := c.retireLegacyTokenSecret(ctx, v, creds, d); err != nil {
			t.Fatal(err)
		}
		if got := secretData(t, api, legacy.Name); !bytes.Equal(got[resource.TokenPrivateKeyKey], keys.PrivatePEM) {
			t.Errorf("%s: the earlier Secret was emptied while a pod may mount it", name)
		}
	}
	if err := c.retireLegacyTokenSecret(ctx, v, creds, dep); err != nil {
		t.Fatal(err)
	}
	retired := &corev1.Secret{}
	if err := api.Get(ctx, client.ObjectKey{Namespace: "ns", Name: legacy.Name}, retired); err != nil {
		t.Fatalf("the earlier Secret is gone (the manager may not delete Secrets): %v", err)
	}
	if len(retired.Data) != 0 || retired.Annotations[hcpv1alpha1.AnnotationTokenKeysMovedTo] != creds.Name {
		t.Errorf("rolled out: the earlier Secret holds %d keys, annotations %v; want none, and where they went", len(retired.Data), retired.Annotations)
	}

	// The emergency replacement of a key, now: delete the credentials Secret.
	if err := api.Delete(ctx, creds); err != nil {
		t.Fatal(err)
	}
	again, err := c.ensureCredentials(ctx, v, b)
	if err != nil {
		t.Fatal(err)
	}
	if k := again.Data[resource.TokenPrivateKeyKey]; len(k) == 0 || bytes.Equal(k, keys.PrivatePEM) {
		t.Error("a credentials Secret deleted after the move did not get a new key")
	}
}

func secretData(t *testing.T, c client.Client, name string) map[string][]byte {
	t.Helper()
	sec := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, sec); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return sec.Data
}
