package controller

import (
	"context"
	"fmt"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// What the Callee controller does for draining and rollouts, beside the
// sidecar's own drain: it holds sidecar-only updates back under
// spec.sidecar.updatePolicy OnDrain, and it tells the ReplicaSet controller
// which replicas to delete first on scale-down through the
// controller.kubernetes.io/pod-deletion-cost annotation.
//
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch

// sessionLoad is what a Callee's sessions weigh: those not in a terminal
// state, in all and per pod (status.podName).
type sessionLoad struct {
	active int32
	perPod map[string]int
}

// sessionLoad counts the Callee's HCPSessions not in a terminal state (a
// session whose state is not written yet is PENDING), in all and per pod.
func (r *CalleeReconciler) sessionLoad(ctx context.Context, callee *hcpv1alpha1.Callee) (sessionLoad, error) {
	var list hcpv1alpha1.HCPSessionList
	if err := r.List(ctx, &list, client.InNamespace(callee.Namespace), client.MatchingFields{indexSessionCallee: callee.ID()}, client.UnsafeDisableDeepCopy); err != nil {
		return sessionLoad{}, err
	}
	load := sessionLoad{perPod: map[string]int{}}
	for i := range list.Items {
		s := &list.Items[i]
		if s.Status.State.IsTerminal() || !s.DeletionTimestamp.IsZero() {
			continue
		}
		load.active++
		if s.Status.PodName != "" {
			load.perPod[s.Status.PodName]++
		}
	}
	return load, nil
}

// holdsSidecar: spec.sidecar.updatePolicy OnDrain with active sessions.
func holdsSidecar(callee *hcpv1alpha1.Callee, load sessionLoad) bool {
	return callee.Spec.Sidecar.UpdatePolicy == hcpv1alpha1.SidecarUpdateOnDrain && load.active > 0
}

// keepSidecar, called when the sidecar is held back, decides whether the
// running pods keep their sidecar: only when the sidecar is all that
// changed. When anything else in the pod template changed too, the pods
// roll anyway, and they roll with the new sidecar. When it keeps the
// sidecar, desired gets live's template.
func keepSidecar(live, desired *appsv1.Deployment) bool {
	if !sidecarOnlyChange(live, desired) {
		return false
	}
	desired.Spec.Template = *live.Spec.Template.DeepCopy()
	return true
}

// sidecarOnlyChange: of what the operator renders into the pod template,
// desired changes the sidecar and nothing else (by the template's hash
// annotations).
func sidecarOnlyChange(live, desired *appsv1.Deployment) bool {
	have, want := live.Spec.Template.Annotations, desired.Spec.Template.Annotations
	return have[hcpv1alpha1.AnnotationConfigHash] == want[hcpv1alpha1.AnnotationConfigHash] &&
		have[resource.AnnotationSidecarHash] != want[resource.AnnotationSidecarHash]
}

// setSidecarUpdatePending sets or removes SidecarUpdatePending, with an
// Event when a hold starts.
func (r *CalleeReconciler) setSidecarUpdatePending(v view, held bool, load sessionLoad) {
	if !held {
		meta.RemoveStatusCondition(v.conditions, hcpv1alpha1.ConditionSidecarUpdatePending)
		return
	}
	msg := fmt.Sprintf("%d sessions active: the running pods keep their hcp-sidecar until none is (spec.sidecar.updatePolicy: OnDrain); a change to anything else in the pod template rolls the new sidecar with it", load.active)
	if c := meta.FindStatusCondition(*v.conditions, hcpv1alpha1.ConditionSidecarUpdatePending); c == nil || c.Status != metav1.ConditionTrue {
		r.Recorder.Eventf(v.obj, nil, corev1.EventTypeNormal, "SidecarUpdateHeld", "Reconcile", "The hcp-sidecar update waits for %d active sessions", load.active)
	}
	setCondition(v, hcpv1alpha1.ConditionSidecarUpdatePending, true, hcpv1alpha1.ReasonSessionsActive, msg)
}

// setDeletionCosts annotates each of the Callee's pods with its number of
// live sessions as controller.kubernetes.io/pod-deletion-cost: on a
// scale-down (and when a rolling update scales an old ReplicaSet down) the
// ReplicaSet controller deletes the pods of lowest cost first, so the
// replicas with fewer sessions to hand over go first. Only a changed count
// is written; no annotation counts as 0. Pods being deleted are left alone.
func (r *CalleeReconciler) setDeletionCosts(ctx context.Context, v view, perPod map[string]int) error {
	pods := &metav1.PartialObjectMetadataList{}
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := r.List(ctx, pods, client.InNamespace(v.sub.Namespace), client.MatchingLabels(v.sub.SelectorLabels())); err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !pod.DeletionTimestamp.IsZero() {
			continue
		}
		want := perPod[pod.Name]
		have, ok := pod.Annotations[corev1.PodDeletionCost]
		if n, err := strconv.Atoi(have); (ok && err == nil && n == want) || (!ok && want == 0) {
			continue
		}
		orig := pod.DeepCopy()
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[corev1.PodDeletionCost] = strconv.Itoa(want)
		if err := r.core.Patch(ctx, pod, client.MergeFrom(orig)); err != nil {
			if client.IgnoreNotFound(err) == nil {
				continue
			}
			return fmt.Errorf("pod %s: %w", pod.Name, err)
		}
		ctrl.LoggerFrom(ctx).V(1).Info("Set pod deletion cost", "pod", klog.KObj(pod), "sessions", want)
	}
	return nil
}

// mapPod maps a harness pod to its Callee through the hcp.io/callee label
// (the Callee's name, shortened by LabelValue when long).
func (r *CalleeReconciler) mapPod(ctx context.Context, obj client.Object) []reconcile.Request {
	label, ok := obj.GetLabels()[hcpv1alpha1.LabelCallee]
	if !ok {
		return nil
	}
	var list hcpv1alpha1.CalleeList
	if err := r.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to find the Callee of a pod")
		return nil
	}
	for i := range list.Items {
		if resource.LabelValue(list.Items[i].Name) == label {
			return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}}
		}
	}
	return nil
}
