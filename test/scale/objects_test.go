//go:build e2e

package scale

import (
	"crypto/ed25519"
	"fmt"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// The benchmark's Callees and Callers: harness replicas 0 (no pods), the
// run's own vhost, created by the operator (createVhost) and retained, so
// that after cleanup the broker can be asked what is left in it.

func objectName(i int) string { return fmt.Sprintf("s%04d", i) }

func harness(image string) hcpv1alpha1.HarnessSpec {
	return hcpv1alpha1.HarnessSpec{
		Replicas: new(int32(0)),
		Port:     8080,
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "harness", Image: image}},
		}},
	}
}

func newCallee(ns, name, vhost string) *hcpv1alpha1.Callee {
	return &hcpv1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: hcpv1alpha1.CalleeSpec{
			Broker: hcpv1alpha1.BrokerSpec{Vhost: vhost, CreateVhost: true},
			Capabilities: []hcpv1alpha1.Capability{{
				Name: "scale.noop", RiskLevel: "R1", DataClassification: "T1", MaxDuration: "PT5M",
			}},
			Harness: harness("ghcr.io/hcp-io/hcp-sample-callee:latest"),
		},
	}
}

func newCaller(ns, name, vhost string) *hcpv1alpha1.Caller {
	h := harness("ghcr.io/hcp-io/hcp-sample-caller:latest")
	return &hcpv1alpha1.Caller{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: hcpv1alpha1.CallerSpec{
			Broker:  hcpv1alpha1.BrokerSpec{Vhost: vhost, CreateVhost: true},
			Harness: &h,
		},
	}
}

// The baseline: what the operator creates for a Callee or a Caller, built
// by the same pure builders (internal/resource) the reconcilers use, in the
// order they apply it. The Callees and Callers themselves are never
// created in the baseline namespace, so the owner references are dropped
// (the garbage collector would delete children of a missing owner).

// sharedObjects are the vhost's shared objects, in home: the copy of the
// connection Secret, the Vhost, the two Exchanges and the dead-letter
// exchange, the default event and command limits Policies and the
// dead-letter queues' limits Policy.
func sharedObjects(home string, b resource.Broker, conn *corev1.Secret) []client.Object {
	ref := resource.SharedReference(home, home, b)
	cmd, evt := resource.Exchanges(home, b, ref)
	return []client.Object{
		resource.SharedConnectionSecret(home, b.Key(), conn),
		resource.Vhost(home, b, ref, resource.DeletionPolicyRetain),
		cmd, evt, resource.DeadLetterExchange(home, b, ref),
		resource.DefaultEventLimitsPolicy(home, b, ref),
		resource.DefaultCommandLimitsPolicy(home, b, ref), resource.DeadLetterLimitsPolicy(home, b, ref),
	}
}

func generateKey() (ed25519.PrivateKey, error) {
	_, sk, err := token.GenerateKey()
	return sk, err
}

// calleeChildren is what CalleeReconciler applies for c: the credentials
// Secret with the token keys, Queue, Binding, the dead-letter Queue (its
// routing is the queue's: no Binding), User, Permission, the limits Policy
// when the spec sets limits, then
// ServiceAccount, Role, RoleBinding and the Deployment.
func calleeChildren(c *hcpv1alpha1.Callee, b resource.Broker, password string) ([]client.Object, error) {
	sub := resource.ForCallee(c)
	creds, err := resource.CredentialsSecret(sub, b, password)
	if err != nil {
		return nil, err
	}
	keys, err := resource.NextTokenKeys(resource.TokenKeys{}, "", generateKey)
	if err != nil {
		return nil, err
	}
	objs := []client.Object{resource.WithTokenKeys(creds, keys),
		resource.CalleeQueue(c, b), resource.Binding(sub, b), resource.DeadLetterQueue(sub, b),
		resource.User(sub, b), resource.Permission(sub, b)}
	if p := resource.CalleeLimitsPolicy(c, b); p != nil {
		objs = append(objs, p)
	}
	objs = append(objs, harnessChildren(resource.HarnessParams{
		Subject: sub, Harness: c.Spec.Harness, Sidecar: c.Spec.Sidecar, Vhost: b.Vhost,
		Prefetch: int32(config.DefaultCalleePrefetch),
	})...)
	return orphaned(objs), nil
}

// callerChildren is what CallerReconciler applies for c.
func callerChildren(c *hcpv1alpha1.Caller, b resource.Broker, password string) ([]client.Object, error) {
	sub := resource.ForCaller(c)
	creds, err := resource.CredentialsSecret(sub, b, password)
	if err != nil {
		return nil, err
	}
	q, err := resource.CallerQueue(c, b)
	if err != nil {
		return nil, err
	}
	objs := []client.Object{creds, q, resource.Binding(sub, b), resource.DeadLetterQueue(sub, b),
		resource.User(sub, b), resource.Permission(sub, b)}
	p, err := resource.CallerLimitsPolicy(c, b)
	if err != nil {
		return nil, err
	}
	if p != nil {
		objs = append(objs, p)
	}
	prefetch := c.Spec.Consumer.Prefetch
	if prefetch == 0 {
		prefetch = config.DefaultCallerPrefetch
	}
	objs = append(objs, harnessChildren(resource.HarnessParams{
		Subject: sub, Harness: *c.Spec.Harness, Sidecar: c.Spec.Sidecar, Vhost: b.Vhost,
		Prefetch: prefetch, AppMaxBatch: c.Spec.Consumer.AppMaxBatch,
	})...)
	return orphaned(objs), nil
}

