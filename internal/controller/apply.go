package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
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
// object. It returns the live object (with its status) and records an Event
// on owner when it created or changed something.
func (c *core) apply(ctx context.Context, owner client.Object, desired client.Object) (client.Object, error) {
	obj := emptyLike(desired)
	res, err := controllerutil.CreateOrUpdate(ctx, c.Client, obj, func() error {
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
		kind := c.kindOf(desired)
		ctrl.LoggerFrom(ctx).Info("Applied child", "kind", kind, "child", klog.KObj(obj), "operation", res)
		if owner != nil {
			verb := map[controllerutil.OperationResult]string{controllerutil.OperationResultCreated: "Created"}[res]
			if verb == "" {
				verb = "Updated"
			}
			c.recorder.Eventf(owner, obj, corev1.EventTypeNormal, verb, "Apply", "%s %s %s", verb, kind, obj.GetName())
		}
	}
	return obj, nil
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
	case *topologyv1beta1.Queue:
		d := desired.(*topologyv1beta1.Queue)
		args := o.Spec.Arguments
		o.Spec = d.Spec
		if rawEqual(args, d.Spec.Arguments) {
			o.Spec.Arguments = args // keep the stored encoding: no spurious update
		}
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
	case *topologyv1beta1.Vhost:
		d := desired.(*topologyv1beta1.Vhost)
		ref, limits := o.Spec.RabbitmqClusterReference, o.Spec.VhostLimits
		o.Spec.Name, o.Spec.DeletionPolicy = d.Spec.Name, d.Spec.DeletionPolicy
		if created {
			o.Spec.RabbitmqClusterReference = d.Spec.RabbitmqClusterReference
		} else {
			o.Spec.RabbitmqClusterReference, o.Spec.VhostLimits = ref, limits
		}
	case *topologyv1beta1.Binding:
		o.Spec = desired.(*topologyv1beta1.Binding).Spec
	case *topologyv1beta1.User:
		o.Spec = desired.(*topologyv1beta1.User).Spec
	case *topologyv1beta1.Permission:
		o.Spec = desired.(*topologyv1beta1.Permission).Spec
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
	case *corev1.ServiceAccount:
		// Nothing but metadata: tokens and pull secrets are others' business.
	case *rbacv1.Role:
		o.Rules = desired.(*rbacv1.Role).Rules
	case *rbacv1.RoleBinding:
		d := desired.(*rbacv1.RoleBinding)
		if !created && o.RoleRef != d.RoleRef {
			return fmt.Errorf("roleRef is %v, want %v: delete the RoleBinding to let the operator recreate it", o.RoleRef, d.RoleRef)
		}
		o.RoleRef, o.Subjects = d.RoleRef, d.Subjects
	case *appsv1.Deployment:
		mutateDeployment(o, desired.(*appsv1.Deployment))
	case *policyv1.PodDisruptionBudget:
		// Only what the operator sets: unhealthyPodEvictionPolicy is the
		// user's to change on the object.
		d := desired.(*policyv1.PodDisruptionBudget)
		o.Spec.MinAvailable, o.Spec.MaxUnavailable, o.Spec.Selector = d.Spec.MinAvailable, d.Spec.MaxUnavailable, d.Spec.Selector
	default:
		return fmt.Errorf("no apply rule for %T", obj)
	}
	return nil
}

// mutateDeployment sets replicas and, when the config hash or the sidecar
// hash differs, the pod template. The API server defaults many pod fields,
// so comparing whole templates would update on every reconcile; the hashes
// say whether what the operator renders changed. Edit the Callee or Caller,
// not the Deployment: direct template edits stay until the next
// configuration change.
func mutateDeployment(o, d *appsv1.Deployment) {
	if o.CreationTimestamp.IsZero() {
		o.Spec = d.Spec
		return
	}
	o.Spec.Replicas = d.Spec.Replicas
	have, want := o.Spec.Template.Annotations, d.Spec.Template.Annotations
	if have[hcpv1alpha1.AnnotationConfigHash] != want[hcpv1alpha1.AnnotationConfigHash] ||
		have[resource.AnnotationSidecarHash] != want[resource.AnnotationSidecarHash] {
		o.Spec.Template = d.Spec.Template
	}
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
	ctrl.LoggerFrom(ctx).Info("Deleted child", "kind", c.kindOf(obj), "child", klog.KObj(obj))
	c.recorder.Eventf(owner, obj, corev1.EventTypeNormal, "Deleted", "Delete", "Deleted %s %s", c.kindOf(obj), obj.GetName())
	return nil
}
