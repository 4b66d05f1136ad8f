package controller

import (
	"context"
	"fmt"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
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

// CallerReconciler declares a Caller's event queue, credentials and, when
// it has one, its harness; the RBAC the manager needs is on
// CalleeReconciler.
type CallerReconciler struct {
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
	loop *harnessReconciler[*hcpv1alpha1.Caller]
}

// Reconcile runs the harness kinds' loop (harnessReconciler) with the
// Caller's build step.
func (r *CallerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.loop.Reconcile(ctx, req)
}

func (r *CallerReconciler) reconcile(ctx context.Context, caller *hcpv1alpha1.Caller, v view) (ctrl.Result, error) {
	st := &caller.Status
	st.CallerID, st.Vhost = caller.ID(), resource.VhostOf(caller.Spec.Broker)
	st.External = caller.Spec.Harness == nil
	if err := topology.ValidateID(caller.ID()); err != nil {
		return ctrl.Result{}, &problem{hcpv1alpha1.ReasonInvalidID, err.Error() + ": set spec.callerID"}
	}
	b, prob, err := r.core.resolveBroker(ctx, v)
	if err != nil {
		return ctrl.Result{}, err
	}
	if prob != nil {
		return ctrl.Result{RequeueAfter: time.Minute}, prob
	}
	key := b.Key()
	holder, err := r.core.idHolder(ctx, v, key)
	if err != nil {
		return ctrl.Result{}, err
	}
	if holder != nil {
		st.SessionNamespaces = nil
		if err := r.core.revokeSessionReads(ctx, v); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, &problem{hcpv1alpha1.ReasonIDConflict, fmt.Sprintf(
			"callerID %q is already used in vhost %q on this broker by %s (ids are unique per vhost and broker; the first claim wins); set another spec.callerID, or delete the other object",
			caller.ID(), b.Vhost, describe(holder))}
	}
	queue, err := resource.CallerQueue(caller, b)
	if err != nil {
		return ctrl.Result{}, &problem{hcpv1alpha1.ReasonReconcileFailed, err.Error()}
	}
	if err := r.core.claim(ctx, v, key); err != nil {
		return ctrl.Result{}, err
	}

	shared, err := r.core.ensureShared(ctx, v, b)
	if err != nil {
		return ctrl.Result{}, err
	}
	creds, err := r.core.ensureCredentials(ctx, v, b)
	if err != nil {
		return ctrl.Result{}, err
	}
	queue, args, err := r.core.queueAsDeclared(ctx, queue)
	if err != nil {
		return ctrl.Result{}, err
	}
	annotations, err := r.core.bindingAnnotations(ctx, v, key)
	if err != nil {
		return ctrl.Result{}, err
	}
	in := desiredInput{sub: v.sub, broker: b, queue: queue, bindingAnnotations: annotations}
	topo, err := r.core.applyChildren(ctx, caller, desiredChildren(groupTopology, in))
	if err != nil {
		return ctrl.Result{}, err
	}
	topo = append(shared, topo...)
	// CallerQueue has checked the limits: no error here.
	limits, _ := resource.CallerQueueLimits(caller.Spec.EventQueue)
	desiredPolicy, _ := resource.CallerLimitsPolicy(caller, b)
	var pol *topologyv1beta1.Policy
	if desiredPolicy != nil || defaultLimitsReady(shared) {
		// A Caller of an earlier version with the default limits has a
		// policy of its own: it goes only once the vhost's default one is
		// declared, so that the queue is never without its limits.
		if pol, err = r.core.ensureLimitsPolicy(ctx, v, desiredPolicy, args, limits); err != nil {
			return ctrl.Result{}, err
		}
	}
	r.core.setTopologyReadyWithPolicy(v, topo, pol)

	st.EventQueue = v.sub.QueueName()
	st.Username = v.sub.Username(b.Vhost)
	st.CredentialsSecret = creds.Name

	// The sidecar's reads of HCPSessions where its Callees are
	// (caller_grants.go); none for an external Caller.
	reads, err := r.core.grantSessionReads(ctx, caller, key)
	if err != nil {
		return ctrl.Result{}, err
	}
	st.SessionNamespaces = reads.namespaces

	if caller.Spec.Harness == nil {
		// External: remove a harness the Caller used to have (no
		// harness: every harness child is unwanted).
		if _, err := r.core.applyChildren(ctx, caller, desiredChildren(groupHarness, in)); err != nil {
			return ctrl.Result{}, err
		}
		st.Replicas, st.ReadyReplicas, st.Selector = 0, 0, ""
		setCondition(v, hcpv1alpha1.ConditionHarnessReady, true, hcpv1alpha1.ReasonNoHarness,
			fmt.Sprintf("external caller: no harness is deployed; the program connects with the credentials in Secret %s (keys uri, username, password, vhost)", creds.Name))
		return ctrl.Result{}, nil
	}

	prefetch := caller.Spec.Consumer.Prefetch
	if prefetch == 0 {
		prefetch = config.DefaultCallerPrefetch
	}
	if p := caller.Spec.Sidecar.Prefetch; p != nil {
		prefetch = *p // the sidecar override wins
	}
	h, res, err := r.core.deployHarness(ctx, v, false, resource.HarnessParams{
		Subject:        v.sub,
		Harness:        *caller.Spec.Harness,
		Sidecar:        caller.Spec.Sidecar,
		Vhost:          b.Vhost,
		Addresses:      b.AMQPAddresses,
		Image:          r.Options.SidecarImage,
		Tracing:        r.Options.SidecarTracing,
		Prefetch:       prefetch,
		AppMaxBatch:    caller.Spec.Consumer.AppMaxBatch,
		AppStream:      caller.Spec.Consumer.AppStream,
		AppMaxAttempts: caller.Spec.MaxAttempts(),
		// The credentials Secret is read as a file, followed on rotation.
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	if h.dep != nil {
		st.Replicas, st.ReadyReplicas = h.dep.Status.Replicas, h.dep.Status.ReadyReplicas
		st.Selector = podSelector(h.dep)
	}
	if reads.recheck > 0 && (res.RequeueAfter == 0 || reads.recheck < res.RequeueAfter) {
		res.RequeueAfter = reads.recheck
	}
	return res, nil
}

// SetupWithManager registers the reconciler. SetupIndexes must have run.
func (r *CallerReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.core = newCore(r.Client, r.APIReader, r.Scheme, r.Recorder, r.Options, topology.RoleCaller)
	r.core.claims = r.claims
	r.loop = &harnessReconciler[*hcpv1alpha1.Caller]{core: r.core, newObject: func() *hcpv1alpha1.Caller { return &hcpv1alpha1.Caller{} }, build: r.reconcile}
	return r.watchSessionReads(r.core.watchChildren(ctrl.NewControllerManagedBy(mgr).For(&hcpv1alpha1.Caller{}, builder.WithPredicates(ownUpdate(r.core.memo))), &hcpv1alpha1.Caller{})).
		Watches(&hcpv1alpha1.Caller{}, handler.EnqueueRequestsFromMapFunc(r.core.mapIDPeers), builder.WithPredicates(ownUpdate(nil))).
		Named("caller").
		Complete(r)
}
