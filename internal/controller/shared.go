package controller

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// Shared per-vhost objects.
//
// The exchanges hcp.commands and hcp.events (and the vhost, when a user
// asks the operator to create it) belong to a (broker, vhost) pair, which
// Callees and Callers of several namespaces may use. The topology operator
// has no retain policy for exchanges: deleting an Exchange object deletes
// the exchange on the broker with all its bindings, and it deletes it
// whatever other finalizers the object carries. So the objects must not
// live where a tenant's namespace deletion would take them:
//
//   - they live in the shared topology's home, the operator's namespace
//     (operatorNamespace), one set per vhost key, owned by no one, and
//     reach the broker through the home's own copy of a connection Secret
//     (resource.SharedConnectionSecret) or the RabbitmqCluster itself;
//   - they are reference-counted by the Callees and Callers that hold an id
//     in the pair (the hcp.io/vhost-key label plus the topology finalizer):
//     a user's finalizer deletes them only when no other user is left,
//     counted on the API server, not the cache;
//   - shared objects that an earlier version kept in tenant namespaces are
//     adopted: their topology operator finalizer is removed and they are
//     deleted without the topology operator ever seeing a deletion, so the
//     broker's exchanges and vhost stay (orphanLegacy);
//   - if a shared Exchange object is deleted anyway while the pair is in
//     use, the remaining users re-create it and make the topology operator
//     declare exchanges and bindings again (annotationRedeclare).
//
// Without a known operator namespace (out of cluster, no POD_NAMESPACE, no
// namespaced default broker) each user's namespace is its own home, as in
// earlier versions, with their hazard (docs/operations.md, "Shared
// topology").
//
// The Vhost object's deletionPolicy is retain unless every user of the
// pair that asked for the vhost asked for delete.

// annotationOrphaned marks a legacy shared object the operator deletes
// without the topology operator: its deletion is no loss.
const annotationOrphaned = "hcp.io/orphaned"

// envPodNamespace names the operator's namespace (the downward API's
// metadata.namespace); in a pod the service account's namespace file
// gives it too.
const envPodNamespace = "POD_NAMESPACE"

const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

