package controller

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
)

// TestCallerExternalThenHarness: an external Caller gets topology and a
// credentials Secret only; adding a harness deploys it in caller mode;
// removing it removes the Deployment.
func TestCallerExternalThenHarness(t *testing.T) {
	ns := newNamespace(t, "caller-")
	dumpOnFailure(t, ns)
	caller := newCaller(ns, "alpha")
	create(t, caller)
	base, credsName, tokenName := childNames("caller", "alpha")
	topo := topologyChildren(ns, base)
	declarePrerequisites(t, ns, base)
	checks := make([]func(context.Context) error, 0, len(topo)+3)
	for _, o := range topo {
		checks = append(checks, exists(o, caller))
	}
	eventually(t, "topology and credentials exist", all(append(checks,
		exists(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: credsName}}, caller),
		callerCondition(caller, hcpv1alpha1.ConditionHarnessReady, metav1.ConditionTrue, hcpv1alpha1.ReasonNoHarness, "Secret "+credsName),
		callerCondition(caller, hcpv1alpha1.ConditionReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, ""),
	)...))
	st := caller.Status
	if !st.External || st.CredentialsSecret != credsName || st.EventQueue != "hcp.evt.alpha" || st.CallerID != "alpha" ||
		st.Username != "caller.alpha@"+testVhost(ns) || st.ObservedGeneration != caller.Generation {
		t.Errorf("status %+v", st)
	}
	q := topo[0].(*topologyv1beta1.Queue)
	if want := eventQueueArgs("hcp.evt.alpha"); !reflect.DeepEqual(queueArgs(q), want) {
		t.Errorf("event queue arguments %v, want only %v (the limits are a policy)", queueArgs(q), want)
	}
	// The default limits: the vhost's shared policy, none of its own.
	key := caller.Labels[hcpv1alpha1.LabelVhostKey]
	shared := sharedPolicy(key)
	eventually(t, "the vhost's default event limits Policy", func(ctx context.Context) error {
		return k8sClient.Get(ctx, client.ObjectKeyFromObject(shared), shared)
	})
	if want := map[string]any{"message-ttl": float64(86400000), "max-length": float64(100000), "overflow": "drop-head", "dead-letter-exchange": "hcp.dlx"}; !reflect.DeepEqual(policyDefinition(shared), want) ||
		shared.Spec.Pattern != `^hcp\.evt\.` || shared.Spec.Priority != resource.DefaultLimitsPolicyPriority || len(shared.OwnerReferences) != 0 {
		t.Errorf("default event limits policy %+v definition %v, want the defaults %v", shared.Spec, policyDefinition(shared), want)
	}
	pol := limitsPolicy(ns, base)
	if err := gone(pol)(t.Context()); err != nil {
		t.Errorf("a Caller with the default limits got a policy of its own: %v", err)
	}
	if b := topo[1].(*topologyv1beta1.Binding).Spec; b.Source != "hcp.events" || b.RoutingKey != "alpha.#" || b.Destination != "hcp.evt.alpha" {
		t.Errorf("binding %+v", b)
	}
	if p := topo[3].(*topologyv1beta1.Permission).Spec.Permissions; p.Configure != "^$" || p.Write != `^hcp\.commands$` || p.Read != `^hcp\.evt\.alpha$` {
		t.Errorf("permissions %+v", p)
	}
	for _, o := range append(harnessChildren(ns, base), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tokenName}}) {
		if err := gone(o)(t.Context()); err != nil {
			t.Errorf("an external caller got %v", err)
		}
	}

	// Every topology object Ready: an external caller is Ready.
	for _, o := range topo {
		setTopologyStatus(t, o, true, "")
	}
	declareShared(t, key)
	eventually(t, "external caller Ready", callerCondition(caller, hcpv1alpha1.ConditionReady, metav1.ConditionTrue, hcpv1alpha1.ReasonReconciled, ""))

	// TTL and limits edited reach the queue.
	update(t, caller, func(c *hcpv1alpha1.Caller) {
		c.Spec.EventQueue.MessageTTL = "PT2H"
		c.Spec.EventQueue.Overflow = "reject-publish"
	})
	queueGeneration := q.Generation
	eventually(t, "edited event queue policy, its own", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pol), pol); err != nil {
			return err
		}
		want := map[string]any{"message-ttl": float64(7200000), "max-length": float64(100000), "overflow": "reject-publish", "dead-letter-exchange": "hcp.dlx"}
		if got := policyDefinition(pol); !reflect.DeepEqual(got, want) {
			return fmt.Errorf("definition %v want %v", got, want)
		}
		if pol.Spec.Pattern != `^hcp\.evt\.alpha$` || pol.Spec.Priority != resource.LimitsPolicyPriority {
			return fmt.Errorf("pattern %q priority %d, want the queue alone above the default", pol.Spec.Pattern, pol.Spec.Priority)
		}
		return nil
	})
	if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(q), q); err != nil {
		t.Fatal(err)
	}
	if q.Generation != queueGeneration || !reflect.DeepEqual(queueArgs(q), eventQueueArgs("hcp.evt.alpha")) {
		t.Errorf("a limit change updated the Queue: generation %d -> %d, arguments %v", queueGeneration, q.Generation, queueArgs(q))
	}

	// A harness: caller-mode sidecar with the app's URL and the prefetch.
	update(t, caller, func(c *hcpv1alpha1.Caller) {
		c.Spec.Harness = &hcpv1alpha1.HarnessSpec{Port: 3000, Template: harnessTemplate("example.com/agent:1")}
		c.Spec.Consumer.Prefetch = 25
	})
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}
	eventually(t, "caller harness deployed", all(
		exists(dep, caller),
		callerCondition(caller, hcpv1alpha1.ConditionHarnessReady, metav1.ConditionFalse, hcpv1alpha1.ReasonDeploymentProgressing, ""),
	))
	if caller.Status.External {
		t.Error("status.external still true with a harness")
	}
	side := dep.Spec.Template.Spec.InitContainers[0] // a native sidecar
	env := map[string]string{}
	for _, e := range side.Env {
		env[e.Name] = e.Value
	}
	if side.Name != "hcp-sidecar" || side.Args[0] != "--mode=caller" || env[config.EnvMode] != "caller" || env[config.EnvHarnessURL] != "http://127.0.0.1:3000" ||
		env[config.EnvPrefetch] != "25" {
		t.Errorf("sidecar %s args %v env %v", side.Name, side.Args, env)
	}
	if _, ok := env[config.EnvTokenKey]; ok {
		t.Error("a caller sidecar got a token key")
	}

	// And away again.
	update(t, caller, func(c *hcpv1alpha1.Caller) { c.Spec.Harness = nil })
	checks = make([]func(context.Context) error, 0, 5)
	for _, o := range harnessChildren(ns, base) {
		checks = append(checks, gone(o))
	}
	eventually(t, "harness removed, external again", all(append(checks,
		callerCondition(caller, hcpv1alpha1.ConditionHarnessReady, metav1.ConditionTrue, hcpv1alpha1.ReasonNoHarness, ""))...))
	if !caller.Status.External {
		t.Error("status.external false without a harness")
	}
}

