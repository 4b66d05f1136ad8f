package controller

import (
	"testing"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// updateCase is an update event and whether it should pass a predicate.
type updateCase struct {
	name     string
	old, new client.Object
	want     bool
}

// edited is the update of o by mutate: a copy at the next resourceVersion.
func edited[T client.Object](name string, o T, mutate func(T), want bool) updateCase {
	c := o.DeepCopyObject().(T)
	c.SetResourceVersion(o.GetResourceVersion() + "1")
	mutate(c)
	return updateCase{name, o, c, want}
}

func checkUpdates(t *testing.T, p predicate.Predicate, cases []updateCase) {
	t.Helper()
	for _, tc := range cases {
		if got := p.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}); got != tc.want {
			t.Errorf("%s: reconciles %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestChildChanged: an owned child's creation and an update of the API
// server's or another controller's bookkeeping (the topology operator's
// finalizer) do not reconcile the owner; its status, labels, data and
// deletion do.
func TestChildChanged(t *testing.T) {
	queue := &topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "q", ResourceVersion: "1"}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", ResourceVersion: "1"}, Data: map[string][]byte{"k": []byte("a")}}

	p := childChanged()
	if p.Create(event.CreateEvent{Object: queue}) {
		t.Error("a child's creation reconciles its owner")
	}
	if !p.Delete(event.DeleteEvent{Object: queue}) {
		t.Error("a child's deletion does not reconcile its owner")
	}
	checkUpdates(t, p, []updateCase{
		edited("the topology operator's finalizer", queue, func(q *topologyv1beta1.Queue) {
			q.Finalizers = []string{"deletion.finalizers.queues.rabbitmq.com"}
			q.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "messaging-topology-operator"}}
		}, false),
		{"a resync, nothing changed", queue, queue.DeepCopy(), false},
		edited("its status", queue, func(q *topologyv1beta1.Queue) {
			q.Status.Conditions = []topologyv1beta1.Condition{{Type: "Ready", Status: corev1.ConditionTrue}}
		}, true),
		edited("its observed generation", queue, func(q *topologyv1beta1.Queue) { q.Status.ObservedGeneration = 1 }, true),
		edited("a label", queue, func(q *topologyv1beta1.Queue) { q.Labels = map[string]string{"a": "b"} }, true),
		edited("its spec", queue, func(q *topologyv1beta1.Queue) { q.Spec.Name = "other"; q.Generation = 2 }, true),
		edited("its deletion", queue, func(q *topologyv1beta1.Queue) { q.DeletionTimestamp = &metav1.Time{} }, true),
		edited("a Secret's data", secret, func(s *corev1.Secret) { s.Data["k"] = []byte("b") }, true),
	})
}

// TestOwnUpdate: a Callee's (Caller's) update of its status alone, which
// its reconcile wrote, does not reconcile it again; every other change
// does.
func TestOwnUpdate(t *testing.T) {
	callee := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", ResourceVersion: "1", Generation: 1}}
	caller := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "1"}}

	p := ownUpdate(nil)
	if !p.Create(event.CreateEvent{Object: callee}) || !p.Delete(event.DeleteEvent{Object: callee}) {
		t.Error("a Callee's creation or deletion does not reconcile it")
	}
	checkUpdates(t, p, []updateCase{
		edited("its status", callee, func(c *hcpv1alpha1.Callee) {
			c.Status.ObservedGeneration = 1
			c.Status.Conditions = []metav1.Condition{{Type: hcpv1alpha1.ConditionReady, Status: metav1.ConditionFalse}}
		}, false),
		edited("a Caller's status", caller, func(c *hcpv1alpha1.Caller) { c.Status.ObservedGeneration = 1 }, false),
		edited("its spec", callee, func(c *hcpv1alpha1.Callee) { c.Spec.CalleeID = "other"; c.Generation = 2 }, true),
		edited("a label (the id claim)", callee, func(c *hcpv1alpha1.Callee) { c.Labels = map[string]string{hcpv1alpha1.LabelVhostKey: "k"} }, true),
		edited("a finalizer", callee, func(c *hcpv1alpha1.Callee) { c.Finalizers = []string{"x"} }, true),
		edited("an annotation", callee, func(c *hcpv1alpha1.Callee) { c.Annotations = map[string]string{"a": "b"} }, true),
		edited("its deletion", callee, func(c *hcpv1alpha1.Callee) { c.DeletionTimestamp = &metav1.Time{} }, true),
	})
}
