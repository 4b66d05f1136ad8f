//go:build e2e

package scale

import (
	"context"
	"fmt"
	"sync"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// baseline creates, directly, what the operator would create for n
// Callees and n Callers (objects_test.go), as fast as the client goes
// with one writer per kind, and waits until the topology operator has
// made every topology object Ready: issue 13's measure for the operator's
// time to Ready. It returns the objects by kind, the time and the
// requests sent.
//
// With floor it also makes the writes any operator of these kinds adds,
// and nothing else: each Callee and Caller itself is created before its
// children (the user's create, in the operator's phase too), and once
// every topology object is Ready each gets one status write (the least
// that tells kstatus, Argo CD or a user it converged). No watch, no
// reconcile, no claim, no Event: what is left of the operator's time
// above the floor is the operator's own.
func (b *bed) baseline(ctx context.Context, floor bool) (map[string]int, time.Duration, int) {
	t := b.t
	conn := &corev1.Secret{}
	if err := b.cl.Get(ctx, client.ObjectKey{Namespace: b.base, Name: connSecretName}, conn); err != nil {
		t.Fatal(err)
	}
	// The CRDs' defaults, as the reconcilers see them.
	calleeTmpl := newCallee(b.base, objectName(0), b.baseVhost)
	callerTmpl := newCaller(b.base, objectName(0), b.baseVhost)
	for _, o := range []client.Object{calleeTmpl, callerTmpl} {
		if err := b.cl.Create(ctx, o, client.DryRunAll); err != nil {
			t.Fatal(err)
		}
	}
	ref := resourceRef(conn)
	brk, err := resource.BrokerFromConnectionSecret(ref, calleeTmpl.Spec.Broker, conn)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	requests := 0
	create := func(objs []client.Object) error {
		for _, o := range objs {
			if err := b.cl.Create(ctx, o); err != nil {
				return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
			}
		}
		mu.Lock()
		requests += len(objs)
		mu.Unlock()
		return nil
	}
	phase := "baseline"
	if floor {
		phase = "floor"
	}
	// subject is the Callee or Caller the children are built for: with
	// floor, created; else never created, with a UID of its own.
	callees := make([]*hcpv1alpha1.Callee, b.s.n)
	callers := make([]*hcpv1alpha1.Caller, b.s.n)
	subject := func(o client.Object) error {
		if !floor {
			withUID(o)
			return nil
		}
		// The dry run's result, as a new object.
		o.SetResourceVersion("")
		o.SetManagedFields(nil)
		return create([]client.Object{o})
	}
	t.Logf("%s: creating the children of %d Callees and %d Callers directly", phase, b.s.n, b.s.n)
	start := time.Now()
	if err := create(sharedObjects(b.base, brk, conn)); err != nil {
		t.Fatal(err)
	}
	err = forBoth(b.s.n, func(i int) error {
		c := calleeTmpl.DeepCopy()
		c.Name = objectName(i)
		if err := subject(c); err != nil {
			return err
		}
		callees[i] = c
		objs, err := calleeChildren(c, brk, randomPassword())
		if err != nil {
			return err
		}
		return create(objs)
	}, func(i int) error {
		c := callerTmpl.DeepCopy()
		c.Name = objectName(i)
		if err := subject(c); err != nil {
			return err
		}
		callers[i] = c
		objs, err := callerChildren(c, brk, randomPassword())
		if err != nil {
			return err
		}
		return create(objs)
	})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Since(start)
	t.Logf("%s: %d objects created in %s", phase, requests, created.Round(100*time.Millisecond))
	d := b.waitFor(ctx, phase+": every topology object Ready", start, func() (bool, string) {
		ready, total := b.topologyReady(ctx, b.base)
		return total > 0 && ready == total, fmt.Sprintf("%d/%d topology objects Ready", ready, total)
	})
	if floor {
		err := forBoth(b.s.n, func(i int) error {
			return writeConverged(ctx, b.cl, callees[i], &callees[i].Status.ObservedGeneration, &callees[i].Status.Conditions)
		}, func(i int) error {
			return writeConverged(ctx, b.cl, callers[i], &callers[i].Status.ObservedGeneration, &callers[i].Status.Conditions)
		})
		if err != nil {
			t.Fatal(err)
		}
		requests += 2 * b.s.n
		d = time.Since(start)
		t.Logf("%s: one status write each for the %d Callees and Callers after %s", phase, 2*b.s.n, d.Round(100*time.Millisecond))
	}
	return b.count(ctx, b.base), d, requests
}

// writeConverged writes obj's status as the operator writes it for a
// converged object with replicas 0 (converged holds for it): one merge
// patch of the status subresource, as the operator's status writes are.
func writeConverged(ctx context.Context, cl client.Client, obj client.Object, observed *int64, conds *[]metav1.Condition) error {
	before := obj.DeepCopyObject().(client.Object)
	*observed = obj.GetGeneration()
	set := func(typ string, ok bool, reason, msg string) {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: obj.GetGeneration()})
	}
	set(hcpv1alpha1.ConditionTopologyReady, true, hcpv1alpha1.ReasonReconciled, "topology objects ready")
	set(hcpv1alpha1.ConditionHarnessReady, false, hcpv1alpha1.ReasonScaledToZero, "scaled to zero")
	set(hcpv1alpha1.ConditionReady, true, hcpv1alpha1.ReasonScaledToZero, "HarnessReady: scaled to zero")
	return cl.Status().Patch(ctx, obj, client.MergeFrom(before))
}

