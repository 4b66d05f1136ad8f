package controller

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
)

// CapabilityPolicyReconciler validates CapabilityPolicies and reports in
// their status which Callees and Callers they reach.
//
// It pushes nothing anywhere, on purpose. Every callee sidecar watches the
// CapabilityPolicies (and Callers) of its namespace through its own informer
// and runs policy.Decide on each task_submit, so an edited policy reaches
// every affected gate as soon as the watch event does, with no pod restart,
// no config hash and no ordering against this controller. The controller's
// job is validation and visibility: it compiles the rules exactly as the
// gate does (internal/policy), and says in status what CEL cannot (invalid
// label selectors, rules that match nothing) so that a mistake shows in
// `kubectl get capabilitypolicies` instead of as a task_rejected.
type CapabilityPolicyReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder events.EventRecorder
}

// maxConditionMessage keeps condition messages well below the API's 32768.
const maxConditionMessage = 4096

// +kubebuilder:rbac:groups=hcp.io,resources=capabilitypolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=hcp.io,resources=capabilitypolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hcp.io,resources=callees;callers,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile validates one policy and writes its status: observedGeneration,
// matchedCallees, matchedCallers, and the Ready and RulesMatched conditions.
// It writes at most once, and only when something changed.
func (r *CapabilityPolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)

	var p hcpv1alpha1.CapabilityPolicy
	if err := r.Get(ctx, req.NamespacedName, &p); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !p.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // nothing outside the object to clean up
	}
	var callees hcpv1alpha1.CalleeList
	if err := r.List(ctx, &callees, client.InNamespace(p.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, err
	}
	var callers hcpv1alpha1.CallerList
	if err := r.List(ctx, &callers, client.InNamespace(p.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, err
	}

	before := p.DeepCopy()
	setPolicyStatus(&p, callees.Items, callers.Items)
	if equality.Semantic.DeepEqual(before.Status, p.Status) {
		return ctrl.Result{}, nil
	}
	if err := r.Status().Patch(ctx, &p, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, err
	}
	// The reconciler's logger already names the policy (klog.KObj).
	log.V(1).Info("Updated CapabilityPolicy status", "matchedCallees", p.Status.MatchedCallees, "matchedCallers", p.Status.MatchedCallers)

	// Events only when a condition changed status or reason (message-only
	// changes, such as one more Callee selected, stay in status).
	for _, t := range []string{hcpv1alpha1.ConditionReady, hcpv1alpha1.ConditionRulesMatched} {
		now := meta.FindStatusCondition(p.Status.Conditions, t)
		was := meta.FindStatusCondition(before.Status.Conditions, t)
		if now == nil || was != nil && was.Status == now.Status && was.Reason == now.Reason {
			continue
		}
		eventType := corev1.EventTypeNormal
		if now.Status != metav1.ConditionTrue {
			eventType = corev1.EventTypeWarning
		}
		if r.Recorder != nil {
			r.Recorder.Eventf(&p, nil, eventType, now.Reason, "Validate", "%s", now.Message)
		}
		log.Info("Changed CapabilityPolicy condition", "type", t, "status", now.Status, "reason", now.Reason, "message", now.Message)
	}
	return ctrl.Result{}, nil
}

// setPolicyStatus computes the status of p from the Callees and Callers of
// its namespace. Pure: no client, so it is unit-testable. Conditions keep
// their lastTransitionTime while their status does not change.
func setPolicyStatus(p *hcpv1alpha1.CapabilityPolicy, callees []hcpv1alpha1.Callee, callers []hcpv1alpha1.Caller) {
	errs := policy.ValidateRules(p)
	selectorErr, calleeSelectorErr := false, false
	for _, err := range errs {
		if fe, ok := err.(*field.Error); ok {
			if fe.Field == "spec.calleeSelector" {
				calleeSelectorErr = true
			}
			if strings.HasSuffix(strings.ToLower(fe.Field), "selector") {
				selectorErr = true
			}
		}
	}

	p.Status.MatchedCallees = policy.SelectCallees(p, callees)
	p.Status.MatchedCallers = policy.SelectCallers(p, callers)

	ready := metav1.Condition{Type: hcpv1alpha1.ConditionReady, ObservedGeneration: p.Generation}
	switch {
	case calleeSelectorErr:
		ready.Status, ready.Reason = metav1.ConditionFalse, hcpv1alpha1.ReasonInvalidSelector
		ready.Message = "The policy admits nothing until fixed: " + policy.Summary(errs)
	case len(errs) > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, hcpv1alpha1.ReasonInvalidRules
		if selectorErr {
			ready.Reason = hcpv1alpha1.ReasonInvalidSelector
		}
		ready.Message = "Invalid rules admit nothing, the others are enforced: " + policy.Summary(errs)
	default:
		ready.Status, ready.Reason = metav1.ConditionTrue, hcpv1alpha1.ReasonReconciled
		ready.Message = fmt.Sprintf("Valid; enforced by the sidecars of %d selected Callee(s)", len(p.Status.MatchedCallees))
	}

	matched := metav1.Condition{Type: hcpv1alpha1.ConditionRulesMatched, ObservedGeneration: p.Generation}
	var problems []string
	for _, m := range policy.RuleCoverage(p, callees, callers) {
		if s := m.Problem(); s != "" {
			problems = append(problems, s)
		}
	}
	switch {
	case calleeSelectorErr:
		matched.Status, matched.Reason = metav1.ConditionFalse, hcpv1alpha1.ReasonInvalidSelector
		matched.Message = "spec.calleeSelector is invalid, so the policy selects no Callee"
	case len(p.Status.MatchedCallees) == 0:
		matched.Status, matched.Reason = metav1.ConditionFalse, hcpv1alpha1.ReasonNoCalleesSelected
		matched.Message = fmt.Sprintf("spec.calleeSelector selects no Callee in namespace %s", p.Namespace)
	case len(problems) > 0:
		matched.Status, matched.Reason = metav1.ConditionFalse, hcpv1alpha1.ReasonRuleMatchesNothing
		matched.Message = strings.Join(problems, "; ")
	default:
		matched.Status, matched.Reason = metav1.ConditionTrue, hcpv1alpha1.ReasonAllRulesMatched
		matched.Message = "Every rule matches a capability of a selected Callee and a Caller"
	}

	for _, c := range []metav1.Condition{ready, matched} {
		c.Message = truncate(c.Message, maxConditionMessage)
		meta.SetStatusCondition(&p.Status.Conditions, c)
	}
	setReconcilingStalled(&p.Status.Conditions, p.Generation)
	p.Status.ObservedGeneration = p.Generation
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-len("…")] + "…"
}

