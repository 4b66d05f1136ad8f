package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TopologyFinalizer is on every Callee and Caller that holds its id in a
// vhost: its deletion removes its topology objects first (so that a waiting
// namesake never shares a broker queue with a dying one), and the shared
// exchanges when it was their last user anywhere.
const TopologyFinalizer = "hcp.io/topology"

// core is what the Callee and Caller reconcilers share.
type core struct {
	client.Client
	apiReader client.Reader
	scheme    *runtime.Scheme
	recorder  events.EventRecorder
	opts      Options
	role      topology.Role
	epochs    *epochs
	// claims is shared by the Callee and Caller reconcilers (nil: none).
	claims *claimLog
	// memo holds the statuses written that the cache has not shown yet.
	memo *statusMemo
	// pace holds back status writes that only refresh a wait's detail.
	pace *statusPace
	// created holds the children created that the cache has not shown
	// yet (nil: none remembered).
	created *createMemo
}

// view is the part of a Callee or Caller the shared code works on.
type view struct {
	obj    client.Object
	sub    resource.Subject
	broker hcpv1alpha1.BrokerSpec
	// conditions points into the object's status.
	conditions *[]metav1.Condition
	// observedGeneration points into the object's status.
	observedGeneration *int64
	// status points to the object's status (compared and copied whole by
	// the reconcile loop).
	status any
	// setStatus sets the object's status from another status pointer of
	// its kind.
	setStatus func(any)
}

func calleeView(c *hcpv1alpha1.Callee) view {
	return view{obj: c, sub: resource.ForCallee(c), broker: c.Spec.Broker, conditions: &c.Status.Conditions,
		observedGeneration: &c.Status.ObservedGeneration, status: &c.Status,
		setStatus: func(s any) { c.Status = *s.(*hcpv1alpha1.CalleeStatus).DeepCopy() }}
}

func callerView(c *hcpv1alpha1.Caller) view {
	return view{obj: c, sub: resource.ForCaller(c), broker: c.Spec.Broker, conditions: &c.Status.Conditions,
		observedGeneration: &c.Status.ObservedGeneration, status: &c.Status,
		setStatus: func(s any) { c.Status = *s.(*hcpv1alpha1.CallerStatus).DeepCopy() }}
}

func viewOf(obj client.Object) (view, bool) {
	switch o := obj.(type) {
	case *hcpv1alpha1.Callee:
		return calleeView(o), true
	case *hcpv1alpha1.Caller:
		return callerView(o), true
	}
	return view{}, false
}

// brokerSpecOf is a Callee's or Caller's spec.broker (viewOf without the
// view, for loops over every user of a vhost).
func brokerSpecOf(obj client.Object) hcpv1alpha1.BrokerSpec {
	switch o := obj.(type) {
	case *hcpv1alpha1.Callee:
		return o.Spec.Broker
	case *hcpv1alpha1.Caller:
		return o.Spec.Broker
	}
	return hcpv1alpha1.BrokerSpec{}
}

func (c *core) newList() client.ObjectList {
	if c.role == topology.RoleCallee {
		return &hcpv1alpha1.CalleeList{}
	}
	return &hcpv1alpha1.CallerList{}
}

func listItems(l client.ObjectList) []client.Object {
	objs, _ := meta.ExtractList(l)
	out := make([]client.Object, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(client.Object))
	}
	return out
}

// problem is a condition the user must fix; reconciling stops until then.
type problem struct {
	reason  string
	message string
}

func (p *problem) Error() string { return p.reason + ": " + p.message }

