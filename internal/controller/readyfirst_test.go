package controller

import (
	"context"
	"testing"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// TestReadyFirst: with the owner handler the manager uses for topology
// children, a Queue that becomes Ready puts its Callee ahead of the new
// objects already queued (priority) and reports progress (the status
// pace's), and any other update of it does neither.
func TestReadyFirst(t *testing.T) {
	s := runtime.NewScheme()
	if err := hcpv1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(hcpv1alpha1.GroupVersion.WithKind("Callee"), meta.RESTScopeNamespace)
	progressed := 0
	h := readyFirst(handler.EnqueueRequestForOwner(s, mapper, &hcpv1alpha1.Callee{}, handler.OnlyControllerOwner()), func() { progressed++ })

	queueOf := func(owner string, ready corev1.ConditionStatus, rv string) *topologyv1beta1.Queue {
		q := &topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "hcp-callee-" + owner, ResourceVersion: rv, Generation: 1,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: hcpv1alpha1.GroupVersion.String(), Kind: "Callee", Name: owner, UID: types.UID(owner), Controller: new(true)}}}}
		q.Status.ObservedGeneration = 1
		if ready != "" {
			q.Status.Conditions = []topologyv1beta1.Condition{{Type: "Ready", Status: ready}}
		}
		return q
	}
	req := func(name string) reconcile.Request {
		return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}}
	}
	for _, tc := range []struct {
		name      string
		old, cur  *topologyv1beta1.Queue
		wantFirst string
	}{
		{"became Ready", queueOf("c9", "", "1"), queueOf("c9", corev1.ConditionTrue, "2"), "c9"},
		{"Ready was False", queueOf("c9", corev1.ConditionFalse, "1"), queueOf("c9", corev1.ConditionTrue, "2"), "c9"},
		{"still not Ready", queueOf("c9", "", "1"), queueOf("c9", corev1.ConditionFalse, "2"), "c0"},
		{"Ready before and after", queueOf("c9", corev1.ConditionTrue, "1"), queueOf("c9", corev1.ConditionTrue, "2"), "c0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			progressed = 0
			q := priorityqueue.New[reconcile.Request]("test")
			defer q.ShutDown()
			for _, n := range []string{"c0", "c1", "c2"} { // new objects, queued first
				q.Add(req(n))
			}
			h.Update(context.Background(), event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.cur}, q)
			if q.Len() != 4 {
				t.Fatalf("queue length %d, want 4 (the owner added once)", q.Len())
			}
			got, _ := q.Get()
			if got.Name != tc.wantFirst {
				t.Fatalf("first out: %s, want %s", got.Name, tc.wantFirst)
			}
			if want := map[bool]int{true: 1}[tc.wantFirst == "c9"]; progressed != want {
				t.Fatalf("progress reported %d times, want %d", progressed, want)
			}
		})
	}
}
