package controller

import (
	"cmp"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
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

// CalleeReconciler declares a Callee's topology, credentials and token keys
// (one Secret), and harness, and reports their state.
type CalleeReconciler struct {
	client.Client
	// APIReader reads around the cache (Secrets the cache does not hold).
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  events.EventRecorder
	Options   Options

	// claims is the claim log shared with the other kind's reconciler
	// (Setup); nil: every finalizer asks the API server.
	claims *claimLog

	core *core
	loop *harnessReconciler[*hcpv1alpha1.Callee]
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
		memo:      newStatusMemo(),
		pace:      newStatusPace(o.FirstStatusWait),
		created:   newCreateMemo(),
	}
}

// Reconcile runs the harness kinds' loop (harnessReconciler) with the
// Callee's build step.
func (r *CalleeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.loop.Reconcile(ctx, req)
}

func (r *CalleeReconciler) reconcile(ctx context.Context, callee *hcpv1alpha1.Callee, v view) (ctrl.Result, error) {
	st := &callee.Status
	st.CalleeID, st.Vhost = callee.ID(), resource.VhostOf(callee.Spec.Broker)
	if err := topology.ValidateID(callee.ID()); err != nil {
		return ctrl.Result{}, &problem{hcpv1alpha1.ReasonInvalidID, err.Error() + ": set spec.calleeID"}
	}
	b, prob, err := r.core.resolveBroker(ctx, v)
	if err != nil {
		return ctrl.Result{}, err
	}
	if prob != nil {
		// The fix usually shows up as a Secret event; this is a backstop
		// for Secrets the cache cannot see (unlabelled ones).
		return ctrl.Result{RequeueAfter: time.Minute}, prob
	}
	key := b.Key()
	holder, err := r.core.idHolder(ctx, v, key)
	if err != nil {
		return ctrl.Result{}, err
	}
	if holder != nil {
		return ctrl.Result{}, &problem{hcpv1alpha1.ReasonIDConflict, fmt.Sprintf(
			"calleeID %q is already used in vhost %q on this broker by %s (ids are unique per vhost and broker; the first claim wins); set another spec.calleeID, or delete the other object",
			callee.ID(), b.Vhost, describe(holder))}
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
	// It holds the token keys too (resource.WithTokenKeys).
	creds, err := r.core.ensureCredentials(ctx, v, b)
	if err != nil {
		return ctrl.Result{}, err
	}
	queue, args, err := r.core.queueAsDeclared(ctx, resource.CalleeQueue(callee, b))
	if err != nil {
		return ctrl.Result{}, err
	}
	annotations, err := r.core.bindingAnnotations(ctx, v, key)
	if err != nil {
		return ctrl.Result{}, err
	}
	in := desiredInput{sub: v.sub, broker: b, queue: queue, bindingAnnotations: annotations}
	topo, err := r.core.applyChildren(ctx, callee, desiredChildren(groupTopology, in))
	if err != nil {
		return ctrl.Result{}, err
	}
	topo = append(shared, topo...)
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
	sidecarRole := cmp.Or(r.Options.CalleeSidecarClusterRole, resource.DefaultCalleeSidecarClusterRole)
	h, res, err := r.core.deployHarness(ctx, v, holdsSidecar(callee, load), resource.HarnessParams{
		Subject:            v.sub,
		Harness:            callee.Spec.Harness,
		Sidecar:            callee.Spec.Sidecar,
		Vhost:              b.Vhost,
		Addresses:          b.AMQPAddresses,
		Image:              r.Options.SidecarImage,
		Tracing:            r.Options.SidecarTracing,
		Prefetch:           prefetch,
		SidecarClusterRole: sidecarRole,
		// No hash of the credentials Secret (token keys included): the
		// sidecar reads it as files and follows a rotation without a
		// restart.
	})
	if err != nil {
		return ctrl.Result{}, explainMissingRole(err, sidecarRole)
	}
	if h.dep != nil {
		// Not when the harness could not be applied: the hold (or its
		// absence) is unknown then.
		r.setSidecarUpdatePending(v, h.sidecarHeld, load)
	}
	if err := r.core.retireLegacyTokenSecret(ctx, v, creds, h.dep); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.setDeletionCosts(ctx, v, load.perPod); err != nil {
		return ctrl.Result{}, err
	}

	st.CommandQueue = v.sub.QueueName()
	st.Username = v.sub.Username(b.Vhost)
	st.CredentialsSecret = creds.Name
	st.TokenPublicKey = string(creds.Data[resource.TokenPublicKeyKey])
	if h.dep != nil {
		st.Replicas, st.ReadyReplicas = h.dep.Status.Replicas, h.dep.Status.ReadyReplicas
		st.Selector = podSelector(h.dep)
	}
	st.ActiveSessions = load.active
	return res, nil
}

// SetupWithManager registers the reconciler. SetupIndexes must have run.
func (r *CalleeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.core = newCore(r.Client, r.APIReader, r.Scheme, r.Recorder, r.Options, topology.RoleCallee)
	r.core.claims = r.claims
	r.loop = &harnessReconciler[*hcpv1alpha1.Callee]{core: r.core, newObject: func() *hcpv1alpha1.Callee { return &hcpv1alpha1.Callee{} }, build: r.reconcile}
	return r.core.watchChildren(ctrl.NewControllerManagedBy(mgr).For(&hcpv1alpha1.Callee{}, builder.WithPredicates(ownUpdate(r.core.memo))), &hcpv1alpha1.Callee{}).
		Watches(&hcpv1alpha1.Callee{}, handler.EnqueueRequestsFromMapFunc(r.core.mapIDPeers), builder.WithPredicates(ownUpdate(nil))).
		Watches(&hcpv1alpha1.HCPSession{}, handler.EnqueueRequestsFromMapFunc(r.mapSession), builder.WithPredicates(sessionActivityChanged())).
		// New pods get their deletion cost (their sessions may be recorded
		// before the cache sees them). Metadata only: the cost is all the
		// controller reads or writes of a pod.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.mapPod), builder.OnlyMetadata, builder.WithPredicates(onCreate())).
		Named("callee").
		Complete(r)
}