// resolveBroker finds the broker a Callee or Caller uses and checks what
// the topology operator will need from it, so that a mistake shows on the
// Callee or Caller with its fix instead of deep in a child's status.
// Transient API errors are returned as errors, user mistakes as a problem.
func (c *core) resolveBroker(ctx context.Context, v view) (resource.Broker, *problem, error) {
	ref, err := resource.Reference(v.broker, c.opts.DefaultBroker)
	if errors.Is(err, resource.ErrNoBroker) {
		return resource.Broker{}, &problem{hcpv1alpha1.ReasonBrokerNotConfigured,
			"set spec.broker.rabbitmqClusterReference (a RabbitmqCluster name or a connection Secret), or start the manager with --default-connection-secret"}, nil
	}
	if ref.ConnectionSecret == nil {
		return resource.BrokerFromCluster(ref, v.broker, v.obj.GetNamespace()), nil, nil
	}
	ns := cmp.Or(ref.Namespace, v.obj.GetNamespace())
	name := ref.ConnectionSecret.Name
	key := types.NamespacedName{Namespace: ns, Name: name}
	secret := &corev1.Secret{}
	// The cache holds only labelled Secrets; on a miss, ask the API server
	// to tell a missing Secret from an unlabelled one.
	if err := c.Get(ctx, key, secret); err != nil {
		if !apierrors.IsNotFound(err) {
			return resource.Broker{}, nil, err
		}
		if err := c.apiReader.Get(ctx, key, secret); err != nil {
			if apierrors.IsNotFound(err) {
				return resource.Broker{}, &problem{hcpv1alpha1.ReasonBrokerSecretNotFound, fmt.Sprintf(
					"connection Secret %s/%s not found: create it with keys uri (management API URL), username and password, and the label %s=true",
					ns, name, resource.LabelTopologyOperator)}, nil
			}
			return resource.Broker{}, nil, err
		}
	}
	if secret.Labels[resource.LabelTopologyOperator] != resource.TopologyOperatorLabelValue {
		return resource.Broker{}, &problem{hcpv1alpha1.ReasonBrokerSecretUnlabeled, fmt.Sprintf(
			"connection Secret %s/%s lacks the label %s=true, without which the messaging-topology-operator cannot read it; fix: kubectl label secret -n %s %s %s=true",
			ns, name, resource.LabelTopologyOperator, ns, name, resource.LabelTopologyOperator)}, nil
	}
	if ns != v.obj.GetNamespace() && !namespaceAllowed(secret, v.obj.GetNamespace()) {
		return resource.Broker{}, &problem{hcpv1alpha1.ReasonBrokerSecretInvalid, fmt.Sprintf(
			"connection Secret %s/%s does not allow namespace %s: the topology operator requires the annotation %s to list it; fix: kubectl annotate secret -n %s %s %s=%s (comma-separated, or *)",
			ns, name, v.obj.GetNamespace(), resource.AllowedNamespacesAnnotation, ns, name, resource.AllowedNamespacesAnnotation, v.obj.GetNamespace())}, nil
	}
	b, err := resource.BrokerFromConnectionSecret(ref, v.broker, secret)
	if err != nil {
		return resource.Broker{}, &problem{hcpv1alpha1.ReasonBrokerSecretInvalid, err.Error()}, nil
	}
	return b, nil, nil
}

func namespaceAllowed(s *corev1.Secret, ns string) bool {
	for a := range strings.SplitSeq(s.Annotations[resource.AllowedNamespacesAnnotation], ",") {
		if a = strings.TrimSpace(a); a == ns || a == "*" {
			return true
		}
	}
	return false
}

// claimed reports whether obj holds its id in the vhost of key.
func claimed(obj client.Object, key string) bool {
	return obj.GetLabels()[hcpv1alpha1.LabelVhostKey] == key && controllerutil.ContainsFinalizer(obj, TopologyFinalizer)
}

// olderThan orders by creationTimestamp, then namespace/name.
func olderThan(a, b client.Object) bool {
	ta, tb := a.GetCreationTimestamp(), b.GetCreationTimestamp()
	if !ta.Equal(&tb) {
		return ta.Before(&tb)
	}
	return a.GetNamespace()+"/"+a.GetName() < b.GetNamespace()+"/"+b.GetName()
}

