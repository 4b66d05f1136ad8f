package controller

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/hcp-io/hcp-operator/internal/resource"
)

// ensureShared applies the vhost's shared objects in their home, adopts
// what earlier versions left in tenant namespaces, and returns the objects
// v depends on (for TopologyReady).
func (c *core) ensureShared(ctx context.Context, v view, b resource.Broker) ([]client.Object, error) {
	home, dedicated := c.home(v)
	hc := c.in(home)
	key := b.Key()
	ref := b.Reference
	copySecret := dedicated && b.Reference.ConnectionSecret != nil
	if dedicated {
		ref = resource.SharedReference(home, v.obj.GetNamespace(), b)
	}
	if copySecret {
		// First: the topology operator's webhook refuses an object whose
		// connection Secret does not exist.
		if err := hc.ensureSharedSecret(ctx, c, v, b, home, nil); err != nil {
			return nil, err
		}
	}
	var out []client.Object
	if b.CreateVhost {
		policy, err := c.vhostDeletionPolicy(ctx, key, home, dedicated)
		if err != nil {
			return nil, err
		}
		vh, err := hc.apply(ctx, nil, resource.Vhost(home, b, ref, policy))
		if err != nil {
			return nil, err
		}
		out = append(out, vh)
	}
	cmd, evt := resource.Exchanges(home, b, ref)
	for _, x := range []*topologyv1beta1.Exchange{cmd, evt, resource.DeadLetterExchange(home, b, ref)} {
		if e := c.epochs.get(key); e != "" {
			x.Annotations = map[string]string{annotationRedeclare: e}
		}
		live, err := hc.apply(ctx, nil, x)
		if err != nil {
			return nil, err
		}
		out = append(out, live)
	}
	for _, p := range []*topologyv1beta1.Policy{resource.DefaultEventLimitsPolicy(home, b, ref),
		resource.DefaultCommandLimitsPolicy(home, b, ref), resource.DeadLetterLimitsPolicy(home, b, ref)} {
		pol, err := hc.apply(ctx, nil, p)
		if err != nil {
			return nil, err
		}
		out = append(out, pol)
	}
	if copySecret {
		// Then owned by what uses it.
		if err := hc.ensureSharedSecret(ctx, c, v, b, home, out); err != nil {
			return nil, err
		}
	}
	if dedicated {
		if err := c.orphanLegacy(ctx, key, home); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ensureSharedSecret keeps the home's copy of a connection Secret of the
// pair: copied from v's, and refreshed from it (a rotation), unless it
// was copied from another user's Secret that still exists (users with
// different Secrets for one broker must not make it flap). user is the
// core with the cache of v's namespace.
//
// The copy is owned (not controlled) by the shared objects that use it,
// so garbage collection deletes it once the last of them is gone: after
// the topology operator has used it to delete them on the broker. The
// manager needs no permission to delete Secrets.
func (c *core) ensureSharedSecret(ctx context.Context, user *core, v view, b resource.Broker, home string, owners []client.Object) error {
	srcKey := types.NamespacedName{Namespace: cmp.Or(b.Reference.Namespace, v.obj.GetNamespace()), Name: b.Reference.ConnectionSecret.Name}
	src := &corev1.Secret{}
	if err := user.Get(ctx, srcKey, src); err != nil {
		if !apierrors.IsNotFound(err) {
			return err
		}
		// Not cached (another namespace): resolveBroker has checked it.
		if err := c.apiReader.Get(ctx, srcKey, src); err != nil {
			return err
		}
	}
	desired := resource.SharedConnectionSecret(home, b.Key(), src)
	live := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: desired.Namespace, Name: desired.Name}}
	res, err := c.createOrUpdate(ctx, live, func() error {
		if from := live.Annotations[resource.AnnotationCopiedFrom]; !live.CreationTimestamp.IsZero() && from != "" && from != srcKey.String() {
			ns, name, _ := strings.Cut(from, "/")
			err := c.apiReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &corev1.Secret{})
			switch {
			case err == nil:
				desired.Data, desired.Annotations = live.Data, nil // another user's Secret feeds it
			case !apierrors.IsNotFound(err):
				return err
			}
		}
		mergeMetadata(live, desired)
		if live.CreationTimestamp.IsZero() {
			live.Type = desired.Type
		}
		live.Data = desired.Data
		for _, o := range owners {
			gvk, err := apiutil.GVKForObject(o, c.scheme)
			if err != nil {
				return err
			}
			ref := metav1.OwnerReference{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind, Name: o.GetName(), UID: o.GetUID()}
			if !slices.ContainsFunc(live.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == ref.UID }) {
				live.OwnerReferences = append(live.OwnerReferences, ref)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("secret %s: %w", klog.KObj(desired), err)
	}
	if res != controllerutil.OperationResultNone {
		ctrl.LoggerFrom(ctx).Info("Applied the shared connection Secret", "secret", klog.KObj(live), "copiedFrom", live.Annotations[resource.AnnotationCopiedFrom], "operation", res)
	}
	return nil
}

// vhostDeletionPolicy is delete only if every user of key (anywhere, or in
// the home namespace when each namespace is its own home) that asks for
// the vhost asks for delete; deleting a vhost deletes everything in it.
func (c *core) vhostDeletionPolicy(ctx context.Context, key, home string, dedicated bool) (string, error) {
	ns := home
	if dedicated {
		ns = ""
	}
	for _, use := range []struct{ suffix, policy string }{
		{useVhostRetain, resource.DeletionPolicyRetain},
		{useVhostDelete, resource.DeletionPolicyDelete},
	} {
		u, err := c.userOfKey(ctx, key+use.suffix, ns, "")
		if err != nil {
			return "", err
		}
		if u != nil {
			return use.policy, nil
		}
	}
	return resource.DeletionPolicyRetain, nil
}
