package controller

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

func TestMessagesOnly(t *testing.T) {
	pending := func(msg string) *hcpv1alpha1.Callee {
		c := &hcpv1alpha1.Callee{}
		c.Status.ObservedGeneration = 1
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: hcpv1alpha1.ConditionTopologyReady, Status: metav1.ConditionFalse,
			Reason: hcpv1alpha1.ReasonTopologyPending, Message: msg, LastTransitionTime: metav1.Unix(100, 0)})
		return c
	}
	before := pending("Queue q: not yet declared; User u: not yet declared")
	if !messagesOnly(before, pending("User u: not yet declared")) {
		t.Error("one pending child fewer: want a message-only change")
	}
	ready := pending("")
	meta.SetStatusCondition(&ready.Status.Conditions, metav1.Condition{Type: hcpv1alpha1.ConditionTopologyReady, Status: metav1.ConditionTrue,
		Reason: hcpv1alpha1.ReasonReconciled, Message: "5 topology objects ready"})
	if messagesOnly(before, ready) {
		t.Error("TopologyReady became True: not message-only")
	}
	gen := pending("User u: not yet declared")
	gen.Status.ObservedGeneration = 2
	if messagesOnly(before, gen) {
		t.Error("observedGeneration changed: not message-only")
	}
	replicas := pending("User u: not yet declared")
	replicas.Status.ReadyReplicas = 1
	if messagesOnly(before, replicas) {
		t.Error("readyReplicas changed: not message-only")
	}
	if messagesOnly(before, &hcpv1alpha1.Caller{}) {
		t.Error("different kinds: not message-only")
	}
}

func TestStatusWritesWait(t *testing.T) {
	w := newStatusWrites(5 * time.Second)
	t0 := time.Unix(1000, 0)
	if d := w.wait("a", t0); d != 0 {
		t.Fatalf("never written: wait %v, want 0", d)
	}
	w.wrote("a", t0)
	if d := w.wait("a", t0.Add(2*time.Second)); d != 3*time.Second {
		t.Fatalf("written 2 s ago: wait %v, want 3s", d)
	}
	if d := w.wait("a", t0.Add(5*time.Second)); d != 0 {
		t.Fatalf("written an interval ago: wait %v, want 0", d)
	}
	// Pruning keeps the map to what still holds writes back.
	w.pruneAt = 4
	for i := range 3 {
		w.wrote(k8stypes.UID(fmt.Sprint(i)), t0)
	}
	w.wrote("late", t0.Add(10*time.Second))
	if len(w.at) != 1 || w.pruneAt != 1024 {
		t.Fatalf("after pruning: %d entries (want 1), pruneAt %d", len(w.at), w.pruneAt)
	}
}
