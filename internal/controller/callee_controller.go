package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// RBAC of the manager. The verbs on hcpsessions, capabilitypolicies,
// callers and events beyond what the operator itself uses are held so that
// it may grant them to the sidecars' Roles (Kubernetes forbids granting
// permissions one does not hold).
//
// +kubebuilder:rbac:groups=hcp.io,resources=callees;callers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=hcp.io,resources=callees/status;callers/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hcp.io,resources=callees/finalizers;callers/finalizers,verbs=update
// +kubebuilder:rbac:groups=hcp.io,resources=hcpsessions,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=hcp.io,resources=hcpsessions/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hcp.io,resources=capabilitypolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=rabbitmq.com,resources=vhosts;exchanges;queues;bindings;users;permissions;policies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// CalleeReconciler declares a Callee's topology, credentials, token key and
// harness, and reports their state.
type CalleeReconciler struct {
	client.Client
	// APIReader reads around the cache (Secrets the cache does not hold).
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  events.EventRecorder
	Options   Options

	core *core
}

func newCore(c client.Client, apiReader client.Reader, s *runtime.Scheme, rec events.EventRecorder, o Options, role topology.Role) *core {
	return &core{
		Client:    client.WithFieldOwner(c, resource.FieldManager),
		apiReader: apiReader,
		scheme:    s,
		recorder:  rec,
		opts:      o,
		role:      role,
		epochs:    &epochs{},
	}
}

// topologyObjects are the topology operator objects a subject owns, empty
// but for their names (the finalizer deletes them and waits).
func topologyObjects(s resource.Subject) []client.Object {
	key := func(o client.Object) client.Object {
		o.SetNamespace(s.Namespace)
		o.SetName(s.BaseName())
		return o
	}
	return []client.Object{key(&topologyv1beta1.Binding{}), key(&topologyv1beta1.Permission{}), key(&topologyv1beta1.Policy{}), key(&topologyv1beta1.Queue{}), key(&topologyv1beta1.User{})}
}

// Reconcile follows the usual skeleton: get, finalizer/delete branch,
// build, apply, one status write.
//
//nolint:dupl // CallerReconciler.Reconcile is the same skeleton over another status type.
func (r *CalleeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	callee := &hcpv1alpha1.Callee{}
	if err := r.Get(ctx, req.NamespacedName, callee); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	oldStatus := callee.Status.DeepCopy()
	v := calleeView(callee)
	var res ctrl.Result
	var err error
	deleting := !callee.DeletionTimestamp.IsZero()
	if deleting {
		res, err = r.core.finalize(ctx, v, topologyObjects(v.sub))
	} else {
		res, err = r.reconcile(ctx, callee, v)
	}
	switch {
	case apierrors.IsConflict(err):
		// A write raced with another (often our own status write seen
		// late by the cache): start again from a fresh read.
		return ctrl.Result{RequeueAfter: time.Second}, nil
	case err != nil:
		setCondition(v, hcpv1alpha1.ConditionReady, false, hcpv1alpha1.ReasonReconcileFailed, err.Error())
	case !deleting:
		callee.Status.ObservedGeneration = callee.Generation
	}
	if !equality.Semantic.DeepEqual(*oldStatus, callee.Status) {
		before := callee.DeepCopy()
		before.Status = *oldStatus
		err = errors.Join(err, r.core.writeStatus(ctx, before, callee, oldStatus.Conditions, callee.Status.Conditions))
	}
	return res, err
}

