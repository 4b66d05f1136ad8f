package lease

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestKeeperFencesItselfBeforeOthersMayTakeOver(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	k := New(Options{Client: c, Namespace: "ns", Pod: "pod-a", Holder: "pod-a/1", Duration: 60 * time.Second, Margin: 10 * time.Second, Clock: clk})
	ctx := context.Background()
	if k.Valid() {
		t.Fatal("valid before acquiring")
	}
	if err := k.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if !k.Valid() {
		t.Fatal("not valid after acquiring")
	}
	if alive, known, err := Alive(ctx, c, "ns", "pod-a", clk.Now()); !alive || !known || err != nil {
		t.Fatalf("Alive = %v %v %v", alive, known, err)
	}
	// No renewal (the API server is unreachable, the process is frozen):
	// the owner stops before anyone may take over.
	clk.Step(50*time.Second + time.Millisecond)
	if k.Valid() {
		t.Fatal("still valid after duration - margin without a renewal")
	}
	if alive, _, _ := Alive(ctx, c, "ns", "pod-a", clk.Now()); !alive {
		t.Fatal("others see the Lease expired while its holder may still act")
	}
	clk.Step(10 * time.Second)
	if alive, known, _ := Alive(ctx, c, "ns", "pod-a", clk.Now()); alive || !known {
		t.Fatal("the Lease did not expire for others")
	}
	// A restarted sidecar in the same pod takes the Lease at once.
	k2 := New(Options{Client: c, Namespace: "ns", Pod: "pod-a", Holder: "pod-a/2", Clock: clk})
	if err := k2.Acquire(ctx); err != nil || !k2.Valid() {
		t.Fatalf("re-acquire: %v", err)
	}
	var l coordinationv1.Lease
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: Name("pod-a")}, &l); err != nil || *l.Spec.HolderIdentity != "pod-a/2" || *l.Spec.LeaseTransitions != 1 {
		t.Fatalf("lease %+v %v", l.Spec, err)
	}
	if _, known, _ := Alive(ctx, c, "ns", "pod-old", clk.Now()); known {
		t.Fatal("a pod without a Lease must be reported unknown")
	}
}
