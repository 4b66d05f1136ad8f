package controller

import (
	"context"
	"errors"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// harnessObject is a harness kind: Callee or Caller.
type harnessObject interface {
	client.Object
	*hcpv1alpha1.Callee | *hcpv1alpha1.Caller
}

// harnessReconciler is the one reconcile loop of the harness kinds:
//
//	fetch (with the status last written: statusMemo) → deletion (finalize)
//	or build → status → one status write
//
// The kind's build step (Callee: reconcileCallee, Caller: reconcileCaller)
// resolves the broker and the id claim, builds the desired children with
// desiredChildren (pure, from the childKinds table), applies them with a
// create or server-side apply (applyChildren) and derives the status from
// what it observed (setTopologyReady, setHarnessReady). This loop does
// the rest the same way for both kinds: conflicts, Ready and kstatus'
// conditions from the outcome (setOutcome, the one place they are set),
// observedGeneration, one Event per verb for the children (emitChanges)
// and a status write only when the status changed.
type harnessReconciler[T harnessObject] struct {
	core *core
	// newObject returns an empty object of the kind.
	newObject func() T
	// build is the kind's step for an object not being deleted. A
	// *problem it returns (as the error) blocks the object until the
	// user fixes it; any other error is retried.
	build func(ctx context.Context, obj T, v view) (ctrl.Result, error)
}

// Reconcile implements reconcile.Reconciler.
func (h *harnessReconciler[T]) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obj := h.newObject()
	if err := h.core.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	h.core.memo.fresh(obj)
	before := obj.DeepCopyObject().(client.Object)
	bv, _ := viewOf(before)
	v, _ := viewOf(obj)
	ctx, changes := withChangeLog(ctx)
	var res ctrl.Result
	var err error
	deleting := !obj.GetDeletionTimestamp().IsZero()
	if deleting {
		res, err = h.core.finalize(ctx, v, topologyObjects(v.sub))
	} else {
		res, err = h.build(ctx, obj, v)
	}
	h.core.emitChanges(obj, changes, firstRollout(obj.GetGeneration(), *bv.conditions))
	if apierrors.IsConflict(err) {
		// A write raced with another (often our own status write seen
		// late by the cache): start again from a fresh read.
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	var prob *problem
	if errors.As(err, &prob) {
		err = nil // the user's to fix: no retry with back-off
	}
	setOutcome(v, deleting, prob, err)
	if equality.Semantic.DeepEqual(bv.status, v.status) {
		return res, err
	}
	if wait := h.core.pace.holdFirst(obj, bv, v, err); wait > 0 {
		// A new object's first rollout that only waits: its one status
		// write is Ready, unless the wait outlasts Options.FirstStatusWait.
		if res.RequeueAfter == 0 || wait < res.RequeueAfter {
			res.RequeueAfter = wait
		}
		return res, nil
	}
	if wait := h.core.pace.hold(obj, bv, v); wait > 0 && err == nil {
		// Only the detail of a wait changed, and the status was written
		// a moment ago (pendingPace): written on the requeue, or by the
		// reconcile whose outcome changes first.
		if res.RequeueAfter == 0 || wait < res.RequeueAfter {
			res.RequeueAfter = wait
		}
		return res, nil
	}
	// The status patch goes from before: obj's metadata as read, its
	// status as it was.
	statusBefore := obj.DeepCopyObject().(client.Object)
	sv, _ := viewOf(statusBefore)
	sv.setStatus(bv.status)
	err = errors.Join(err, h.core.writeStatus(ctx, statusBefore, obj, *bv.conditions, *v.conditions))
	h.core.pace.wrote(obj.GetUID())
	return res, err
}

// firstRollout reports whether an object at generation with these
// conditions (as read, before the reconcile) is in its first rollout: its
// spec never changed and it has not been Ready, nor failed, yet (no Ready
// condition, or one that waits).
func firstRollout(generation int64, conds []metav1.Condition) bool {
	if generation > 1 {
		return false
	}
	ready := meta.FindStatusCondition(conds, hcpv1alpha1.ConditionReady)
	return ready == nil || waiting(ready)
}

// ensureHarness applies the harness children (childKinds' harness group):
// the Deployment and what its pods need. With holdSidecar, a change of the
// sidecar alone is not applied (keepSidecar); the second result says
// whether one was held back.
func (c *core) ensureHarness(ctx context.Context, v view, p resource.HarnessParams, holdSidecar bool) (*appsv1.Deployment, bool, error) {
	children := desiredChildren(groupHarness, desiredInput{sub: v.sub, harness: &p, pdb: p.Harness.PodDisruptionBudget})
	held := false
	for _, ch := range children {
		desired, ok := ch.obj.(*appsv1.Deployment)
		if !ok || !holdSidecar {
			continue
		}
		key := client.ObjectKeyFromObject(desired)
		live := &appsv1.Deployment{}
		switch err := c.Get(ctx, key, live); {
		case err == nil:
			if !sidecarOnlyChange(live, desired) {
				break
			}
			// The cache holds no pod spec (trimDeployment): the template
			// the pods keep comes from the API server.
			if err := c.apiReader.Get(ctx, key, live); err != nil {
				return nil, false, err
			}
			held = keepSidecar(live, desired)
		case !apierrors.IsNotFound(err):
			return nil, false, err
		}
	}
	live, err := c.applyChildren(ctx, v.obj, children)
	if err != nil {
		return nil, false, err
	}
	for _, o := range live {
		if d, ok := o.(*appsv1.Deployment); ok {
			return d, held, nil
		}
	}
	return nil, false, errors.New("the harness children hold no Deployment")
}