// TestRejectedSessionsGoSooner: a rejected task's HCPSession goes
// ttlAfterRejected after the rejection, while a session that ran keeps its
// ttlAfterFinished; a flood of refused submits cannot fill etcd.
func TestRejectedSessionsGoSooner(t *testing.T) {
	ns := newNamespace(t, "ttl-rejected-")
	dumpOnFailure(t, ns)
	create(t, newCallee(ns, "gate", func(c *hcpv1alpha1.Callee) { c.Spec.Sessions.TTLAfterRejected = "PT2S" }))
	var rejected []*hcpv1alpha1.HCPSession
	for range 20 {
		s := newSession(ns, "gate", hcpv1alpha1.SessionRejected, new(metav1.Now()))
		createSession(t, s)
		rejected = append(rejected, s)
	}
	completed := newSession(ns, "gate", hcpv1alpha1.SessionCompleted, new(metav1.Now()))
	createSession(t, completed)
	for _, s := range rejected {
		eventually(t, "a rejected session goes after its 2s TTL", gone(s))
	}
	if err := exists(completed, nil)(t.Context()); err != nil {
		t.Errorf("a completed session went with the rejected ones: %v", err)
	}
}

// TestSessionTTL: finished sessions go ttlAfterFinished after they ended;
// others stay.
func TestSessionTTL(t *testing.T) {
	ns := newNamespace(t, "ttl-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "short", func(c *hcpv1alpha1.Callee) { c.Spec.Sessions.TTLAfterFinished = "PT3S" })
	create(t, callee)
	old := newSession(ns, "short", hcpv1alpha1.SessionFailed, &metav1.Time{Time: time.Now().Add(-time.Hour)})
	fresh := newSession(ns, "short", hcpv1alpha1.SessionCompleted, new(metav1.Now()))
	running := newSession(ns, "short", hcpv1alpha1.SessionRunning, nil)
	other := newSession(ns, "unknown-callee", hcpv1alpha1.SessionCompleted, new(metav1.Now())) // default TTL: 1 day
	for _, s := range []*hcpv1alpha1.HCPSession{old, fresh, running, other} {
		createSession(t, s)
	}
	eventually(t, "the long-finished session is deleted", gone(old))
	if err := exists(fresh, nil)(t.Context()); err != nil {
		t.Errorf("a session finished just now was deleted: %v", err)
	}
	// Requeued for when its TTL passes, with no other event.
	eventually(t, "the fresh session goes after its 3s TTL", gone(fresh))
	for _, s := range []*hcpv1alpha1.HCPSession{running, other} {
		if err := exists(s, nil)(t.Context()); err != nil {
			t.Errorf("session deleted too early: %v", err)
		}
	}
}

// TestOwnDefaultPolicyGoesAfterShared: a Caller of an earlier version has
// a limits policy of its own with the default limits; it is deleted only
// once the vhost's default policy is Ready, so the queue is never without
// its limits on the broker.
func TestOwnDefaultPolicyGoesAfterShared(t *testing.T) {
	ns := newNamespace(t, "upgrade-pol-")
	dumpOnFailure(t, ns)
	caller := newCaller(ns, "old", func(c *hcpv1alpha1.Caller) { c.Spec.Broker.Vhost = "/" + ns })
	create(t, caller)
	base, _, _ := childNames("caller", "old")
	shared := sharedPolicy(claimedKey(t, caller))
	eventually(t, "the vhost's default policy object", func(ctx context.Context) error {
		return k8sClient.Get(ctx, client.ObjectKeyFromObject(shared), shared)
	})
	// What the earlier version made: the Caller's own policy, controlled
	// by it, with the default limits.
	own := resource.LimitsPolicy(resource.ForCaller(caller), resource.Broker{Vhost: "/" + ns, Reference: shared.Spec.RabbitmqClusterReference}, resource.DefaultEventLimits())
	if own.Name != base {
		t.Fatalf("own policy %s, want %s", own.Name, base)
	}
	create(t, own)
	// Reconciles while the default policy is not declared keep it.
	update(t, caller, func(c *hcpv1alpha1.Caller) { c.Annotations = map[string]string{"touch": "1"} })
	time.Sleep(2 * time.Second)
	if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(own), own); err != nil || !own.DeletionTimestamp.IsZero() {
		t.Fatalf("the own policy went before the default one was declared: %v", err)
	}
	setTopologyStatus(t, shared, true, "")
	eventually(t, "the own policy goes once the default one is Ready", gone(own))
}

// eventQueueArgs are the declaration arguments of event queue name:
// single active consumer and its dead-letter routing.
func eventQueueArgs(name string) map[string]any {
	args := resource.DeadLetterArguments(name)
	args["x-single-active-consumer"] = true
	return args
}
