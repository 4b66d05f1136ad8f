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
	o := NewObserver(clk)
	if alive, known, err := o.Alive(ctx, c, "ns", "pod-a"); !alive || !known || err != nil {
		t.Fatalf("Alive = %v %v %v", alive, known, err)
	}
	// No renewal (the API server is unreachable, the process is frozen):
	// the owner stops before anyone may take over.
	clk.Step(50*time.Second + time.Millisecond)
	if k.Valid() {
		t.Fatal("still valid after duration - margin without a renewal")
	}
	if alive, _, _ := o.Alive(ctx, c, "ns", "pod-a"); !alive {
		t.Fatal("others see the Lease expired while its holder may still act")
	}
	clk.Step(10 * time.Second)
	if alive, known, _ := o.Alive(ctx, c, "ns", "pod-a"); alive || !known {
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
	if _, known, _ := o.Alive(ctx, c, "ns", "pod-old"); known {
		t.Fatal("a pod without a Lease must be reported unknown")
	}
}

// A holder's wall clock skewed against the observer's (either way, 30 s)
// never makes two owners act at once: the observer times the Lease on its
// own clock from when it saw the last renewal, not from the renewTime the
// holder wrote.
func TestObserverIgnoresTheHoldersClockSkew(t *testing.T) {
	for _, skew := range []time.Duration{-30 * time.Second, 30 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			scheme := runtime.NewScheme()
			if err := coordinationv1.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			c := fake.NewClientBuilder().WithScheme(scheme).Build()
			real := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
			oldClk := clocktesting.NewFakeClock(real.Add(skew)) // the old owner's clock
			newClk := clocktesting.NewFakeClock(real)           // the observer's
			k := New(Options{Client: c, Namespace: "ns", Pod: "old", Holder: "old/1", Duration: 60 * time.Second, Margin: 10 * time.Second, Clock: oldClk})
			ctx := context.Background()
			if err := k.Acquire(ctx); err != nil {
				t.Fatal(err)
			}
			o := NewObserver(newClk)
			step := func(d time.Duration) { oldClk.Step(d); newClk.Step(d) }
			for elapsed := time.Duration(0); elapsed <= 70*time.Second; elapsed += time.Second {
				alive, known, err := o.Alive(ctx, c, "ns", "old")
				if err != nil || !known {
					t.Fatalf("Alive: %v %v", known, err)
				}
				if k.Valid() && !alive {
					t.Fatalf("%s after the last renewal the old owner still acts, but the observer sees its Lease expired", elapsed)
				}
				if elapsed > 60*time.Second && alive {
					t.Fatalf("%s after the last renewal the Lease still counts as alive", elapsed)
				}
				step(time.Second)
			}
			// A renewal is a change: a full duration again from when it is seen.
			if err := k.Acquire(ctx); err != nil {
				t.Fatal(err)
			}
			if alive, _, _ := o.Alive(ctx, c, "ns", "old"); !alive {
				t.Fatal("a renewed Lease counts as expired")
			}
		})
	}
}

// The Keeper's generation moves only when a renewal lands after a lapse,
// and before the Keeper counts as valid again.
func TestKeeperGenerationMovesAfterALapse(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	k := New(Options{Client: c, Namespace: "ns", Pod: "p", Holder: "p/1", Duration: 60 * time.Second, Margin: 10 * time.Second, Clock: clk})
	ctx := context.Background()
	if err := k.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	g := k.Generation()
	<-k.Regained()
	clk.Step(20 * time.Second)
	if err := k.renew(ctx); err != nil || k.Generation() != g {
		t.Fatalf("a renewal in time moved the generation: %v %d", err, k.Generation())
	}
	clk.Step(51 * time.Second)
	if k.Valid() {
		t.Fatal("valid after the lapse")
	}
	if err := k.renew(ctx); err != nil || k.Generation() != g+1 {
		t.Fatalf("the renewal after a lapse did not move the generation: %v %d", err, k.Generation())
	}
	select {
	case <-k.Regained():
	default:
		t.Fatal("no Regained signal")
	}
}
