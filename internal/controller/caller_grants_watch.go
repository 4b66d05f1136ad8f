package controller

import (
	"context"
	"maps"
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// The events that change which namespaces a Caller's sidecar may read
// HCPSessions in (caller_grants.go), and the Callers they concern: only
// Callers with a harness, in other namespaces than the event's, on the
// vhost of one of its Callees, and named by its policies. A namespace
// without CapabilityPolicies naming callers (test/scale's) maps nothing.

// watchSessionReads adds the watches of the grants to the Caller
// controller's builder.
func (r *CallerReconciler) watchSessionReads(b *builder.Builder) *builder.Builder {
	return b.
		// A policy's rules: its spec (a status write does not count).
		Watches(&hcpv1alpha1.CapabilityPolicy{}, handler.EnqueueRequestsFromMapFunc(r.mapPolicyToCallers),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A Callee's labels (a policy selects by them; the vhost key is one).
		Watches(&hcpv1alpha1.Callee{}, handler.EnqueueRequestsFromMapFunc(r.mapCalleeToCallers),
			builder.WithPredicates(labelsChanged())).
		// A grant deleted or changed by someone else is applied again.
		Watches(&rbacv1.Role{}, handler.EnqueueRequestsFromMapFunc(r.mapGrantToCaller), builder.WithPredicates(childChanged(), isGrant())).
		Watches(&rbacv1.RoleBinding{}, handler.EnqueueRequestsFromMapFunc(r.mapGrantToCaller), builder.WithPredicates(childChanged(), isGrant()))
}

// mapPolicyToCallers: the Callers a policy names, on the vhost of a Callee
// of its namespace. An update maps the old and the new policy both.
func (r *CallerReconciler) mapPolicyToCallers(ctx context.Context, obj client.Object) []reconcile.Request {
	p, ok := obj.(*hcpv1alpha1.CapabilityPolicy)
	if !ok {
		return nil
	}
	ids := policy.NamedCallerIDs(p)
	if len(ids) == 0 {
		return nil
	}
	var callees hcpv1alpha1.CalleeList
	if err := r.List(ctx, &callees, client.InNamespace(p.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list the Callees of a policy's namespace")
		return nil
	}
	var keys []string
	for i := range callees.Items {
		if k := callees.Items[i].Labels[hcpv1alpha1.LabelVhostKey]; k != "" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return r.callersNamed(ctx, p.Namespace, slices.Compact(keys), ids)
}

// mapCalleeToCallers: the Callers on a Callee's vhost that the policies of
// its namespace name.
func (r *CallerReconciler) mapCalleeToCallers(ctx context.Context, obj client.Object) []reconcile.Request {
	key := obj.GetLabels()[hcpv1alpha1.LabelVhostKey]
	if key == "" {
		return nil
	}
	var pols hcpv1alpha1.CapabilityPolicyList
	if err := r.List(ctx, &pols, client.InNamespace(obj.GetNamespace()), client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list the policies of a Callee's namespace")
		return nil
	}
	var ids []string
	for i := range pols.Items {
		ids = append(ids, policy.NamedCallerIDs(&pols.Items[i])...)
	}
	if len(ids) == 0 {
		return nil
	}
	return r.callersNamed(ctx, obj.GetNamespace(), []string{key}, ids)
}

// callersNamed: the Callers with a harness outside ns, on one of the vhost
// keys, whose id is among ids (or any, with "*").
func (r *CallerReconciler) callersNamed(ctx context.Context, ns string, keys, ids []string) []reconcile.Request {
	anyCaller := slices.Contains(ids, policy.AnyCallerID)
	var reqs []reconcile.Request
	for _, key := range keys {
		var callers hcpv1alpha1.CallerList
		if err := r.List(ctx, &callers, client.MatchingFields{indexVhostKey: key}, client.UnsafeDisableDeepCopy); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Failed to list the Callers of a vhost")
			return nil
		}
		for i := range callers.Items {
			c := &callers.Items[i]
			if c.Namespace != ns && c.Spec.Harness != nil && (anyCaller || slices.Contains(ids, c.ID())) {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(c)})
			}
		}
	}
	return reqs
}

// mapGrantToCaller: the Caller a grant's labels name (the name label
// holds a cut name for a long one: the grant's own name tells).
func (r *CallerReconciler) mapGrantToCaller(ctx context.Context, obj client.Object) []reconcile.Request {
	var callers hcpv1alpha1.CallerList
	ns := obj.GetLabels()[hcpv1alpha1.LabelCallerNamespace]
	if err := r.List(ctx, &callers, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list the Callers of a grant's namespace")
		return nil
	}
	for i := range callers.Items {
		if resource.SessionReaderName(resource.ForCaller(&callers.Items[i])) == obj.GetName() {
			return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(&callers.Items[i])}}
		}
	}
	return nil
}

// isGrant passes the Roles and RoleBindings of a Caller in another
// namespace (resource.SessionReaderRole).
func isGrant() predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[hcpv1alpha1.LabelCallerNamespace] != ""
	})
}

// labelsChanged passes creations, deletions and label changes.
func labelsChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld == nil || e.ObjectNew == nil || !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels())
		},
	}
}