// SetupWithManager registers the reconciler. Besides its own objects it
// watches Callees (labels decide selection, capabilities decide what rules
// match) and Callers (labels decide selector matches), so that status stays
// current when they change.
func (r *CapabilityPolicyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&hcpv1alpha1.CapabilityPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&hcpv1alpha1.Callee{}, handler.EnqueueRequestsFromMapFunc(r.policiesOfNamespace),
			builder.WithPredicates(predicate.Or(predicate.LabelChangedPredicate{}, predicate.GenerationChangedPredicate{}))).
		Watches(&hcpv1alpha1.Caller{}, handler.EnqueueRequestsFromMapFunc(r.policiesOfNamespace),
			builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Named("capabilitypolicy").
		Complete(r)
}

// policiesOfNamespace enqueues every CapabilityPolicy in obj's namespace.
// Whether a policy selects obj cannot be told from obj alone (it may just
// have stopped matching), and policies per namespace are few.
func (r *CapabilityPolicyReconciler) policiesOfNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	var list hcpv1alpha1.CapabilityPolicyList
	if err := r.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list CapabilityPolicies", "namespace", obj.GetNamespace())
		return nil
	}
	reqs := make([]reconcile.Request, len(list.Items))
	for i := range list.Items {
		reqs[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}
	}
	return reqs
}
