package controller

import (
	"context"
	"fmt"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// mtoFinalizerPrefix starts the topology operator's finalizers
// (deletion.finalizers.exchanges.rabbitmq.com, ...vhosts...).
const mtoFinalizerPrefix = "deletion.finalizers."

// orphanLegacy deletes the shared objects of key that an earlier version
// kept outside home (in tenant namespaces) without deleting what they
// declared: the topology operator's finalizer is removed first, then the
// object is deleted on the condition that it did not change since, so it
// goes at once and the topology operator never runs its deletion (which
// would delete the exchange, and with it every binding, or the vhost).
// If the topology operator re-added its finalizer in between, the
// deletion is refused and tried again at the next reconcile (the
// topology operator's write is an event that brings one). A legacy object
// already being deleted (its namespace is going) only loses the
// finalizer: the topology operator may already have deleted the exchange,
// and its deletion event then makes the users re-declare.
func (c *core) orphanLegacy(ctx context.Context, key, home string) error {
	sel := client.MatchingLabels{hcpv1alpha1.LabelVhostKey: key, hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue}
	for _, l := range []client.ObjectList{&topologyv1beta1.ExchangeList{}, &topologyv1beta1.VhostList{}} {
		if err := c.List(ctx, l, sel); err != nil {
			return err
		}
		for _, o := range listItems(l) {
			if o.GetNamespace() == home {
				continue
			}
			done, err := c.orphanDelete(ctx, o)
			if err != nil {
				return fmt.Errorf("adopt legacy %s %s: %w", c.kindOf(o), klog.KObj(o), err)
			}
			if !done {
				ctrl.LoggerFrom(ctx).V(1).Info("Legacy shared object changed while being adopted; retrying at the next reconcile", "kind", c.kindOf(o), "object", klog.KObj(o))
			}
		}
	}
	return nil
}

// orphanDelete removes the topology operator's finalizers from o and
// deletes it unchanged; false when o changed in between.
func (c *core) orphanDelete(ctx context.Context, o client.Object) (bool, error) {
	log := ctrl.LoggerFrom(ctx)
	orig := o.DeepCopyObject().(client.Object)
	terminating := !o.GetDeletionTimestamp().IsZero()
	var keep []string
	for _, f := range o.GetFinalizers() {
		if !strings.HasPrefix(f, mtoFinalizerPrefix) {
			keep = append(keep, f)
		}
	}
	o.SetFinalizers(keep)
	if !terminating {
		a := o.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		a[annotationOrphaned] = "true"
		o.SetAnnotations(a)
		if vh, ok := o.(*topologyv1beta1.Vhost); ok {
			vh.Spec.DeletionPolicy = resource.DeletionPolicyRetain
		}
	}
	if err := c.Patch(ctx, o, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if apierrors.IsConflict(err) {
			return false, nil
		}
		return false, err
	}
	if terminating {
		log.Info("Removed the topology operator's finalizer from a terminating legacy shared object", "kind", c.kindOf(o), "object", klog.KObj(o))
		return true, nil
	}
	rv, uid := o.GetResourceVersion(), o.GetUID()
	err := c.Delete(ctx, o, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case apierrors.IsConflict(err):
		return false, nil
	case err != nil:
		return false, err
	}
	log.Info("Adopted a legacy shared object: deleted it without deleting what it declared on the broker", "kind", c.kindOf(o), "object", klog.KObj(o))
	return true, nil
}
