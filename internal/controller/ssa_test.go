package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// countingClient counts the writes sent through it, by method.
type countingClient struct {
	client.Client
	n map[string]int
}

func (c countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.n["create"]++
	return c.Client.Create(ctx, obj, opts...)
}

func (c countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.n["update"]++
	return c.Client.Update(ctx, obj, opts...)
}

func (c countingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.n["patch"]++
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c countingClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	c.n["apply"]++
	return c.Client.Apply(ctx, obj, opts...)
}

// TestCreateSeenLate: a child this owner's previous reconcile created, which
// the cache has not shown yet, is read from the API server (createMemo),
// not created again, and, as it already holds what the owner applies,
// nothing is sent (it used to cost a refused create, and before that a
// managed-fields patch and an apply too).
func TestCreateSeenLate(t *testing.T) {
	ns := newNamespace(t, "late-")
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner"}}
	create(t, owner)
	desired := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: "late", Labels: map[string]string{"a": "1"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: new(true)}},
	}}
	n := map[string]int{}
	c := newCore(staleCache{countingClient{k8sClient, n}}, k8sClient, suiteManager.GetScheme(), nil, suiteOptions(), topology.RoleCallee)
	ctx, _ := withChangeLog(t.Context()) // as in a reconcile: no Event of its own
	first, err := c.applyChild(ctx, owner, nil, desired.DeepCopy(), nil)
	if err != nil || first == nil {
		t.Fatalf("first apply: %v, %v", first, err)
	}
	clear(n)
	again, err := c.applyChild(ctx, owner, nil, desired.DeepCopy(), nil)
	if err != nil {
		t.Fatalf("apply again, the cache behind: %v", err)
	}
	if again == nil || again.GetUID() != first.GetUID() {
		t.Errorf("apply again returned %v, want the child created first (uid %s)", again, first.GetUID())
	}
	if n["create"]+n["patch"]+n["apply"]+n["update"] != 0 {
		t.Errorf("apply again sent %v, want nothing: the child was read from the API server", n)
	}
	// Changed since: applied over it.
	desired.Labels["a"] = "2"
	clear(n)
	if _, err := c.applyChild(ctx, owner, nil, desired.DeepCopy(), nil); err != nil {
		t.Fatal(err)
	}
	got := &corev1.ServiceAccount{}
	mustGet(t, k8sClient, client.ObjectKeyFromObject(desired), got)
	if got.Labels["a"] != "2" || n["apply"] != 1 {
		t.Errorf("a changed child the cache has not shown: labels %v after %v, want a=2 by one apply", got.Labels, n)
	}
}