// resourceRef is a reference to a connection Secret in the subject's
// own namespace.
func resourceRef(conn *corev1.Secret) topologyv1beta1.RabbitmqClusterReference {
	return topologyv1beta1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: conn.Name}}
}

// cleanupBaseline deletes the baseline's objects as the operator's
// finalizers would (the topology objects, then once the topology operator
// removed them the shared ones, the rest at once), times it until
// everything is gone from the cluster and the broker, and returns what
// the broker still held then.
func (b *bed) cleanupBaseline(ctx context.Context) (cleanup, leftover) {
	t := b.t
	start := time.Now()
	deleteAll := func(names ...string) {
		for _, k := range childKinds {
			if !containsName(names, k.name) {
				continue
			}
			o := itemOf(t, b.cl.Scheme(), k.list())
			if err := b.cl.DeleteAllOf(ctx, o, client.InNamespace(b.base), managedBy, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
				t.Fatalf("delete %ss: %v", k.name, err)
			}
		}
	}
	// The Secrets last: the topology operator needs the connection
	// Secret's copy to delete the shared objects on the broker (the
	// operator's copy goes by garbage collection after them).
	deleteAll("Queue", "Binding", "User", "Permission", "Policy", "ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget", "Deployment")
	b.waitFor(ctx, "baseline cleanup: per-object topology objects gone", start, func() (bool, string) {
		c := b.count(ctx, b.base)
		n := c["Queue"] + c["Binding"] + c["User"] + c["Permission"] + c["Policy"]
		return n == 0, fmt.Sprintf("%d left", n)
	})
	deleteAll("Exchange", "Vhost")
	r := b.waitFor(ctx, "baseline cleanup: shared objects gone", start, func() (bool, string) {
		c := b.count(ctx, b.base)
		n := c["Exchange"] + c["Vhost"]
		return n == 0, fmt.Sprintf("%d left", n)
	})
	deleteAll("Secret")
	// The floor's Callees and Callers: no finalizer (no operator watches
	// this namespace).
	for _, o := range []client.Object{&hcpv1alpha1.Callee{}, &hcpv1alpha1.Caller{}} {
		if err := b.cl.DeleteAllOf(ctx, o, client.InNamespace(b.base)); err != nil {
			t.Fatal(err)
		}
	}
	d, left := b.waitGone(ctx, "baseline cleanup", start, b.baseVhost, b.base)
	return cleanup{topology: r, all: d}, left
}

// waitReplicaSetsGone waits, untimed, until the garbage collector has
// removed the ReplicaSets of ns's deleted Deployments, so that its tail
// after one phase's cleanup does not load the machine in the next phase.
func (b *bed) waitReplicaSetsGone(ctx context.Context, ns string) {
	b.waitFor(ctx, ns+": ReplicaSets gone (garbage collection, untimed)", time.Now(), func() (bool, string) {
		var l appsv1.ReplicaSetList
		if err := b.cl.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(l.Items) == 0, fmt.Sprintf("%d left", len(l.Items))
	})
}

func containsName(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}
