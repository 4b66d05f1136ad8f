//go:build e2e

package scale

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// operatorPhase creates n Callees and n Callers and waits until every one
// has converged: status for its generation, TopologyReady=True, and
// HarnessReady True or ScaledToZero. It returns the time to that and the
// time until all were TopologyReady.
func (b *bed) operatorPhase(ctx context.Context) (time.Duration, time.Duration) {
	t := b.t
	t.Logf("operator: creating %d Callees and %d Callers", b.s.n, b.s.n)
	start := time.Now()
	err := forBoth(b.s.n, func(i int) error {
		return b.cl.Create(ctx, newCallee(b.op, objectName(i), b.opVhost))
	}, func(i int) error {
		return b.cl.Create(ctx, newCaller(b.op, objectName(i), b.opVhost))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("operator: %d objects created in %s", 2*b.s.n, time.Since(start).Round(100*time.Millisecond))
	var topoAt time.Duration
	d := b.waitFor(ctx, "operator: every Callee and Caller converged", start, func() (bool, string) {
		var ready, topo int
		callees := &hcpv1alpha1.CalleeList{}
		callers := &hcpv1alpha1.CallerList{}
		if err := b.cache.List(ctx, callees, client.InNamespace(b.op), readOnly); err != nil {
			t.Fatal(err)
		}
		if err := b.cache.List(ctx, callers, client.InNamespace(b.op), readOnly); err != nil {
			t.Fatal(err)
		}
		var example string
		for i := range callees.Items {
			c := &callees.Items[i]
			r, tp := converged(c.Generation, c.Status.ObservedGeneration, c.Status.Conditions)
			ready, topo = ready+btoi(r), topo+btoi(tp)
			if !r && example == "" {
				example = describeStatus("Callee", c.Name, c.Status.Conditions)
			}
		}
		for i := range callers.Items {
			c := &callers.Items[i]
			r, tp := converged(c.Generation, c.Status.ObservedGeneration, c.Status.Conditions)
			ready, topo = ready+btoi(r), topo+btoi(tp)
			if !r && example == "" {
				example = describeStatus("Caller", c.Name, c.Status.Conditions)
			}
		}
		if topoAt == 0 && topo == 2*b.s.n {
			topoAt = time.Since(start)
		}
		desc := fmt.Sprintf("%d/%d converged, %d TopologyReady", ready, 2*b.s.n, topo)
		if example != "" {
			desc += "; e.g. " + example
		}
		return ready == 2*b.s.n, desc
	})
	if topoAt == 0 {
		topoAt = d
	}
	return d, topoAt
}

// cleanupOperator deletes every Callee and Caller and times it until
// their children, the shared objects, and everything on the broker are
// gone.
func (b *bed) cleanupOperator(ctx context.Context) (cleanup, leftover) {
	t := b.t
	start := time.Now()
	for _, o := range []client.Object{&hcpv1alpha1.Callee{}, &hcpv1alpha1.Caller{}} {
		if err := b.cl.DeleteAllOf(ctx, o, client.InNamespace(b.op)); err != nil {
			t.Fatal(err)
		}
	}
	// The finalizers' part: every Callee and Caller gone, which each
	// lets go only once its topology objects (and, for the last user of
	// the vhost, the shared ones) are gone. The rest is the garbage
	// collector's.
	r := b.waitFor(ctx, "operator cleanup: Callees, Callers and topology objects gone", start, func() (bool, string) {
		n := 0
		for _, l := range []client.ObjectList{&hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}} {
			if err := b.cache.List(ctx, l, client.InNamespace(b.op), readOnly); err != nil {
				t.Fatal(err)
			}
			n += meta.LenList(l)
		}
		c := b.count(ctx, b.op, b.home)
		for _, k := range topologyKindNames {
			n += c[k]
		}
		return n == 0, fmt.Sprintf("%d left", n)
	})
	d, left := b.waitGone(ctx, "operator cleanup", start, b.opVhost, b.op, b.home)
	return cleanup{topology: r, all: d}, left
}

// topologyKindNames are the children the topology operator deletes on the
// broker.
var topologyKindNames = []string{"Vhost", "Exchange", "Queue", "Binding", "User", "Permission", "Policy"}

// cleanup is how long a cleanup took: until the topology objects were gone
// (and, for the operator, every Callee and Caller), and until everything
// was (the rest by garbage collection for the operator).
type cleanup struct{ topology, all time.Duration }
