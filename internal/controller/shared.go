package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// Shared per-vhost objects.
//
// The exchanges hcp.commands and hcp.events belong to a (broker, vhost)
// pair, which Callees and Callers of several namespaces may use. The
// topology operator has no retain policy for exchanges: deleting an Exchange
// object deletes the exchange on the broker with all its bindings. So:
//
//   - every namespace with a user of the pair gets its own pair of Exchange
//     objects (hcp-commands-KEY, hcp-events-KEY), labelled with the vhost
//     key and owned by no one (garbage collection must not take them when
//     one user goes);
//   - a user's finalizer deletes them, in every namespace, only when no other
//     Callee or Caller anywhere still holds an id in the pair; otherwise they
//     stay (also in namespaces with no user left: harmless, and gone with
//     the last user);
//   - if an Exchange object is deleted anyway (say, with its namespace)
//     while the pair is still used, the remaining users re-create theirs and
//     make the topology operator declare exchanges and bindings again
//     (annotationRedeclare).
//
// A Vhost object (spec.broker.createVhost) is shared the same way; its
// deletionPolicy is retain unless every user in the namespace that asked for
// it asked for delete.

// epochs remembers, per vhost key, the UID of the last shared Exchange
// object deleted while the key was still in use.
type epochs struct {
	mu sync.Mutex
	m  map[string]string
}

func (e *epochs) get(key string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m[key]
}

func (e *epochs) set(key, v string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[string]string{}
	}
	e.m[key] = v
}

// ensureShared applies the vhost's shared objects in v's namespace and
// returns those v depends on (for TopologyReady).
func (c *core) ensureShared(ctx context.Context, v view, b resource.Broker) ([]client.Object, error) {
	ns := v.obj.GetNamespace()
	key := b.Key()
	var out []client.Object
	if b.CreateVhost {
		policy, err := c.vhostDeletionPolicy(ctx, key, ns)
		if err != nil {
			return nil, err
		}
		vh, err := c.apply(ctx, nil, resource.Vhost(ns, b, policy))
		if err != nil {
			return nil, err
		}
		out = append(out, vh)
	}
	cmd, evt := resource.Exchanges(ns, b)
	for _, x := range []*topologyv1beta1.Exchange{cmd, evt} {
		if e := c.epochs.get(key); e != "" {
			x.Annotations = map[string]string{annotationRedeclare: e}
		}
		live, err := c.apply(ctx, nil, x)
		if err != nil {
			return nil, err
		}
		out = append(out, live)
	}
	return out, nil
}

// vhostDeletionPolicy is delete only if every user of key in namespace that
// asks for the vhost asks for delete; deleting a vhost deletes everything
// in it.
func (c *core) vhostDeletionPolicy(ctx context.Context, key, namespace string) (string, error) {
	users, err := c.usersOfKey(ctx, key, namespace, "")
	if err != nil {
		return "", err
	}
	policy := resource.DeletionPolicyRetain
	for _, u := range users {
		uv, _ := viewOf(u)
		if !uv.broker.CreateVhost {
			continue
		}
		if uv.broker.VhostDeletionPolicy != resource.DeletionPolicyDelete {
			return resource.DeletionPolicyRetain, nil
		}
		policy = resource.DeletionPolicyDelete
	}
	return policy, nil
}

// redeclareAnnotations are set on a user's Binding after its exchange was
// lost.
func (c *core) redeclareAnnotations(key string) map[string]string {
	if e := c.epochs.get(key); e != "" {
		return map[string]string{annotationRedeclare: e}
	}
	return nil
}

// exchangeLossHandler watches the shared Exchange and Vhost objects. Any
// event requeues the users of that key in the object's namespace (their
// TopologyReady reads it). A deletion while the key is still in use
// anywhere also records an epoch and requeues every user of the key, so
// that they re-create and re-declare what the topology operator deleted on
// the broker.
func (c *core) exchangeLossHandler() handler.EventHandler {
	users := func(ctx context.Context, key, ns string, live bool) []reconcile.Request {
		list := c.newList()
		opts := []client.ListOption{client.MatchingFields{indexVhostKey: key}}
		if ns != "" {
			opts = append(opts, client.InNamespace(ns))
		}
		if err := c.List(ctx, list, opts...); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Failed to list users of a vhost key", "vhostKey", key)
			return nil
		}
		var reqs []reconcile.Request
		for _, o := range listItems(list) {
			if claimed(o, key) && (!live || o.GetDeletionTimestamp().IsZero()) {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)})
			}
		}
		return reqs
	}
	add := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], reqs []reconcile.Request) {
		for _, r := range reqs {
			q.Add(r)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, users(ctx, e.Object.GetLabels()[hcpv1alpha1.LabelVhostKey], e.Object.GetNamespace(), false))
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, users(ctx, e.ObjectNew.GetLabels()[hcpv1alpha1.LabelVhostKey], e.ObjectNew.GetNamespace(), false))
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			key := e.Object.GetLabels()[hcpv1alpha1.LabelVhostKey]
			if key == "" {
				return
			}
			// Users not being deleted: none means this is the last
			// user's own cleanup.
			all := users(ctx, key, "", true)
			if len(all) == 0 {
				return
			}
			if _, ok := e.Object.(*topologyv1beta1.Exchange); ok {
				c.epochs.set(key, string(e.Object.GetUID()))
				ctrl.LoggerFrom(ctx).Info("Shared exchange object deleted while its vhost is in use; re-declaring",
					"exchange", klog.KObj(e.Object), "vhostKey", key, "users", len(all))
			}
			add(q, all)
		},
	}
}

