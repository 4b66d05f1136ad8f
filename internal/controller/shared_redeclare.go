package controller

import (
	"context"
	"sync"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

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

// bindingAnnotations are the annotations of v's Binding: the redeclare
// epoch of key, or, when this process has none (it started after the
// exchange loss), the one the live Binding carries, so that server-side
// apply does not remove it (an update that would make the topology
// operator declare the binding once more for nothing).
func (c *core) bindingAnnotations(ctx context.Context, v view, key string) (map[string]string, error) {
	if a := c.redeclareAnnotations(key); a != nil {
		return a, nil
	}
	live := &topologyv1beta1.Binding{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: v.sub.Namespace, Name: v.sub.BaseName()}, live); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if e := live.Annotations[annotationRedeclare]; e != "" {
		return map[string]string{annotationRedeclare: e}, nil
	}
	return nil, nil
}

// redeclareAnnotations are set on a user's Binding after its exchange was
// lost.
func (c *core) redeclareAnnotations(key string) map[string]string {
	if e := c.epochs.get(key); e != "" {
		return map[string]string{annotationRedeclare: e}
	}
	return nil
}

// exchangeLossHandler watches the shared Exchange, Vhost and default
// limits Policy objects. Any event requeues the users of that key in the
// object's namespace (their TopologyReady reads it). A deletion while the
// key is still in use anywhere also records an epoch and requeues every
// user of the key, so that they re-create and re-declare what the topology
// operator deleted on the broker.
func (c *core) exchangeLossHandler() handler.EventHandler {
	users := func(ctx context.Context, key, ns string, live bool) []reconcile.Request {
		list := c.newList()
		opts := []client.ListOption{client.MatchingFields{indexVhostKey: key}, client.UnsafeDisableDeepCopy}
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
	// The users of an object in the home namespace are everywhere.
	usersNamespace := func(o client.Object) string {
		if o.GetNamespace() == c.operatorNamespace() {
			return ""
		}
		return o.GetNamespace()
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, users(ctx, e.Object.GetLabels()[hcpv1alpha1.LabelVhostKey], usersNamespace(e.Object), false))
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, users(ctx, e.ObjectNew.GetLabels()[hcpv1alpha1.LabelVhostKey], usersNamespace(e.ObjectNew), false))
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			key := e.Object.GetLabels()[hcpv1alpha1.LabelVhostKey]
			if key == "" || e.Object.GetAnnotations()[annotationOrphaned] == "true" {
				// An adopted legacy object: nothing was deleted on the
				// broker.
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
