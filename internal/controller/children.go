package controller

import (
	"reflect"
	"slices"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// The children of a Callee or Caller.
//
// Every kind of object a harness kind owns is one row of childKinds. The
// row says which group the child belongs to and, for the children applied
// by the generic step (applyChildren), how to build it from desiredInput:
// a pure function of the spec and of what was resolved before (broker,
// queue as declared, harness parameters). A nil result means "not wanted":
// a child of that kind the object controls is deleted. From the table come
// the controllers' Owns watches (watchChildren), the objects the finalizer
// deletes (topologyObjects) and those a Caller loses when it turns
// external (the harness group).
//
// Adding a child type: a builder in internal/resource (with a golden
// test), one row here, and the RBAC marker on CalleeReconciler. See
// docs/operator.md, "The reconciler: one shape for Callees and Callers".

// childGroup is the step of the reconcile that applies a child.
type childGroup int

const (
	// groupTopology children are topology operator objects: applied after
	// the credentials Secret, deleted by the finalizer, which waits until
	// the topology operator has removed them from the broker.
	groupTopology childGroup = iota
	// groupHarness children are the harness and what its pods need:
	// applied once the TLS Secrets check out; garbage collected.
	groupHarness
	// groupOther children are owned and watched but applied by their own
	// step, whose inputs are not pure (a generated password or key).
	groupOther
)

// desiredInput is everything the builders read.
type desiredInput struct {
	sub    resource.Subject
	broker resource.Broker
	// queue is the role's queue as declared (queueAsDeclared).
	queue *topologyv1beta1.Queue
	// bindingAnnotations make the topology operator declare the binding
	// again (redeclareAnnotations).
	bindingAnnotations map[string]string
	// harness is nil for an external Caller: no harness children.
	harness *resource.HarnessParams
	// pdb is spec.harness.podDisruptionBudget.
	pdb *hcpv1alpha1.PodDisruptionBudgetSpec
}

// childKind is one row of the children table.
type childKind struct {
	group childGroup
	// empty returns an empty object of the kind.
	empty func() client.Object
	// build returns the desired child, or nil when none is wanted. A row
	// without build is applied by a step of its own (see the row); the
	// generic step skips it, the watches and the finalizer do not.
	build func(in desiredInput) client.Object
	// upToDate, when set, decides whether the live child needs no apply;
	// otherwise holdsApplied's generic comparison decides (applyChild).
	upToDate func(live, desired client.Object) bool
	// createAfter, when set, holds back the creation of a child until it
	// returns true for the children of the group applied before it (an
	// existing child is always applied).
	createAfter func(applied []client.Object) bool
	// name, when set, names the child (default: the subject's BaseName):
	// for a second child of one kind (the dead-letter Queue and Binding).
	name func(resource.Subject) string
}

// childName is the name of the child of kind k of subject s.
func (k *childKind) childName(s resource.Subject) string {
	if k.name != nil {
		return k.name(s)
	}
	return s.BaseName()
}

// childKinds is the children table, in the order children are applied
// within a group: a Queue before its Binding, a User before its
// Permission, the ServiceAccount and RBAC before the Deployment.
var childKinds = []childKind{
	{group: groupTopology, empty: func() client.Object { return &topologyv1beta1.Queue{} },
		build: func(in desiredInput) client.Object { return in.queue }},
	// A Binding declared before its Queue fails (404 not_found: no
	// queue) and waits out the same back-off: at 1,000 Callees + 1,000
	// Callers, with the topology operator declaring queues one at a time,
	// most Bindings did. It is created once its Queue is Ready.
	{group: groupTopology, empty: func() client.Object { return &topologyv1beta1.Binding{} },
		build: func(in desiredInput) client.Object {
			b := resource.Binding(in.sub, in.broker)
			b.Annotations = in.bindingAnnotations
			return b
		},
		createAfter: readyApplied[*topologyv1beta1.Queue]},
	// The dead-letter queue, and its binding to hcp.dlx only for a queue
	// declared before its dead letters went straight to it
	// (resource/deadletter.go).
	{group: groupTopology, empty: func() client.Object { return &topologyv1beta1.Queue{} },
		build: func(in desiredInput) client.Object { return resource.DeadLetterQueue(in.sub, in.broker) },
		name:  resource.DeadLetterQueueObjectName},
	{group: groupTopology, empty: func() client.Object { return &topologyv1beta1.Binding{} },
		build: func(in desiredInput) client.Object {
			if !resource.NeedsDeadLetterBinding(argumentsOf(in.queue.Spec.Arguments)) {
				return nil
			}
			return resource.DeadLetterBinding(in.sub, in.broker)
		},
		name:        resource.DeadLetterQueueObjectName,
		createAfter: readyDeadLetterQueue},
	{group: groupTopology, empty: func() client.Object { return &topologyv1beta1.User{} },
		build: func(in desiredInput) client.Object { return resource.User(in.sub, in.broker) }},
	// A Permission the topology operator declares before its User fails
	// (vhost_or_user_not_found) and waits out the topology operator's
	// back-off, up to 1,000 s: it is created once the User is Ready.
	{group: groupTopology, empty: func() client.Object { return &topologyv1beta1.Permission{} },
		build:       func(in desiredInput) client.Object { return resource.Permission(in.sub, in.broker) },
		createAfter: readyApplied[*topologyv1beta1.User]},
	// The limits Policy keeps the webhook-immutable fields of the live
	// object: applied by ensureLimitsPolicy.
	{group: groupTopology, empty: func() client.Object { return &topologyv1beta1.Policy{} }},
	// Credentials (a generated password) and token keys (generated keys).
	{group: groupOther, empty: func() client.Object { return &corev1.Secret{} }},
	{group: groupHarness, empty: func() client.Object { return &corev1.ServiceAccount{} },
		build: ifHarness(func(in desiredInput) client.Object { return resource.ServiceAccount(in.sub) })},
	// A callee's rights: its RoleBinding to the callee sidecars'
	// ClusterRole, created before a Role and RoleBinding of its own from
	// before are deleted (the rows below build none for a callee).
	{group: groupHarness, empty: func() client.Object { return &rbacv1.RoleBinding{} },
		build: ifHarness(func(in desiredInput) client.Object {
			return nilIfNone(resource.CalleeRoleBinding(in.sub, in.harness.SidecarClusterRole))
		}),
		name: resource.Subject.SidecarRoleBindingName},
	// A caller's: a Role naming its own Caller, and its RoleBinding.
	{group: groupHarness, empty: func() client.Object { return &rbacv1.Role{} },
		build:    ifHarness(func(in desiredInput) client.Object { return nilIfNone(resource.Role(in.sub)) }),
		upToDate: roleUpToDate},
	{group: groupHarness, empty: func() client.Object { return &rbacv1.RoleBinding{} },
		build: ifHarness(func(in desiredInput) client.Object { return nilIfNone(resource.RoleBinding(in.sub)) })},
	{group: groupHarness, empty: func() client.Object { return &policyv1.PodDisruptionBudget{} },
		build: ifHarness(func(in desiredInput) client.Object {
			if in.pdb == nil {
				return nil
			}
			return resource.PodDisruptionBudget(in.sub, *in.pdb)
		})},
	{group: groupHarness, empty: func() client.Object { return &appsv1.Deployment{} },
		build:    ifHarness(func(in desiredInput) client.Object { return resource.Deployment(*in.harness) }),
		upToDate: deploymentUpToDate},
}

// readyApplied: the applied child of type T is Ready for the topology
// operator (topologyObjectReady).
func readyApplied[T client.Object](applied []client.Object) bool {
	for _, o := range applied {
		if t, ok := o.(T); ok {
			ready, _ := topologyObjectReady(t)
			return ready
		}
	}
	return false
}

// readyDeadLetterQueue: the applied dead-letter Queue (its broker-side
// name starts with hcp.dlq.) is Ready for the topology operator.
func readyDeadLetterQueue(applied []client.Object) bool {
	for _, o := range applied {
		if q, ok := o.(*topologyv1beta1.Queue); ok && strings.HasPrefix(q.Spec.Name, topology.DeadLetterQueuePrefix) {
			ready, _ := topologyObjectReady(q)
			return ready
		}
	}
	return false
}

// nilIfNone turns a builder's nil pointer into a nil client.Object.
func nilIfNone[T interface {
	client.Object
	comparable
}](o T) client.Object {
	var none T
	if o == none {
		return nil
	}
	return o
}

// ifHarness builds nothing for an object without a harness.
func ifHarness(build func(desiredInput) client.Object) func(desiredInput) client.Object {
	return func(in desiredInput) client.Object {
		if in.harness == nil {
			return nil
		}
		return build(in)
	}
}

// desiredChild is a child the generic step applies (obj not nil) or
// deletes when its owner controls it (obj nil: empty holds its name).
type desiredChild struct {
	kind  *childKind
	obj   client.Object
	empty client.Object
}

// desiredChildren builds the children of group from in: a pure function
// (no reads), in table order.
func desiredChildren(group childGroup, in desiredInput) []desiredChild {
	var out []desiredChild
	for i := range childKinds {
		k := &childKinds[i]
		if k.group != group || k.build == nil {
			continue
		}
		empty := k.empty()
		empty.SetNamespace(in.sub.Namespace)
		empty.SetName(k.childName(in.sub))
		out = append(out, desiredChild{kind: k, obj: k.build(in), empty: empty})
	}
	return out
}

// topologyObjects are the topology operator objects a subject owns, empty
// but for their names, dependents first (a Permission before its User, a
// Binding before its Queue): the finalizer deletes them and waits.
func topologyObjects(s resource.Subject) []client.Object {
	var out []client.Object
	for _, k := range slices.Backward(childKinds) {
		if k.group != groupTopology {
			continue
		}
		o := k.empty()
		o.SetNamespace(s.Namespace)
		o.SetName(k.childName(s))
		out = append(out, o)
	}
	return out
}

// watchChildren adds to b what a Callee and a Caller (owner, an empty
// one) both own and watch: every kind of childKinds (a topology child
// that becomes Ready puts its owner first and holds first statuses longer:
// readyFirst), the shared
// topology objects, and the Secrets they use.
func (c *core) watchChildren(b *builder.Builder, owner client.Object) *builder.Builder {
	// What Owns uses, with a child becoming Ready put first.
	toOwner := readyFirst(handler.EnqueueRequestForOwner(c.scheme, c.RESTMapper(), owner, handler.OnlyControllerOwner()), c.pace.progress)
	watched := map[reflect.Type]bool{} // one watch per kind, however many rows
	for _, k := range childKinds {
		t := reflect.TypeOf(k.empty())
		if watched[t] {
			continue
		}
		watched[t] = true
		if k.group != groupTopology {
			b = b.Owns(k.empty(), builder.WithPredicates(childChanged()))
			continue
		}
		b = b.Watches(k.empty(), toOwner, builder.WithPredicates(childChanged()))
	}
	return b.
		Watches(&topologyv1beta1.Exchange{}, c.exchangeLossHandler()).
		Watches(&topologyv1beta1.Vhost{}, c.exchangeLossHandler()).
		// The vhost's default event limits Policy, not a queue's own.
		Watches(&topologyv1beta1.Policy{}, c.exchangeLossHandler(), builder.WithPredicates(sharedObject())).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(c.mapSecret))
}
