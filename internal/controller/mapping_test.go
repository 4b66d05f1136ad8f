package controller

import (
	"testing"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// TestChildChanged: an owned child's creation and an update of the API
// server's or another controller's bookkeeping (the topology operator's
// finalizer) do not reconcile the owner; its status, labels, data and
// deletion do.
func TestChildChanged(t *testing.T) {
	queue := &topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "q", ResourceVersion: "1"}}
	with := func(mutate func(*topologyv1beta1.Queue)) *topologyv1beta1.Queue {
		q := queue.DeepCopy()
		q.ResourceVersion = "2"
		mutate(q)
		return q
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", ResourceVersion: "1"}, Data: map[string][]byte{"k": []byte("a")}}
	edited := secret.DeepCopy()
	edited.ResourceVersion, edited.Data["k"] = "2", []byte("b")

	p := childChanged()
	if p.Create(event.CreateEvent{Object: queue}) {
		t.Error("a child's creation reconciles its owner")
	}
	if !p.Delete(event.DeleteEvent{Object: queue}) {
		t.Error("a child's deletion does not reconcile its owner")
	}
	for _, tc := range []struct {
		name     string
		old, new client.Object
		want     bool
	}{
		{"the topology operator's finalizer", queue, with(func(q *topologyv1beta1.Queue) {
			q.Finalizers = []string{"deletion.finalizers.queues.rabbitmq.com"}
			q.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "messaging-topology-operator"}}
		}), false},
		{"a resync, nothing changed", queue, queue.DeepCopy(), false},
		{"its status", queue, with(func(q *topologyv1beta1.Queue) {
			q.Status.Conditions = []topologyv1beta1.Condition{{Type: "Ready", Status: corev1.ConditionTrue}}
		}), true},
		{"its observed generation", queue, with(func(q *topologyv1beta1.Queue) { q.Status.ObservedGeneration = 1 }), true},
		{"a label", queue, with(func(q *topologyv1beta1.Queue) { q.Labels = map[string]string{"a": "b"} }), true},
		{"its spec", queue, with(func(q *topologyv1beta1.Queue) { q.Spec.Name = "other"; q.Generation = 2 }), true},
		{"its deletion", queue, with(func(q *topologyv1beta1.Queue) { q.DeletionTimestamp = &metav1.Time{} }), true},
		{"a Secret's data", secret, edited, true},
	} {
		if got := p.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}); got != tc.want {
			t.Errorf("%s: reconciles the owner %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestOwnUpdate: a Callee's (Caller's) update of its status alone, which
// its reconcile wrote, does not reconcile it again; every other change
// does.
func TestOwnUpdate(t *testing.T) {
	callee := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", ResourceVersion: "1", Generation: 1}}
	with := func(mutate func(*hcpv1alpha1.Callee)) *hcpv1alpha1.Callee {
		c := callee.DeepCopy()
		c.ResourceVersion = "2"
		mutate(c)
		return c
	}
	caller := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "1"}}
	callerStatus := caller.DeepCopy()
	callerStatus.ResourceVersion, callerStatus.Status.ObservedGeneration = "2", 1

	p := ownUpdate()
	if !p.Create(event.CreateEvent{Object: callee}) || !p.Delete(event.DeleteEvent{Object: callee}) {
		t.Error("a Callee's creation or deletion does not reconcile it")
	}
	for _, tc := range []struct {
		name     string
		old, new client.Object
		want     bool
	}{
		{"its status", callee, with(func(c *hcpv1alpha1.Callee) {
			c.Status.ObservedGeneration = 1
			c.Status.Conditions = []metav1.Condition{{Type: hcpv1alpha1.ConditionReady, Status: metav1.ConditionFalse}}
		}), false},
		{"a Caller's status", caller, callerStatus, false},
		{"its spec", callee, with(func(c *hcpv1alpha1.Callee) { c.Spec.CalleeID = "other"; c.Generation = 2 }), true},
		{"a label (the id claim)", callee, with(func(c *hcpv1alpha1.Callee) { c.Labels = map[string]string{hcpv1alpha1.LabelVhostKey: "k"} }), true},
		{"a finalizer", callee, with(func(c *hcpv1alpha1.Callee) { c.Finalizers = []string{"x"} }), true},
		{"an annotation", callee, with(func(c *hcpv1alpha1.Callee) { c.Annotations = map[string]string{"a": "b"} }), true},
		{"its deletion", callee, with(func(c *hcpv1alpha1.Callee) { c.DeletionTimestamp = &metav1.Time{} }), true},
	} {
		if got := p.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}); got != tc.want {
			t.Errorf("%s: reconciles %v, want %v", tc.name, got, tc.want)
		}
	}
}