// finalize runs when a Callee or Caller that holds its id is deleted. It
// deletes the object's own topology objects and waits until the topology
// operator has removed them from the broker; then, if no other Callee or
// Caller uses the (broker, vhost) pair, it deletes the pair's shared
// objects everywhere; then it lets the object go. The Deployment, Secrets
// and RBAC objects go by garbage collection.
func (c *core) finalize(ctx context.Context, v view, owned []client.Object) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	if !controllerutil.ContainsFinalizer(v.obj, TopologyFinalizer) {
		return ctrl.Result{}, nil
	}
	key := v.obj.GetLabels()[hcpv1alpha1.LabelVhostKey]

	// An object that lost its id after all (see idHolder) leaves its
	// topology objects to the holder: deleting them would delete the
	// holder's queue and user on the broker.
	if key != "" {
		holder, err := c.idHolder(ctx, v, key)
		if err != nil {
			return ctrl.Result{}, err
		}
		if holder != nil {
			for _, o := range owned {
				if err := c.orphan(ctx, v.obj, o); err != nil {
					return ctrl.Result{}, err
				}
			}
			c.recorder.Eventf(v.obj, nil, corev1.EventTypeWarning, hcpv1alpha1.ReasonIDConflict, "Delete",
				"Left the topology objects to %s, which holds the same id", describe(holder))
			return ctrl.Result{}, c.removeFinalizer(ctx, v)
		}
	}

	var waiting []string
	for _, o := range owned {
		err := c.Get(ctx, client.ObjectKeyFromObject(o), o)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return ctrl.Result{}, err
		}
		if o.GetDeletionTimestamp().IsZero() {
			if err := c.deleteOwned(ctx, v.obj, o); err != nil {
				return ctrl.Result{}, err
			}
		}
		waiting = append(waiting, c.kindOf(o)+" "+o.GetName()+notReadyDetail(o))
	}
	if len(waiting) > 0 {
		log.V(1).Info("Waiting for the topology operator to delete topology objects", "objects", waiting)
		c.setDeletingCondition(v, "waiting for the messaging-topology-operator to delete "+strings.Join(waiting, "; "))
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
	}

	if key != "" {
		others, err := c.usersOfKey(ctx, key, "", v.obj.GetUID())
		if err != nil {
			return ctrl.Result{}, err
		}
		if len(others) == 0 {
			if err := c.deleteShared(ctx, v, key); err != nil {
				return ctrl.Result{}, err
			}
		} else {
			log.Info("Kept the shared exchanges: the vhost is still in use", "vhostKey", key, "users", len(others), "example", describe(others[0]))
		}
	}
	return ctrl.Result{}, c.removeFinalizer(ctx, v)
}

// deleteShared deletes every shared object of key, in every namespace.
func (c *core) deleteShared(ctx context.Context, v view, key string) error {
	sel := client.MatchingLabels{hcpv1alpha1.LabelVhostKey: key, hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue}
	var deleted []string
	for _, l := range []client.ObjectList{&topologyv1beta1.ExchangeList{}, &topologyv1beta1.VhostList{}} {
		if err := c.List(ctx, l, sel); err != nil {
			return err
		}
		for _, o := range listItems(l) {
			if !o.GetDeletionTimestamp().IsZero() {
				continue
			}
			if err := c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
				return err
			}
			deleted = append(deleted, c.kindOf(o)+" "+klog.KObj(o).String())
		}
	}
	if len(deleted) > 0 {
		ctrl.LoggerFrom(ctx).Info("Deleted the shared objects of a vhost no longer used", "vhostKey", key, "objects", deleted)
		c.recorder.Eventf(v.obj, nil, corev1.EventTypeNormal, "DeletedSharedTopology", "Delete",
			"Last user of vhost %q on this broker: deleted %s", resource.VhostOf(v.broker), strings.Join(deleted, ", "))
	}
	return nil
}

// orphan removes owner's controller reference from o so that garbage
// collection keeps it.
func (c *core) orphan(ctx context.Context, owner, o client.Object) error {
	if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(o, owner) {
		return nil
	}
	orig := o.DeepCopyObject().(client.Object)
	if err := controllerutil.RemoveOwnerReference(owner, o, c.scheme); err != nil {
		return err
	}
	return c.Patch(ctx, o, client.MergeFrom(orig))
}

func (c *core) removeFinalizer(ctx context.Context, v view) error {
	orig := v.obj.DeepCopyObject().(client.Object)
	if !controllerutil.RemoveFinalizer(v.obj, TopologyFinalizer) {
		return nil
	}
	if err := c.Patch(ctx, v.obj, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return client.IgnoreNotFound(err)
	}
	ctrl.LoggerFrom(ctx).Info("Removed the topology finalizer")
	return nil
}

// setDeletingCondition reports what deletion waits for, on the status.
func (c *core) setDeletingCondition(v view, msg string) {
	setCondition(v, hcpv1alpha1.ConditionReady, false, hcpv1alpha1.ReasonDeleting, msg)
}

func notReadyDetail(o client.Object) string {
	if ready, msg := topologyObjectReady(o); !ready && msg != "" && !strings.HasPrefix(msg, "not yet") {
		return fmt.Sprintf(" (%s)", msg)
	}
	return ""
}
