package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/hcp-io/hcp-operator/internal/resource"
)

// Live limits: a queue's limits are its Policy (resource.LimitsPolicy);
// its declaration never changes after creation.

// reasonQueueArgumentsPinLimits is the Warning Event of a queue whose
// declaration arguments (an earlier version's) keep a limit from taking
// effect as asked.
const reasonQueueArgumentsPinLimits = "QueueArgumentsPinLimits"

// queueAsDeclared returns desired with the declaration of the live Queue,
// when there is one (all of its spec but the deletion policy): RabbitMQ
// cannot change a queue's arguments, type or durability, and the topology
// operator's webhook refuses any such update and a change of name, vhost
// or broker reference, so the operator never asks. An earlier version
// declared queues with their limits as arguments; those stay. It also
// returns the live arguments.
func (c *core) queueAsDeclared(ctx context.Context, desired *topologyv1beta1.Queue) (*topologyv1beta1.Queue, map[string]any, error) {
	live := &topologyv1beta1.Queue{}
	err := c.Get(ctx, client.ObjectKeyFromObject(desired), live)
	if apierrors.IsNotFound(err) {
		return desired, argumentsOf(desired.Spec.Arguments), nil
	}
	if err != nil {
		return nil, nil, err
	}
	// Everything but the deletion policy is immutable for the webhook.
	policy := desired.Spec.DeletionPolicy
	desired.Spec = live.Spec
	desired.Spec.DeletionPolicy = policy
	return desired, argumentsOf(live.Spec.Arguments), nil
}

func argumentsOf(raw *runtime.RawExtension) map[string]any {
	m := map[string]any{}
	if raw != nil {
		_ = json.Unmarshal(raw.Raw, &m)
	}
	return m
}

// ensureLimitsPolicy applies the queue's limits Policy (deleting it when
// the spec sets no limits: nil desired) and warns, by Event, when the
// queue's declaration arguments keep a limit from taking effect. It
// returns the live Policy for TopologyReady (nil without one).
func (c *core) ensureLimitsPolicy(ctx context.Context, v view, desired *topologyv1beta1.Policy, args map[string]any, limits map[string]any) (*topologyv1beta1.Policy, error) {
	if desired == nil {
		pol := &topologyv1beta1.Policy{ObjectMeta: metav1.ObjectMeta{Namespace: v.sub.Namespace, Name: v.sub.BaseName()}}
		return nil, c.deleteOwned(ctx, v.obj, pol)
	}
	live := &topologyv1beta1.Policy{ObjectMeta: metav1.ObjectMeta{Namespace: desired.Namespace, Name: desired.Name}}
	res, err := c.createOrUpdate(ctx, live, func() error {
		mergeMetadata(live, desired)
		if err := controllerutil.SetControllerReference(v.obj, live, c.scheme); err != nil {
			return err
		}
		return mutate(live, desired)
	})
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", klog.KObj(desired), err)
	}
	if res != controllerutil.OperationResultNone {
		ctrl.LoggerFrom(ctx).Info("Applied child", "kind", "Policy", "child", klog.KObj(live), "operation", res, "definition", string(desired.Spec.Definition.Raw))
		c.noteChange(ctx, v.obj, live, "Policy", verbOf(res))
	}
	if pinned := resource.PinnedLimits(args, limits); len(pinned) > 0 && res != controllerutil.OperationResultNone {
		parts := make([]string, len(pinned))
		for i, p := range pinned {
			parts[i] = p.String()
		}
		c.recorder.Eventf(v.obj, nil, corev1.EventTypeWarning, reasonQueueArgumentsPinLimits, "Apply",
			"queue %s was declared by an earlier version with limit arguments, which RabbitMQ applies over the policy where they are lower: %s; to apply the spec's limits, delete and recreate the %s (its queue and messages go with it)",
			v.sub.QueueName(), strings.Join(parts, ", "), v.sub.Kind())
	}
	return live, nil
}

// defaultLimitsReady: the vhost's default event limits Policy, among the
// shared objects, is Ready.
func defaultLimitsReady(shared []client.Object) bool {
	for _, o := range shared {
		if p, ok := o.(*topologyv1beta1.Policy); ok {
			ready, _ := topologyObjectReady(p)
			return ready
		}
	}
	return false
}

// setTopologyReadyWithPolicy is setTopologyReady over objs plus the
// limits Policy (nil: none): a Policy that is not ready makes TopologyReady
// false and is named in its message.
func (c *core) setTopologyReadyWithPolicy(v view, objs []client.Object, pol *topologyv1beta1.Policy) {
	if pol != nil {
		objs = append(objs, pol)
	}
	c.setTopologyReady(v, objs)
}
