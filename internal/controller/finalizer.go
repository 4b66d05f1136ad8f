package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// finalize runs when a Callee or Caller that holds its id is deleted. It
// deletes the object's own topology objects and waits until the topology
// operator has removed them from the broker; then, if no other Callee or
// Caller uses the (broker, vhost) pair, it deletes the pair's shared
// objects everywhere; then it lets the object go. The Deployment, Secrets
// and RBAC objects of its namespace go by garbage collection; a Caller's
// Roles and RoleBindings in other namespaces are deleted first.
func (c *core) finalize(ctx context.Context, v view, owned []client.Object) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	if !controllerutil.ContainsFinalizer(v.obj, TopologyFinalizer) {
		return ctrl.Result{}, nil
	}
	// A Caller's reads of HCPSessions in other namespaces have no owner
	// reference to go by: deleted first (caller_grants.go).
	if c.role == topology.RoleCaller {
		if err := c.revokeSessionReads(ctx, v); err != nil {
			return ctrl.Result{}, err
		}
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
		others, err := c.liveUsersOfKey(ctx, v, key)
		if err != nil {
			return ctrl.Result{}, err
		}
		if len(others) == 0 {
			pending, err := c.deleteShared(ctx, v, key)
			if err != nil {
				return ctrl.Result{}, err
			}
			if len(pending) > 0 {
				c.setDeletingCondition(v, "last user of vhost "+resource.VhostOf(v.broker)+" on this broker: waiting for the messaging-topology-operator to delete the shared "+strings.Join(pending, "; "))
				return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
			}
		} else {
			log.Info("Kept the shared topology: the vhost is still in use", "vhostKey", key, "usedBy", describe(others[0]))
		}
	}
	return ctrl.Result{}, c.removeFinalizer(ctx, v)
}

// deleteShared deletes every shared object of key (its home's and any left
// in other namespaces) and returns those still waiting for the topology
// operator to remove them from the broker.
func (c *core) deleteShared(ctx context.Context, v view, key string) ([]string, error) {
	home, _ := c.home(v)
	sel := client.MatchingLabels{hcpv1alpha1.LabelVhostKey: key, hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue}
	var deleted, pending []string
	for _, ns := range c.sharedNamespaces(home) {
		for _, l := range []client.ObjectList{&topologyv1beta1.ExchangeList{}, &topologyv1beta1.PolicyList{}, &topologyv1beta1.VhostList{}} {
			opts := []client.ListOption{sel}
			if ns != "" {
				opts = append(opts, client.InNamespace(ns))
			}
			if err := c.apiReader.List(ctx, l, opts...); err != nil {
				return nil, err
			}
			for _, o := range listItems(l) {
				name := c.kindOf(o) + " " + klog.KObj(o).String()
				pending = append(pending, name+notReadyDetail(o))
				if !o.GetDeletionTimestamp().IsZero() {
					continue
				}
				if vh, ok := o.(*topologyv1beta1.Vhost); ok {
					// The last user decides (the policy was computed while
					// others were left).
					if err := c.setLastVhostPolicy(ctx, v, vh); err != nil {
						return nil, err
					}
				}
				if err := c.Delete(ctx, o, client.Preconditions{UID: new(o.GetUID())}); client.IgnoreNotFound(err) != nil {
					return nil, err
				}
				deleted = append(deleted, name)
			}
		}
	}
	if len(deleted) > 0 {
		ctrl.LoggerFrom(ctx).Info("Deleted the shared objects of a vhost no longer used", "vhostKey", key, "objects", deleted)
		c.recorder.Eventf(v.obj, nil, corev1.EventTypeNormal, "DeletedSharedTopology", "Delete",
			"Last user of vhost %q on this broker: deleted %s", resource.VhostOf(v.broker), strings.Join(deleted, ", "))
	}
	// The connection Secret copy goes by garbage collection after them.
	return pending, nil
}

// setLastVhostPolicy gives the Vhost object the deletion policy its last
// user asks for: delete only when it asked for the vhost and for delete.
func (c *core) setLastVhostPolicy(ctx context.Context, v view, vh *topologyv1beta1.Vhost) error {
	want := resource.DeletionPolicyRetain
	if v.broker.CreateVhost && v.broker.VhostDeletionPolicy == resource.DeletionPolicyDelete {
		want = resource.DeletionPolicyDelete
	}
	if vh.Spec.DeletionPolicy == want {
		return nil
	}
	orig := vh.DeepCopy()
	vh.Spec.DeletionPolicy = want
	return client.IgnoreNotFound(c.Patch(ctx, vh, client.MergeFrom(orig)))
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
