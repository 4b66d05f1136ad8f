package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// annotationRedeclare on shared Exchanges and on Bindings makes the topology
// operator declare them again (it reconciles on every update). The operator
// sets it after an Exchange object of the same vhost was deleted while the
// vhost was still in use: the topology operator then deleted the exchange
// on the broker, and with it every binding.
const annotationRedeclare = "hcp.io/redeclare"

func (c *core) kindOf(obj runtime.Object) string {
	gvk, err := apiutil.GVKForObject(obj, c.scheme)
	if err != nil {
		return fmt.Sprintf("%T", obj)
	}
	return gvk.Kind
}

func emptyLike(desired client.Object) client.Object {
	obj := reflect.New(reflect.TypeOf(desired).Elem()).Interface().(client.Object)
	obj.SetName(desired.GetName())
	obj.SetNamespace(desired.GetNamespace())
	return obj
}

// apply creates desired or updates the live object so that the fields the
// operator owns match it, leaving every other field alone; no write happens
// when nothing differs. owner, when not nil, becomes the controller of the
// object. It returns the live object (with its status) and notes a change
// for owner's Event (noteChange).
//
// It serves the objects whose update keeps part of the live object by
// rule (mutate): the shared Exchanges and Vhost (their first broker
// reference) and Secrets (generated data). The children of childKinds go
// through applyChild (server-side apply).
func (c *core) apply(ctx context.Context, owner client.Object, desired client.Object) (client.Object, error) {
	obj := emptyLike(desired)
	res, err := c.createOrUpdate(ctx, obj, func() error {
		mergeMetadata(obj, desired)
		if owner != nil {
			if err := controllerutil.SetControllerReference(owner, obj, c.scheme); err != nil {
				return err
			}
		}
		return mutate(obj, desired)
	})
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", c.kindOf(desired), klog.KObj(desired), err)
	}
	if res != controllerutil.OperationResultNone {
		c.noteApplied(ctx, owner, obj, c.kindOf(desired), res)
	}
	return obj, nil
}

// createOrUpdate is controllerutil.CreateOrUpdate reading from the cache,
// tried once more reading from the API server when its create finds the
// object already there: another worker created it after the cached read
// (the Callee and Caller controllers both ensure a vhost's shared objects,
// and a user's first Callee and Caller often arrive together). obj, which
// f may have filled for a create, starts again from its name.
func (c *core) createOrUpdate(ctx context.Context, obj client.Object, f controllerutil.MutateFn) (controllerutil.OperationResult, error) {
	res, err := controllerutil.CreateOrUpdate(ctx, c.Client, obj, f)
	if !apierrors.IsAlreadyExists(err) {
		return res, err
	}
	reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(emptyLike(obj)).Elem())
	return controllerutil.CreateOrUpdate(ctx, readThrough{Client: c.Client, r: c.apiReader}, obj, f)
}

// mergeMetadata sets the labels and annotations desired carries; others
// (another tool's) stay.
func mergeMetadata(obj, desired client.Object) {
	merge := func(have, want map[string]string) map[string]string {
		if len(want) == 0 {
			return have
		}
		if have == nil {
			have = map[string]string{}
		}
		for k, v := range want {
			have[k] = v
		}
		return have
	}
	obj.SetLabels(merge(obj.GetLabels(), desired.GetLabels()))
	obj.SetAnnotations(merge(obj.GetAnnotations(), desired.GetAnnotations()))
}

// rawEqual compares two JSON documents by value.
func rawEqual(a, b *runtime.RawExtension) bool {
	if a == nil || b == nil {
		return a == b
	}
	if bytes.Equal(a.Raw, b.Raw) {
		return true
	}
	var x, y any
	if json.Unmarshal(a.Raw, &x) != nil || json.Unmarshal(b.Raw, &y) != nil {
		return false
	}
	return equality.Semantic.DeepEqual(x, y)
}

func mutate(obj, desired client.Object) error {
	ts := obj.GetCreationTimestamp()
	created := ts.IsZero()
	switch o := obj.(type) {
	case *topologyv1beta1.Exchange:
		d := desired.(*topologyv1beta1.Exchange)
		// Shared: several users of one namespace may reach the broker
		// through different references; the first one stays (the topology
		// operator forbids changing it).
		ref := o.Spec.RabbitmqClusterReference
		o.Spec = d.Spec
		if !created {
			o.Spec.RabbitmqClusterReference = ref
		}
	case *topologyv1beta1.Policy:
		// A queue's limits or the vhost's default event limits: name,
		// vhost and reference are immutable for the topology operator's
		// webhook (they never change for one subject or vhost anyway).
		d := desired.(*topologyv1beta1.Policy)
		name, vhost, ref, def := o.Spec.Name, o.Spec.Vhost, o.Spec.RabbitmqClusterReference, o.Spec.Definition
		o.Spec = d.Spec
		if !created {
			o.Spec.Name, o.Spec.Vhost, o.Spec.RabbitmqClusterReference = name, vhost, ref
		}
		if rawEqual(def, d.Spec.Definition) {
			o.Spec.Definition = def // keep the stored encoding: no spurious update
		}
	case *topologyv1beta1.Vhost:
		d := desired.(*topologyv1beta1.Vhost)
		ref, limits := o.Spec.RabbitmqClusterReference, o.Spec.VhostLimits
		o.Spec.Name, o.Spec.DeletionPolicy = d.Spec.Name, d.Spec.DeletionPolicy
		if created {
			o.Spec.RabbitmqClusterReference = d.Spec.RabbitmqClusterReference
		} else {
			o.Spec.RabbitmqClusterReference, o.Spec.VhostLimits = ref, limits
		}
	case *corev1.Secret:
		d := desired.(*corev1.Secret)
		if created {
			o.Type = d.Type
		}
		if o.Data == nil {
			o.Data = map[string][]byte{}
		}
		for k, v := range d.Data {
			o.Data[k] = v
		}
	default:
		return fmt.Errorf("no apply rule for %T", obj)
	}
	return nil
}

// deleteOwned deletes obj when it exists and owner controls it.
func (c *core) deleteOwned(ctx context.Context, owner client.Object, obj client.Object) error {
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(obj, owner) {
		return nil
	}
	if err := c.Delete(ctx, obj, client.Preconditions{UID: new(obj.GetUID())}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	kind := c.kindOf(obj)
	ctrl.LoggerFrom(ctx).Info("Deleted child", "kind", kind, "child", klog.KObj(obj))
	c.noteChange(ctx, owner, obj, kind, verbDeleted)
	return nil
}
