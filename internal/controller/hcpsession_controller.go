package controller

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// DefaultSessionTTL applies when a session's Callee is gone or sets no
// ttlAfterFinished (the CRD's default).
const DefaultSessionTTL = 24 * time.Hour

// DefaultRejectedTTL applies to REJECTED sessions when their Callee is gone
// or sets no ttlAfterRejected (the CRD's default).
const DefaultRejectedTTL = 10 * time.Minute

// HCPSessionReconciler deletes finished HCPSessions ttlAfterFinished after
// they ended (rejected ones ttlAfterRejected after) (the Callee's spec.sessions.ttlAfterFinished). Sessions are the
// sidecars' read model; housekeeping is the operator's.
type HCPSessionReconciler struct {
	client.Client
	// Clock is the time source; nil means the real clock.
	Clock clock.PassiveClock
}

// Reconcile deletes the session when its TTL has passed, else requeues for
// when it will have.
func (r *HCPSessionReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	s := &hcpv1alpha1.HCPSession{}
	if err := r.Get(ctx, req.NamespacedName, s); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !s.Status.State.IsTerminal() || !s.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	ttl, err := r.ttl(ctx, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	expires := finishedAt(s).Add(ttl)
	now := r.now()
	if now.Before(expires) {
		return ctrl.Result{RequeueAfter: expires.Sub(now)}, nil
	}
	// The UID precondition keeps a recreated namesake safe.
	if err := r.Delete(ctx, s, client.Preconditions{UID: new(s.UID)}); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	ctrl.LoggerFrom(ctx).Info("Deleted finished session", "state", s.Status.State, "finishedAt", finishedAt(s), "ttlAfterFinished", ttl)
	return ctrl.Result{}, nil
}

func (r *HCPSessionReconciler) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}

// finishedAt is when the session ended: completedAt, else its last event,
// else its creation (a sidecar that crashed before writing completedAt).
func finishedAt(s *hcpv1alpha1.HCPSession) time.Time {
	for _, t := range []*metav1.Time{s.Status.CompletedAt, s.Status.LastEventAt} {
		if t != nil {
			return t.Time
		}
	}
	return s.CreationTimestamp.Time
}

// ttl is the session's Callee's ttlAfterRejected for a rejected task, else
// its ttlAfterFinished.
func (r *HCPSessionReconciler) ttl(ctx context.Context, s *hcpv1alpha1.HCPSession) (time.Duration, error) {
	field, def := "ttlAfterFinished", DefaultSessionTTL
	if s.Status.State == hcpv1alpha1.SessionRejected {
		field, def = "ttlAfterRejected", DefaultRejectedTTL
	}
	reqs := calleeOfSession(ctx, r.Client, s)
	if len(reqs) == 0 {
		return def, nil
	}
	callee := &hcpv1alpha1.Callee{}
	if err := r.Get(ctx, reqs[0].NamespacedName, callee); err != nil {
		if apierrors.IsNotFound(err) {
			return def, nil
		}
		return 0, err
	}
	v := callee.Spec.Sessions.TTLAfterFinished
	if s.Status.State == hcpv1alpha1.SessionRejected {
		v = callee.Spec.Sessions.TTLAfterRejected
	}
	if v == "" {
		return def, nil
	}
	d, err := task.ParseDuration(string(v))
	if err != nil {
		// The CRD pattern admits only valid durations; be safe anyway.
		ctrl.LoggerFrom(ctx).Error(err, "Invalid "+field+"; using the default", "callee", callee.Name)
		return def, nil
	}
	return d, nil
}

// SetupWithManager registers the reconciler. SetupIndexes must have run.
func (r *HCPSessionReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := registerSessionMetrics(r.Client, r.Clock); err != nil {
		return err
	}
	terminal := predicate.NewPredicateFuncs(func(o client.Object) bool {
		s, ok := o.(*hcpv1alpha1.HCPSession)
		return ok && s.Status.State.IsTerminal()
	})
	return ctrl.NewControllerManagedBy(mgr).
		For(&hcpv1alpha1.HCPSession{}, builder.WithPredicates(terminal)).
		// A changed TTL applies to the Callee's finished sessions at once.
		Watches(&hcpv1alpha1.Callee{}, handler.EnqueueRequestsFromMapFunc(r.sessionsOfCallee),
			builder.WithPredicates(predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return false },
				DeleteFunc:  func(event.DeleteEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
				UpdateFunc: func(e event.UpdateEvent) bool {
					o, ok1 := e.ObjectOld.(*hcpv1alpha1.Callee)
					n, ok2 := e.ObjectNew.(*hcpv1alpha1.Callee)
					return ok1 && ok2 && o.Spec.Sessions.TTLAfterFinished != n.Spec.Sessions.TTLAfterFinished
				},
			})).
		Named("hcpsession").
		Complete(r)
}

func (r *HCPSessionReconciler) sessionsOfCallee(ctx context.Context, obj client.Object) []reconcile.Request {
	c, ok := obj.(*hcpv1alpha1.Callee)
	if !ok {
		return nil
	}
	var list hcpv1alpha1.HCPSessionList
	if err := r.List(ctx, &list, client.InNamespace(c.Namespace), client.MatchingFields{indexSessionCallee: c.ID()}, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list the sessions of a Callee")
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if list.Items[i].Status.State.IsTerminal() {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: list.Items[i].Name}})
		}
	}
	return reqs
}
