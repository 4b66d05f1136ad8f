package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// waitTimeout bounds each wait for the manager to converge. 60 s: in one
// .ci/run on a fresh clone (every package's tests compiling and running
// two at a time on 2 shared cores) a Callee's first child took over 30 s;
// the same test takes 10 s alone. A wait that succeeds returns at once.
const waitTimeout = 60 * time.Second

func eventually(t *testing.T, what string, check func(context.Context) error) {
	t.Helper()
	testbed.Eventually(t, waitTimeout, what, check)
}

// claimedKey waits until obj (a Callee or Caller) is claimed and returns
// its vhost key; obj is refreshed from the API server.
func claimedKey(t *testing.T, obj client.Object) string {
	t.Helper()
	var key string
	eventually(t, "the claim of "+obj.GetName(), func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		if key = obj.GetLabels()[hcpv1alpha1.LabelVhostKey]; key == "" {
			return errors.New("not claimed yet")
		}
		return nil
	})
	return key
}

// dumpOnFailure prints the namespace's objects when the test fails.
func dumpOnFailure(t *testing.T, ns string) {
	testbed.DumpOnFailure(t, testbed.Dump{Client: k8sClient, Namespace: ns, Lists: []client.ObjectList{
		&hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}, &topologyv1beta1.QueueList{}, &topologyv1beta1.BindingList{},
		&topologyv1beta1.UserList{}, &topologyv1beta1.PermissionList{}, &topologyv1beta1.PolicyList{}, &topologyv1beta1.ExchangeList{}, &topologyv1beta1.VhostList{},
		&appsv1.DeploymentList{}, &hcpv1alpha1.HCPSessionList{},
	}})
}

func harnessTemplate(image string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "harness"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "harness", Image: image}}},
	}
}

// testVhost is the vhost of a test's objects: ids are unique per vhost and
// broker across the cluster, and the suite's API server outlives each test
// (and each -count iteration), so tests do not share vhosts.
func testVhost(ns string) string { return "/" + ns }

func newCallee(ns, name string, mutate ...func(*hcpv1alpha1.Callee)) *hcpv1alpha1.Callee {
	c := &hcpv1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: hcpv1alpha1.CalleeSpec{
			Broker:       hcpv1alpha1.BrokerSpec{Vhost: testVhost(ns)},
			Capabilities: []hcpv1alpha1.Capability{{Name: "cvd.run", RiskLevel: hcpv1alpha1.RiskR2, DataClassification: hcpv1alpha1.DataT2}},
			Harness:      hcpv1alpha1.HarnessSpec{Template: harnessTemplate("example.com/harness:1")},
		},
	}
	for _, m := range mutate {
		m(c)
	}
	return c
}

func newCaller(ns, name string, mutate ...func(*hcpv1alpha1.Caller)) *hcpv1alpha1.Caller {
	c := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: hcpv1alpha1.CallerSpec{Broker: hcpv1alpha1.BrokerSpec{Vhost: testVhost(ns)}}}
	for _, m := range mutate {
		m(c)
	}
	return c
}

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := k8sClient.Create(t.Context(), o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// update re-reads o, applies mutate and writes it, retrying on conflicts
// (the operator writes labels, finalizers and status concurrently).
func update[T client.Object](t *testing.T, o T, mutate func(T)) {
	t.Helper()
	eventually(t, fmt.Sprintf("update %T %s", o, o.GetName()), func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			return err
		}
		mutate(o)
		return k8sClient.Update(ctx, o)
	})
}

func key(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }

// conditionIs checks a condition on a fresh copy of obj: status, reason and
// a message fragment, for the current generation.
func conditionIs(obj client.Object, conds func() []metav1.Condition, typ string, status metav1.ConditionStatus, reason, msg string) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		c := meta.FindStatusCondition(conds(), typ)
		if c == nil {
			return fmt.Errorf("no %s condition; conditions: %v", typ, conds())
		}
		if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) || c.ObservedGeneration != obj.GetGeneration() {
			return fmt.Errorf("want %s=%s reason %s message containing %q at generation %d; got %s=%s reason %s message %q at generation %d",
				typ, status, reason, msg, obj.GetGeneration(), typ, c.Status, c.Reason, c.Message, c.ObservedGeneration)
		}
		return nil
	}
}