func (r *CalleeReconciler) reconcile(ctx context.Context, callee *hcpv1alpha1.Callee, v view) (ctrl.Result, error) {
	st := &callee.Status
	st.CalleeID, st.Vhost = callee.ID(), resource.VhostOf(callee.Spec.Broker)
	if err := topology.ValidateID(callee.ID()); err != nil {
		setBlocked(v, hcpv1alpha1.ReasonInvalidID, err.Error()+": set spec.calleeID")
		return ctrl.Result{}, nil
	}
	b, prob, err := r.core.resolveBroker(ctx, v)
	if err != nil {
		return ctrl.Result{}, err
	}
	if prob != nil {
		setBlocked(v, prob.reason, prob.message)
		// The fix usually shows up as a Secret event; this is a backstop
		// for Secrets the cache cannot see (unlabelled ones).
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	}
	key := b.Key()
	holder, err := r.core.idHolder(ctx, v, key)
	if err != nil {
		return ctrl.Result{}, err
	}
	if holder != nil {
		setBlocked(v, hcpv1alpha1.ReasonIDConflict, fmt.Sprintf(
			"calleeID %q is already used in vhost %q on this broker by %s (ids are unique per vhost and broker; the first claim wins); set another spec.calleeID, or delete the other object",
			callee.ID(), b.Vhost, describe(holder)))
		return ctrl.Result{}, nil
	}
	if err := r.core.claim(ctx, v, key); err != nil {
		return ctrl.Result{}, err
	}

	shared, err := r.core.ensureShared(ctx, v, b)
	if err != nil {
		return ctrl.Result{}, err
	}
	// The credentials Secret first: the topology operator's webhook refuses
	// a User whose import Secret does not exist yet.
	creds, err := r.core.ensureCredentials(ctx, v, b)
	if err != nil {
		return ctrl.Result{}, err
	}
	tok, err := r.core.ensureTokenKey(ctx, v)
	if err != nil {
		return ctrl.Result{}, err
	}
	binding := resource.Binding(v.sub, b)
	binding.Annotations = r.core.redeclareAnnotations(key)
	queue, args, err := r.core.queueAsDeclared(ctx, resource.CalleeQueue(callee, b))
	if err != nil {
		return ctrl.Result{}, err
	}
	topo := shared
	for _, desired := range []client.Object{queue, binding, resource.User(v.sub, b), resource.Permission(v.sub, b)} {
		live, err := r.core.apply(ctx, callee, desired)
		if err != nil {
			return ctrl.Result{}, err
		}
		topo = append(topo, live)
	}
	pol, err := r.core.ensureLimitsPolicy(ctx, v, resource.CalleeLimitsPolicy(callee, b), args, resource.CalleeQueueLimits(callee.Spec.CommandQueue))
	if err != nil {
		return ctrl.Result{}, err
	}
	r.core.setTopologyReadyWithPolicy(v, topo, pol)

	load, err := r.sessionLoad(ctx, callee)
	if err != nil {
		return ctrl.Result{}, err
	}
	prefetch := int32(config.DefaultCalleePrefetch)
	if p := callee.Spec.Sidecar.Prefetch; p != nil {
		prefetch = *p
	}
	h, res, err := r.core.deployHarness(ctx, v, holdsSidecar(callee, load), resource.HarnessParams{
		Subject:  v.sub,
		Harness:  callee.Spec.Harness,
		Sidecar:  callee.Spec.Sidecar,
		Vhost:    b.Vhost,
		Image:    r.Options.SidecarImage,
		Tracing:  r.Options.SidecarTracing,
		Prefetch: prefetch,
		// No hash of the credentials and token Secrets: the sidecar reads
		// them as files and follows a rotation without a restart.
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	if h.dep != nil {
		// Not when the harness could not be applied: the hold (or its
		// absence) is unknown then.
		r.setSidecarUpdatePending(v, h.sidecarHeld, load)
	}
	if err := r.setDeletionCosts(ctx, v, load.perPod); err != nil {
		return ctrl.Result{}, err
	}

	st.CommandQueue = v.sub.QueueName()
	st.Username = v.sub.Username(b.Vhost)
	st.CredentialsSecret = creds.Name
	st.TokenPublicKey = string(tok.Data[resource.TokenPublicKeyKey])
	if h.dep != nil {
		st.Replicas, st.ReadyReplicas = h.dep.Status.Replicas, h.dep.Status.ReadyReplicas
		st.Selector = podSelector(h.dep)
	}
	st.ActiveSessions = load.active
	return res, nil
}

// ensureHarness applies the harness Deployment and what its pods need.
// With holdSidecar, a change of the sidecar alone is not applied
// (keepSidecar); the second result says whether one was held back.
func (c *core) ensureHarness(ctx context.Context, v view, p resource.HarnessParams, holdSidecar bool) (*appsv1.Deployment, bool, error) {
	for _, desired := range []client.Object{resource.ServiceAccount(v.sub), resource.Role(v.sub), resource.RoleBinding(v.sub)} {
		if _, err := c.apply(ctx, v.obj, desired); err != nil {
			return nil, false, err
		}
	}
	if err := c.ensurePodDisruptionBudget(ctx, v, p.Harness.PodDisruptionBudget); err != nil {
		return nil, false, err
	}
	desired := resource.Deployment(p)
	held := false
	if holdSidecar {
		live := &appsv1.Deployment{}
		switch err := c.Get(ctx, client.ObjectKeyFromObject(desired), live); {
		case err == nil:
			held = keepSidecar(live, desired)
		case !apierrors.IsNotFound(err):
			return nil, false, err
		}
	}
	live, err := c.apply(ctx, v.obj, desired)
	if err != nil {
		return nil, false, err
	}
	return live.(*appsv1.Deployment), held, nil
}

// ensurePodDisruptionBudget applies spec.harness.podDisruptionBudget, or
// deletes the one the operator made when it is unset.
func (c *core) ensurePodDisruptionBudget(ctx context.Context, v view, spec *hcpv1alpha1.PodDisruptionBudgetSpec) error {
	if spec == nil {
		return c.deleteOwned(ctx, v.obj, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: v.sub.Namespace, Name: v.sub.BaseName()}})
	}
	_, err := c.apply(ctx, v.obj, resource.PodDisruptionBudget(v.sub, *spec))
	return err
}