func harnessChildren(p resource.HarnessParams) []client.Object {
	objs := []client.Object{resource.ServiceAccount(p.Subject)}
	if p.Subject.Role == topology.RoleCallee {
		objs = append(objs, resource.CalleeRoleBinding(p.Subject, resource.DefaultCalleeSidecarClusterRole))
	} else {
		objs = append(objs, resource.Role(p.Subject), resource.RoleBinding(p.Subject))
	}
	if spec := p.Harness.PodDisruptionBudget; spec != nil {
		objs = append(objs, resource.PodDisruptionBudget(p.Subject, *spec))
	}
	return append(objs, resource.Deployment(p))
}

func orphaned(objs []client.Object) []client.Object {
	for _, o := range objs {
		o.SetOwnerReferences(nil)
	}
	return objs
}

// withUID gives an object that is never created the UID its children's
// builders read.
func withUID[T client.Object](o T) T {
	o.SetUID(uuid.NewUUID())
	return o
}

// kind is one kind of object the operator creates: how to list it, and
// for the topology operator's kinds whether an object is Ready.
type kind struct {
	name  string
	list  func() client.ObjectList
	ready func(client.Object) bool // nil: not a topology object
}

func mtoReady(gen, observed int64, conds []topologyv1beta1.Condition) bool {
	if observed < gen {
		return false
	}
	for _, c := range conds {
		if c.Type == "Ready" {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// childKinds are the kinds of the operator's children and shared objects,
// topology kinds first.
var childKinds = []kind{
	{"Vhost", func() client.ObjectList { return &topologyv1beta1.VhostList{} }, func(o client.Object) bool {
		x := o.(*topologyv1beta1.Vhost)
		return mtoReady(x.Generation, x.Status.ObservedGeneration, x.Status.Conditions)
	}},
	{"Exchange", func() client.ObjectList { return &topologyv1beta1.ExchangeList{} }, func(o client.Object) bool {
		x := o.(*topologyv1beta1.Exchange)
		return mtoReady(x.Generation, x.Status.ObservedGeneration, x.Status.Conditions)
	}},
	{"Queue", func() client.ObjectList { return &topologyv1beta1.QueueList{} }, func(o client.Object) bool {
		x := o.(*topologyv1beta1.Queue)
		return mtoReady(x.Generation, x.Status.ObservedGeneration, x.Status.Conditions)
	}},
	{"Binding", func() client.ObjectList { return &topologyv1beta1.BindingList{} }, func(o client.Object) bool {
		x := o.(*topologyv1beta1.Binding)
		return mtoReady(x.Generation, x.Status.ObservedGeneration, x.Status.Conditions)
	}},
	{"User", func() client.ObjectList { return &topologyv1beta1.UserList{} }, func(o client.Object) bool {
		x := o.(*topologyv1beta1.User)
		return mtoReady(x.Generation, x.Status.ObservedGeneration, x.Status.Conditions)
	}},
	{"Permission", func() client.ObjectList { return &topologyv1beta1.PermissionList{} }, func(o client.Object) bool {
		x := o.(*topologyv1beta1.Permission)
		return mtoReady(x.Generation, x.Status.ObservedGeneration, x.Status.Conditions)
	}},
	{"Policy", func() client.ObjectList { return &topologyv1beta1.PolicyList{} }, func(o client.Object) bool {
		x := o.(*topologyv1beta1.Policy)
		return mtoReady(x.Generation, x.Status.ObservedGeneration, x.Status.Conditions)
	}},
	{"Secret", func() client.ObjectList { return &corev1.SecretList{} }, nil},
	{"ServiceAccount", func() client.ObjectList { return &corev1.ServiceAccountList{} }, nil},
	{"Role", func() client.ObjectList { return &rbacv1.RoleList{} }, nil},
	{"RoleBinding", func() client.ObjectList { return &rbacv1.RoleBindingList{} }, nil},
	{"PodDisruptionBudget", func() client.ObjectList { return &policyv1.PodDisruptionBudgetList{} }, nil},
	{"Deployment", func() client.ObjectList { return &appsv1.DeploymentList{} }, nil},
}

// ownKinds are the operator's own kinds.
var ownKinds = []kind{
	{"Callee", func() client.ObjectList { return &hcpv1alpha1.CalleeList{} }, nil},
	{"Caller", func() client.ObjectList { return &hcpv1alpha1.CallerList{} }, nil},
}