func calleeCondition(c *hcpv1alpha1.Callee, typ string, status metav1.ConditionStatus, reason, msg string) func(context.Context) error {
	return conditionIs(c, func() []metav1.Condition { return c.Status.Conditions }, typ, status, reason, msg)
}

func callerCondition(c *hcpv1alpha1.Caller, typ string, status metav1.ConditionStatus, reason, msg string) func(context.Context) error {
	return conditionIs(c, func() []metav1.Condition { return c.Status.Conditions }, typ, status, reason, msg)
}

func all(checks ...func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		for _, c := range checks {
			if err := c(ctx); err != nil {
				return err
			}
		}
		return nil
	}
}

// exists checks that o exists and, when owner is set, that owner controls it.
func exists(o client.Object, owner client.Object) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			return fmt.Errorf("%T %s: %w", o, o.GetName(), err)
		}
		if owner != nil && !metav1.IsControlledBy(o, owner) {
			return fmt.Errorf("%T %s: owner references %+v, want controller %s (uid %s)", o, o.GetName(), o.GetOwnerReferences(), owner.GetName(), owner.GetUID())
		}
		return nil
	}
}

func gone(o client.Object) func(context.Context) error {
	return func(ctx context.Context) error {
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(o), o)
		if err == nil {
			return fmt.Errorf("%T %s still exists (deletionTimestamp %v, finalizers %v)", o, o.GetName(), o.GetDeletionTimestamp(), o.GetFinalizers())
		}
		return client.IgnoreNotFound(err)
	}
}

// childNames are the names of a subject's children: base, its credentials
// Secret (with a callee's token keys) and the token Secret of an earlier
// version (legacyToken), which the operator no longer creates.
func childNames(role, name string) (base, creds, legacyToken string) {
	base = "hcp-" + role + "-" + name
	return base, base + "-credentials", base + "-token"
}

func topologyChildren(ns, base string) []client.Object {
	return []client.Object{
		&topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}},
		&topologyv1beta1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}},
		&topologyv1beta1.User{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}},
		&topologyv1beta1.Permission{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}},
		// The dead-letter queue (no Binding: the queue routes its dead
		// letters to it).
		&topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base + "-dlq"}},
	}
}

// declarePrerequisites plays the topology operator for a subject's User
// and Queue: the operator creates the Permission only once its User is
// Ready, and the Binding once its Queue is.
func declarePrerequisites(t *testing.T, ns, base string) {
	t.Helper()
	setTopologyStatus(t, &topologyv1beta1.User{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}, true, "")
	setTopologyStatus(t, &topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}, true, "")
	setTopologyStatus(t, &topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base + "-dlq"}}, true, "")
}

// limitsPolicy is a subject's queue limits Policy.
func limitsPolicy(ns, base string) *topologyv1beta1.Policy {
	return &topologyv1beta1.Policy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}
}

func policyDefinition(p *topologyv1beta1.Policy) map[string]any {
	var m map[string]any
	if p.Spec.Definition != nil {
		_ = json.Unmarshal(p.Spec.Definition.Raw, &m)
	}
	return m
}

func harnessChildren(ns, base string) []client.Object {
	out := []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}},
	}
	if strings.HasPrefix(base, "hcp-callee-") {
		// The callee sidecars' ClusterRole, bound (resource.CalleeRoleBinding).
		return append(out, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base + "-sidecar"}})
	}
	return append(out,
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}})
}

// setTopologyStatus plays the topology operator: it writes a Ready
// condition for the object's current generation.
func setTopologyStatus(t *testing.T, o client.Object, ready bool, msg string) {
	t.Helper()
	eventually(t, fmt.Sprintf("set status of %T %s", o, o.GetName()), func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			return err
		}
		return writeTopologyStatus(ctx, o, ready, msg)
	})
}