// idHolder returns the other Callee (or Caller) that holds, or has the
// better claim to, v's id in the vhost of key, or nil when v may hold it.
//
// Ids are unique per (broker, vhost) across the cluster. The holder keeps
// its id: a claim is a vhost-key label plus the topology finalizer, set
// before anything is created. Among objects that hold nothing yet, the
// oldest (creationTimestamp, then namespace/name) wins. An object that
// loses creates nothing, so no two objects ever declare the same queue or
// user. A claimed object that is being deleted still holds the id until its
// finalizer has removed its topology, so a waiting namesake never declares
// a queue that is about to be deleted.
func (c *core) idHolder(ctx context.Context, v view, key string) (client.Object, error) {
	list := c.newList()
	if err := c.List(ctx, list, client.MatchingFields{indexIDVhost: idVhost(v.sub.ID, v.broker)}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	self := v.obj
	selfClaimed := claimed(self, key)
	var holder client.Object
	better := func(o client.Object) {
		if holder == nil || olderThan(o, holder) {
			holder = o
		}
	}
	for _, o := range listItems(list) {
		if o.GetUID() == self.GetUID() {
			continue
		}
		switch {
		case claimed(o, key):
			// Both claimed can only follow a race (say, a connection
			// Secret whose uri changed): the older keeps it.
			if !selfClaimed || olderThan(o, self) {
				better(o)
			}
		case selfClaimed || !o.GetDeletionTimestamp().IsZero() || !olderThan(o, self):
		default:
			// An older object that holds nothing yet wins if it is on
			// the same broker.
			ov, _ := viewOf(o)
			ok := o.GetLabels()[hcpv1alpha1.LabelVhostKey]
			if ok == "" {
				b, prob, err := c.resolveBroker(ctx, ov)
				if err != nil {
					return nil, err
				}
				if prob != nil {
					continue // it cannot use any broker yet
				}
				ok = b.Key()
			}
			if ok == key {
				better(o)
			}
		}
	}
	return holder, nil
}

// claim sets the vhost-key label and the topology finalizer on v.
func (c *core) claim(ctx context.Context, v view, key string) error {
	if claimed(v.obj, key) {
		return nil
	}
	orig := v.obj.DeepCopyObject().(client.Object)
	labels := v.obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[hcpv1alpha1.LabelVhostKey] = key
	v.obj.SetLabels(labels)
	controllerutil.AddFinalizer(v.obj, TopologyFinalizer)
	defer c.claims.claiming()()
	// The patch's response overwrites v.obj with the object as stored,
	// status included: what this reconcile set in the status so far (the
	// id, the vhost) is kept, or the next reconcile would write it again.
	ov, _ := viewOf(orig)
	if err := c.Patch(ctx, v.obj, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}), client.FieldOwner(resource.FieldManager)); err != nil {
		return fmt.Errorf("claim id: %w", err)
	}
	v.setStatus(ov.status)
	ctrl.LoggerFrom(ctx).Info("Claimed id", "id", v.sub.ID, "vhost", resource.VhostOf(v.broker), "vhostKey", key)
	return nil
}

// userOfKey returns a Callee or Caller that holds its claim on use (a
// vhost key, or a key with useVhostRetain or useVhostDelete: indexLiveUse)
// and is not being deleted, anywhere (namespace "") or in one namespace,
// other than the object with UID except; nil if there is none. It reads at
// most two entries of the index, whatever the number of users. The object
// is the cache's own, not a copy, and must not be changed.
func (c *core) userOfKey(ctx context.Context, use, namespace string, except types.UID) (client.Object, error) {
	for _, l := range []client.ObjectList{&hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}} {
		// Two: except may be one of them.
		opts := []client.ListOption{client.MatchingFields{indexLiveUse: use}, client.UnsafeDisableDeepCopy, client.Limit(2)}
		if namespace != "" {
			opts = append(opts, client.InNamespace(namespace))
		}
		if err := c.List(ctx, l, opts...); err != nil {
			return nil, err
		}
		for _, o := range listItems(l) {
			if o.GetUID() != except {
				return o, nil
			}
		}
	}
	return nil, nil
}

func describe(o client.Object) string {
	kind := "object"
	if v, ok := viewOf(o); ok {
		kind = v.sub.Kind()
	}
	return kind + " " + klog.KObj(o).String()
}