var inClusterNamespace = sync.OnceValue(func() string {
	b, err := os.ReadFile(serviceAccountNamespaceFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// operatorNamespace is the shared topology's home: $POD_NAMESPACE, else
// the namespace of the pod's service account, else the namespace of the
// default connection Secret (--default-connection-secret=NAMESPACE/NAME:
// the chart puts it in the release namespace). Empty when none is known.
func (c *core) operatorNamespace() string {
	if ns := strings.TrimSpace(os.Getenv(envPodNamespace)); ns != "" {
		return ns
	}
	if ns := inClusterNamespace(); ns != "" {
		return ns
	}
	if d := c.opts.DefaultBroker; d != nil {
		return d.Namespace
	}
	return ""
}

// home is where v's shared objects live, and whether it is the operator's
// namespace (dedicated) or, failing one, v's own.
func (c *core) home(v view) (string, bool) {
	if ns := c.operatorNamespace(); ns != "" {
		return ns, true
	}
	return v.obj.GetNamespace(), false
}

// sharedNamespaces are the namespaces where shared objects and their users
// may be: all (""), or the watched ones plus home.
func (c *core) sharedNamespaces(home string) []string {
	if len(c.opts.WatchNamespaces) == 0 {
		return []string{""}
	}
	nss := slices.Clone(c.opts.WatchNamespaces)
	if !slices.Contains(nss, home) {
		nss = append(nss, home)
	}
	return nss
}

// readThrough reads from the API server and writes through the client: for
// a home namespace outside the manager's cache (--watch-namespaces).
type readThrough struct {
	client.Client
	r client.Reader
}

func (x readThrough) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return x.r.Get(ctx, key, obj, opts...)
}

func (x readThrough) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return x.r.List(ctx, list, opts...)
}

// in returns the core to use for objects in namespace ns: c itself when the
// cache holds ns, else one reading around the cache.
func (c *core) in(ns string) *core {
	if len(c.opts.WatchNamespaces) == 0 || slices.Contains(c.opts.WatchNamespaces, ns) {
		return c
	}
	cc := *c
	cc.Client = readThrough{Client: c.Client, r: c.apiReader}
	return &cc
}

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
	for _, x := range []*topologyv1beta1.Exchange{cmd, evt} {
		if e := c.epochs.get(key); e != "" {
			x.Annotations = map[string]string{annotationRedeclare: e}
		}
		live, err := hc.apply(ctx, nil, x)
		if err != nil {
			return nil, err
		}
		out = append(out, live)
	}
	pol, err := hc.apply(ctx, nil, resource.DefaultEventLimitsPolicy(home, b, ref))
	if err != nil {
		return nil, err
	}
	out = append(out, pol)
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

// redeclareAnnotations are set on a user's Binding after its exchange was
// lost.
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

// finalize runs when a Callee or Caller that holds its id is deleted. It
// deletes the object's own topology objects and waits until the topology
// operator has removed them from the broker; then, if no other Callee or
// Caller uses the (broker, vhost) pair, it deletes the pair's shared
// objects everywhere; then it lets the object go. The Deployment, Secrets
// and RBAC objects go by garbage collection.
func (c *core) finalize(ctx context.Context, v view, owned []client.Object) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	if !controllerutil.ContainsFinalizer(v.obj, TopologyFinalizer) {
		return ctrl.Result{}, nil
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

// liveUsersOfKey returns the other users of key that are not being
// deleted. The shared topology goes only when none is left, so "none"
// must not come from a cache that may miss a user that has just claimed
// the pair:
//
//   - another user in the cache is enough to keep the topology, with no
//     request: a claimed user goes only through its own finalizer, which
//     asks again;
//   - otherwise the API server is asked, unless it already answered
//     "none" for key and this manager has made no claim since
//     (claimLog): claims are this manager's, so no user can have appeared.
//     A mass deletion of N users thus lists them once, not N times.
func (c *core) liveUsersOfKey(ctx context.Context, v view, key string) ([]client.Object, error) {
	cached, err := c.userOfKey(ctx, key, "", v.obj.GetUID())
	if err != nil {
		return nil, err
	}
	if cached != nil {
		return []client.Object{cached}, nil
	}
	if c.claims.knownUnused(key) {
		return nil, nil
	}
	seq := c.claims.seqNow()
	home, _ := c.home(v)
	var out []client.Object
	for _, ns := range c.sharedNamespaces(home) {
		for _, l := range []client.ObjectList{&hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}} {
			opts := []client.ListOption{client.MatchingLabels{hcpv1alpha1.LabelVhostKey: key}}
			if ns != "" {
				opts = append(opts, client.InNamespace(ns))
			}
			if err := c.apiReader.List(ctx, l, opts...); err != nil {
				return nil, err
			}
			for _, o := range listItems(l) {
				if o.GetUID() != v.obj.GetUID() && o.GetDeletionTimestamp().IsZero() && claimed(o, key) {
					out = append(out, o)
				}
			}
		}
	}
	if len(out) == 0 {
		c.claims.markUnused(key, seq)
	}
	return out, nil
}

// claimLog lets finalizers trust an earlier "no live user" from the API
// server. One is shared by the Callee and Caller reconcilers of a manager
// (Setup); nil turns the memo off (every check asks the API server).
type claimLog struct {
	mu sync.Mutex
	// seq changes before and after every claim patch: a "none" read while
	// a claim was in flight is never trusted.
	seq uint64
	// unused: key → seq at which the API server listed no live user.
	unused map[string]uint64
}

// claiming brackets a claim patch: call it before, and the function it
// returns after.
func (l *claimLog) claiming() func() {
	if l == nil {
		return func() {}
	}
	bump := func() {
		l.mu.Lock()
		l.seq++
		l.mu.Unlock()
	}
	bump()
	return bump
}

func (l *claimLog) seqNow() uint64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq
}

// markUnused records that a list started at seq found no live user of key.
func (l *claimLog) markUnused(key string, seq uint64) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seq != seq {
		return // a claim happened meanwhile
	}
	if l.unused == nil {
		l.unused = map[string]uint64{}
	}
	l.unused[key] = seq
}

// knownUnused: the API server listed no live user of key and no claim
// was made since.
func (l *claimLog) knownUnused(key string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.unused[key]
	return ok && s == l.seq
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
