package controller

import (
	"context"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

const calleeKind = "Callee"

func requestsFor(objs []client.Object, except types.UID) []reconcile.Request {
	var reqs []reconcile.Request
	for _, o := range objs {
		if o.GetUID() != except {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)})
		}
	}
	return reqs
}

// mapSecret requeues the Callees (or Callers) that use a Secret when it
// appears, changes (a label added, a uri changed, a certificate renewed) or
// goes: as their connection Secret, directly or through the manager's
// default, or in spec.broker.tls.
func (c *core) mapSecret(ctx context.Context, obj client.Object) []reconcile.Request {
	if metav1IsControlledByOperator(obj) {
		return nil // our own Secrets: Owns() handles them
	}
	key := obj.GetNamespace() + "/" + obj.GetName()
	var reqs []reconcile.Request
	seen := map[types.UID]bool{}
	for _, index := range []string{indexConnectionSecret, indexTLSSecret} {
		list := c.newList()
		if err := c.List(ctx, list, client.MatchingFields{index: key}, client.UnsafeDisableDeepCopy); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Failed to list the users of a Secret", "index", index)
			continue
		}
		for _, o := range listItems(list) {
			if !seen[o.GetUID()] {
				seen[o.GetUID()] = true
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)})
			}
		}
	}
	return reqs
}

func metav1IsControlledByOperator(obj client.Object) bool {
	return obj.GetLabels()[hcpv1alpha1.LabelManagedBy] == hcpv1alpha1.ManagedByValue
}

// mapIDPeers requeues the other objects claiming the same id in the same
// vhost, so that one waiting on an IDConflict takes over when the holder
// goes.
func (c *core) mapIDPeers(ctx context.Context, obj client.Object) []reconcile.Request {
	v, ok := viewOf(obj)
	if !ok {
		return nil
	}
	list := c.newList()
	if err := c.List(ctx, list, client.MatchingFields{indexIDVhost: idVhost(v.sub.ID, v.broker)}, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list id peers")
		return nil
	}
	return requestsFor(listItems(list), obj.GetUID())
}

// mapSession maps an HCPSession to its Callee: through its controller
// reference when the sidecar set one, else by callee id in its namespace.
func (r *CalleeReconciler) mapSession(ctx context.Context, obj client.Object) []reconcile.Request {
	return calleeOfSession(ctx, r.Client, obj)
}

func calleeOfSession(ctx context.Context, c client.Reader, obj client.Object) []reconcile.Request {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.Kind == calleeKind && ref.APIVersion == hcpv1alpha1.GroupVersion.String() {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}}}
		}
	}
	s, ok := obj.(*hcpv1alpha1.HCPSession)
	if !ok || s.Spec.CalleeID == "" {
		return nil
	}
	var list hcpv1alpha1.CalleeList
	if err := c.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.MatchingFields{indexCalleeID: s.Spec.CalleeID}, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to find the Callee of a session")
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// sessionActivityChanged passes HCPSession events that change a Callee's
// active-session count or a pod's: creation, deletion, entering a terminal
// state, and moving to another pod (status.podName). Progress updates (up
// to one per second per session) do not pass.
func sessionActivityChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		DeleteFunc: func(event.DeleteEvent) bool { return true },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*hcpv1alpha1.HCPSession)
			n, ok2 := e.ObjectNew.(*hcpv1alpha1.HCPSession)
			return !ok1 || !ok2 || o.Status.State.IsTerminal() != n.Status.State.IsTerminal() ||
				o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() || o.Status.PodName != n.Status.PodName
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// onCreate passes creations only.
func onCreate() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return true },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// sharedObject passes a vhost's shared objects (labelled with the vhost
// key), not a Callee's or Caller's own.
func sharedObject() predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[hcpv1alpha1.LabelVhostKey] != ""
	})
}

// ownUpdate passes the events of a Callee or Caller that can change what
// its reconcile does: all but an update of its status alone (with its
// resourceVersion and managed fields), which the reconcile itself wrote.
// It tells memo (nil: none) of each version the cache receives.
func ownUpdate(memo *statusMemo) predicate.Predicate {
	p := updateUnless(func(o client.Object) {
		switch o := o.(type) {
		case *hcpv1alpha1.Callee:
			o.Status = hcpv1alpha1.CalleeStatus{}
		case *hcpv1alpha1.Caller:
			o.Status = hcpv1alpha1.CallerStatus{}
		}
	})
	pass := p.UpdateFunc
	p.UpdateFunc = func(e event.UpdateEvent) bool {
		if e.ObjectNew != nil {
			memo.seen(e.ObjectNew, false)
		}
		return pass(e)
	}
	p.DeleteFunc = func(e event.DeleteEvent) bool {
		memo.seen(e.Object, true)
		return true
	}
	return p
}

// childChanged passes the events of an owned child that can change what
// its owner's reconcile does: its deletion, and an update of anything but
// the bookkeeping of the API server and of other controllers
// (resourceVersion, managed fields, finalizers: the topology operator adds
// its own to each object it declares). Its creation does not pass: the
// reconcile that applied it took it into account, and a child that is not
// ready yet reports it with an update of its status; on start the owners
// are reconciled from their own creation events.
func childChanged() predicate.Predicate {
	p := updateUnless(func(o client.Object) { o.SetFinalizers(nil) })
	p.CreateFunc = func(event.CreateEvent) bool { return false }
	return p
}

// updateUnless passes every event but an update whose old and new objects
// are equal once their resourceVersion and managed fields are cleared and
// clear has run on copies of both.
func updateUnless(clear func(client.Object)) predicate.Funcs {
	trim := func(o client.Object) client.Object {
		c := o.DeepCopyObject().(client.Object)
		c.SetResourceVersion("")
		c.SetManagedFields(nil)
		clear(c)
		return c
	}
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			if e.ObjectOld == nil || e.ObjectNew == nil {
				return true
			}
			return !equality.Semantic.DeepEqual(trim(e.ObjectOld), trim(e.ObjectNew))
		},
	}
}