// writeTopologyStatus writes o's status as the topology operator would: a
// Ready condition for o's generation (o as read).
func writeTopologyStatus(ctx context.Context, o client.Object, ready bool, msg string) error {
	{
		cond := topologyv1beta1.Condition{Type: "Ready", Status: corev1.ConditionTrue, Reason: "SuccessfulCreateOrUpdate", LastTransitionTime: metav1.Now()}
		if !ready {
			cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, "FailedCreateOrUpdate", msg
		}
		conds := []topologyv1beta1.Condition{cond}
		gen := o.GetGeneration()
		switch x := o.(type) {
		case *topologyv1beta1.Queue:
			x.Status.Conditions, x.Status.ObservedGeneration = conds, gen
		case *topologyv1beta1.Binding:
			x.Status.Conditions, x.Status.ObservedGeneration = conds, gen
		case *topologyv1beta1.User:
			x.Status.Conditions, x.Status.ObservedGeneration = conds, gen
			x.Status.Username = "set-by-test"
		case *topologyv1beta1.Permission:
			x.Status.Conditions, x.Status.ObservedGeneration = conds, gen
		case *topologyv1beta1.Exchange:
			x.Status.Conditions, x.Status.ObservedGeneration = conds, gen
		case *topologyv1beta1.Vhost:
			x.Status.Conditions, x.Status.ObservedGeneration = conds, gen
		case *topologyv1beta1.Policy:
			x.Status.Conditions, x.Status.ObservedGeneration = conds, gen
		default:
			return fmt.Errorf("not a topology object: %T", o)
		}
		return k8sClient.Status().Update(ctx, o)
	}
}

// setDeploymentAvailable plays the Deployment controller.
func setDeploymentAvailable(t *testing.T, d *appsv1.Deployment, ready int32) {
	t.Helper()
	eventually(t, "set Deployment status", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(d), d); err != nil {
			return err
		}
		d.Status.ObservedGeneration = d.Generation
		d.Status.Replicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas, d.Status.UpdatedReplicas = ready, ready, ready, ready
		d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable", Message: "Deployment has minimum availability."}}
		return k8sClient.Status().Update(ctx, d)
	})
}

func queueArgs(q *topologyv1beta1.Queue) map[string]any {
	var m map[string]any
	if q.Spec.Arguments != nil {
		_ = json.Unmarshal(q.Spec.Arguments.Raw, &m)
	}
	return m
}

// sharedPolicy is the default event limits Policy of a vhost key, in the
// suite's shared topology home.
func sharedPolicy(key string) *topologyv1beta1.Policy {
	return &topologyv1beta1.Policy{ObjectMeta: metav1.ObjectMeta{Namespace: suiteBrokerNamespace, Name: resource.DefaultEventLimitsObjectName(key)}}
}

// declareShared plays the topology operator for the shared objects of a
// vhost key: its exchanges and its default event limits Policy.
func declareShared(t *testing.T, key string) {
	t.Helper()
	exchanges, err := sharedExchanges(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	for i := range exchanges {
		setTopologyStatus(t, &exchanges[i], true, "")
	}
	setTopologyStatus(t, sharedPolicy(key), true, "")
	for _, name := range []string{resource.DefaultCommandLimitsObjectName(key), resource.DeadLetterLimitsObjectName(key)} {
		setTopologyStatus(t, &topologyv1beta1.Policy{ObjectMeta: metav1.ObjectMeta{Namespace: suiteBrokerNamespace, Name: name}}, true, "")
	}
}

func sharedExchanges(ctx context.Context, key string) ([]topologyv1beta1.Exchange, error) {
	var l topologyv1beta1.ExchangeList
	err := k8sClient.List(ctx, &l, client.MatchingLabels{hcpv1alpha1.LabelVhostKey: key})
	return l.Items, err
}