// harnessObjects are the objects a harness brings, empty but for names.
func harnessObjects(s resource.Subject) []client.Object {
	objs := []client.Object{&appsv1.Deployment{}, &policyv1.PodDisruptionBudget{}, &rbacv1.RoleBinding{}, &rbacv1.Role{}, &corev1.ServiceAccount{}}
	for _, o := range objs {
		o.SetNamespace(s.Namespace)
		o.SetName(s.BaseName())
	}
	return objs
}

// watchChildren adds to b what a Callee and a Caller both own and watch:
// their children, the shared topology objects, and the Secrets they use.
func (c *core) watchChildren(b *builder.Builder) *builder.Builder {
	return b.
		Owns(&topologyv1beta1.Queue{}).
		Owns(&topologyv1beta1.Binding{}).
		Owns(&topologyv1beta1.User{}).
		Owns(&topologyv1beta1.Permission{}).
		Owns(&topologyv1beta1.Policy{}).
		Owns(&corev1.Secret{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&rbacv1.Role{}).
		Owns(&rbacv1.RoleBinding{}).
		Owns(&appsv1.Deployment{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Watches(&topologyv1beta1.Exchange{}, c.exchangeLossHandler()).
		Watches(&topologyv1beta1.Vhost{}, c.exchangeLossHandler()).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(c.mapSecret))
}

// SetupWithManager registers the reconciler. SetupIndexes must have run.
func (r *CalleeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.core = newCore(r.Client, r.APIReader, r.Scheme, r.Recorder, r.Options, topology.RoleCallee)
	return r.core.watchChildren(ctrl.NewControllerManagedBy(mgr).For(&hcpv1alpha1.Callee{})).
		Watches(&hcpv1alpha1.Callee{}, handler.EnqueueRequestsFromMapFunc(r.core.mapIDPeers)).
		Watches(&hcpv1alpha1.HCPSession{}, handler.EnqueueRequestsFromMapFunc(r.mapSession), builder.WithPredicates(sessionActivityChanged())).
		// New pods get their deletion cost (their sessions may be recorded
		// before the cache sees them). Metadata only: the cost is all the
		// controller reads or writes of a pod.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.mapPod), builder.OnlyMetadata, builder.WithPredicates(onCreate())).
		Named("callee").
		Complete(r)
}
