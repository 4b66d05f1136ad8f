package controller

import (
	"context"
	"fmt"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

func setCondition(v view, typ string, ok bool, reason, msg string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(v.conditions, metav1.Condition{
		Type:               typ,
		Status:             status,
		Reason:             reason,
		Message:            truncateMessage(msg),
		ObservedGeneration: v.obj.GetGeneration(),
	})
	if typ == hcpv1alpha1.ConditionReady {
		setReconcilingStalled(v.conditions, v.obj.GetGeneration())
	}
}

// stalledReasons are the Ready=False reasons that last until someone fixes
// something: kstatus' Stalled. Every other Ready=False reason (waiting for
// the topology operator or the Deployment controller, a rollout, a retried
// error, deletion) is Reconciling.
var stalledReasons = map[string]bool{
	hcpv1alpha1.ReasonBrokerNotConfigured:      true,
	hcpv1alpha1.ReasonBrokerSecretNotFound:     true,
	hcpv1alpha1.ReasonBrokerSecretUnlabeled:    true,
	hcpv1alpha1.ReasonBrokerSecretInvalid:      true,
	hcpv1alpha1.ReasonIDConflict:               true,
	hcpv1alpha1.ReasonInvalidID:                true,
	hcpv1alpha1.ReasonTLSSecretNotFound:        true,
	hcpv1alpha1.ReasonTLSSecretUnlabeled:       true,
	hcpv1alpha1.ReasonTLSSecretInvalid:         true,
	hcpv1alpha1.ReasonTopologyFailed:           true,
	hcpv1alpha1.ReasonProgressDeadlineExceeded: true,
	hcpv1alpha1.ReasonInvalidSelector:          true,
	hcpv1alpha1.ReasonInvalidRules:             true,
}

// setReconcilingStalled derives kstatus' abnormal-true conditions from
// Ready, so that kstatus (Flux, kpt, cli-utils) and Argo CD tell an object
// that is getting there from one that needs a fix: Ready=True has neither;
// Ready=False has Stalled when its reason needs a fix, else Reconciling.
// Both carry Ready's reason and message and are removed, not set False,
// when they do not apply.
func setReconcilingStalled(conds *[]metav1.Condition, generation int64) {
	ready := meta.FindStatusCondition(*conds, hcpv1alpha1.ConditionReady)
	if ready == nil || ready.Status == metav1.ConditionTrue {
		meta.RemoveStatusCondition(conds, hcpv1alpha1.ConditionReconciling)
		meta.RemoveStatusCondition(conds, hcpv1alpha1.ConditionStalled)
		return
	}
	set, unset := hcpv1alpha1.ConditionReconciling, hcpv1alpha1.ConditionStalled
	if stalledReasons[ready.Reason] {
		set, unset = unset, set
	}
	meta.RemoveStatusCondition(conds, unset)
	meta.SetStatusCondition(conds, metav1.Condition{
		Type:               set,
		Status:             metav1.ConditionTrue,
		Reason:             ready.Reason,
		Message:            ready.Message,
		ObservedGeneration: generation,
	})
}

func truncateMessage(s string) string {
	const max = 32768 // metav1.Condition's limit
	if len(s) > max {
		return s[:max-3] + "..."
	}
	return s
}

// setOutcome sets Ready, and with it kstatus' Reconciling and Stalled,
// from the outcome of a Callee's or Caller's reconcile: the one place
// they are decided. An error fails the reconcile (retried); a problem
// blocks it until the user fixes it; otherwise Ready follows TopologyReady
// and HarnessReady (setReady) and observedGeneration the generation. A
// deletion sets its own Deleting reason while it waits (finalize).
func setOutcome(v view, deleting bool, prob *problem, err error) {
	switch {
	case err != nil:
		setCondition(v, hcpv1alpha1.ConditionReady, false, hcpv1alpha1.ReasonReconcileFailed, err.Error())
		return
	case deleting:
		return
	case prob != nil:
		setBlocked(v, prob.reason, prob.message)
	default:
		setReady(v)
	}
	*v.observedGeneration = v.obj.GetGeneration()
}

// setBlocked reports a problem that stops reconciling: nothing is applied
// until it is fixed, so all three conditions say it.
func setBlocked(v view, reason, msg string) {
	setCondition(v, hcpv1alpha1.ConditionTopologyReady, false, reason, msg)
	setCondition(v, hcpv1alpha1.ConditionHarnessReady, false, reason, "not deployed: "+msg)
	setCondition(v, hcpv1alpha1.ConditionReady, false, reason, msg)
}

// setReady derives Ready from TopologyReady and HarnessReady: the first
// that is not true, preferring one that needs a fix over one that is only
// waiting (a missing TLS Secret says more than topology still pending),
// and one that is waiting over ScaledToZero (someone's choice, which says
// nothing of a topology still pending: Reconciling until it is declared).
// A harness scaled to zero with nothing else false is Ready=True, reason
// ScaledToZero: the object is what its spec asks for (a user's replicas:
// 0, KEDA's scale-to-zero on an empty queue), so kstatus reads Current and
// `flux --wait` or kpt do not wait for pods nobody wants; HarnessReady
// stays False ScaledToZero, and Argo CD's health script says Suspended.
func setReady(v view) {
	var first *metav1.Condition
	firstType := ""
	for _, t := range []string{hcpv1alpha1.ConditionTopologyReady, hcpv1alpha1.ConditionHarnessReady} {
		c := meta.FindStatusCondition(*v.conditions, t)
		if c == nil {
			setCondition(v, hcpv1alpha1.ConditionReady, false, hcpv1alpha1.ReasonReconcileFailed, t+" is not set")
			return
		}
		if c.Status == metav1.ConditionTrue {
			continue
		}
		if first == nil || readyWeight(c) > readyWeight(first) {
			first, firstType = c, t
		}
	}
	if first != nil && first.Reason == hcpv1alpha1.ReasonScaledToZero {
		setCondition(v, hcpv1alpha1.ConditionReady, true, first.Reason, firstType+": "+first.Message)
		return
	}
	if first != nil {
		setCondition(v, hcpv1alpha1.ConditionReady, false, first.Reason, firstType+": "+first.Message)
		return
	}
	setCondition(v, hcpv1alpha1.ConditionReady, true, hcpv1alpha1.ReasonReconciled, "topology declared and harness available")
}

// readyWeight orders the false conditions Ready may name (setReady): one
// that needs a fix, then one that is waiting, then ScaledToZero.
func readyWeight(c *metav1.Condition) int {
	switch {
	case c.Reason == hcpv1alpha1.ReasonScaledToZero:
		return 0
	case waiting(c):
		return 1
	default:
		return 2
	}
}

// waiting: the condition is false only until something catches up.
func waiting(c *metav1.Condition) bool {
	return c.Reason == hcpv1alpha1.ReasonTopologyPending || c.Reason == hcpv1alpha1.ReasonDeploymentProgressing
}

// topologyStatus returns a topology operator object's conditions and
// observed generation: every kind of the topology operator has them under
// status, so any kind is read the same way.
func topologyStatus(o client.Object) ([]topologyv1beta1.Condition, int64) {
	// The kinds the operator declares are read as they are: converting a
	// whole object to read its status was some 4 % of the manager's CPU
	// while 400 Callees and Callers converged (BenchmarkTopologyStatus).
	switch t := o.(type) {
	case *topologyv1beta1.Queue:
		return t.Status.Conditions, t.Status.ObservedGeneration
	case *topologyv1beta1.Binding:
		return t.Status.Conditions, t.Status.ObservedGeneration
	case *topologyv1beta1.User:
		return t.Status.Conditions, t.Status.ObservedGeneration
	case *topologyv1beta1.Permission:
		return t.Status.Conditions, t.Status.ObservedGeneration
	case *topologyv1beta1.Policy:
		return t.Status.Conditions, t.Status.ObservedGeneration
	case *topologyv1beta1.Exchange:
		return t.Status.Conditions, t.Status.ObservedGeneration
	case *topologyv1beta1.Vhost:
		return t.Status.Conditions, t.Status.ObservedGeneration
	}
	return convertedTopologyStatus(o)
}

// convertedTopologyStatus is topologyStatus for any other object (one
// read as unstructured): its status converted by field name.
func convertedTopologyStatus(o client.Object) ([]topologyv1beta1.Condition, int64) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		return nil, 0
	}
	st, _ := m["status"].(map[string]any)
	var out struct {
		Conditions         []topologyv1beta1.Condition `json:"conditions"`
		ObservedGeneration int64                       `json:"observedGeneration"`
	}
	if st == nil || runtime.DefaultUnstructuredConverter.FromUnstructured(st, &out) != nil {
		return nil, 0
	}
	return out.Conditions, out.ObservedGeneration
}

// topologyObjectReady reads a topology operator object's own Ready
// condition: ready when True for the current generation.
func topologyObjectReady(o client.Object) (bool, string) {
	conds, observed := topologyStatus(o)
	for _, c := range conds {
		if c.Type != "Ready" {
			continue
		}
		if c.Status != corev1.ConditionTrue {
			msg := c.Message
			if msg == "" {
				msg = c.Reason
			}
			return false, msg + queueArgumentsHint(o, msg)
		}
		if observed < o.GetGeneration() {
			return false, fmt.Sprintf("not yet declared at generation %d (declared: %d)", o.GetGeneration(), observed)
		}
		return true, ""
	}
	return false, "not yet declared by the messaging-topology-operator"
}

// queueArgumentsHint explains the broker's refusal to change a queue's
// arguments.
func queueArgumentsHint(o client.Object, msg string) string {
	if _, ok := o.(*topologyv1beta1.Queue); ok && strings.Contains(msg, "inequivalent arg") {
		return " (RabbitMQ cannot change the arguments of an existing queue; the operator never changes them: limits are a policy, hcp-limits.<queue>, changed live)"
	}
	return ""
}

// setTopologyReady summarises the children's own Ready conditions, naming
// the first one that is not ready and its message.
func (c *core) setTopologyReady(v view, objs []client.Object) {
	var notReady []string
	failed := false
	for _, o := range objs {
		ready, msg := topologyObjectReady(o)
		if ready {
			continue
		}
		if !strings.HasPrefix(msg, "not yet") {
			failed = true
		}
		notReady = append(notReady, fmt.Sprintf("%s %s: %s", c.kindOf(o), o.GetName(), msg))
	}
	switch {
	case len(notReady) == 0:
		setCondition(v, hcpv1alpha1.ConditionTopologyReady, true, hcpv1alpha1.ReasonReconciled,
			fmt.Sprintf("%d topology objects ready", len(objs)))
	case failed:
		setCondition(v, hcpv1alpha1.ConditionTopologyReady, false, hcpv1alpha1.ReasonTopologyFailed, strings.Join(notReady, "; "))
	default:
		setCondition(v, hcpv1alpha1.ConditionTopologyReady, false, hcpv1alpha1.ReasonTopologyPending, strings.Join(notReady, "; "))
	}
}

// setHarnessReady reads the Deployment's availability.
func setHarnessReady(v view, d *appsv1.Deployment) {
	name := "Deployment " + d.Name
	switch {
	case d.Spec.Replicas != nil && *d.Spec.Replicas == 0:
		setCondition(v, hcpv1alpha1.ConditionHarnessReady, false, hcpv1alpha1.ReasonScaledToZero,
			name+" is scaled to zero (spec.harness.replicas: 0): nothing consumes the queue until it scales up")
		return
	case d.Status.ObservedGeneration < d.Generation:
		setCondition(v, hcpv1alpha1.ConditionHarnessReady, false, hcpv1alpha1.ReasonDeploymentProgressing,
			fmt.Sprintf("%s: generation %d not yet observed by the Deployment controller", name, d.Generation))
		return
	}
	avail := findDeploymentCondition(d, appsv1.DeploymentAvailable)
	ready := fmt.Sprintf("%d/%d replicas ready", d.Status.ReadyReplicas, deref(d.Spec.Replicas, 1))
	switch {
	case avail == nil:
		setCondition(v, hcpv1alpha1.ConditionHarnessReady, false, hcpv1alpha1.ReasonDeploymentProgressing, name+": no Available condition yet; "+ready)
	case avail.Status == corev1.ConditionTrue:
		setCondition(v, hcpv1alpha1.ConditionHarnessReady, true, hcpv1alpha1.ReasonDeploymentAvailable, name+" available; "+ready)
	default:
		msg := name + " unavailable; " + ready
		if avail.Message != "" {
			msg += ": " + avail.Message
		}
		reason := hcpv1alpha1.ReasonDeploymentUnavailable
		if p := findDeploymentCondition(d, appsv1.DeploymentProgressing); p != nil && p.Status == corev1.ConditionFalse {
			if p.Message != "" {
				msg += "; " + p.Message
			}
			// Past progressDeadlineSeconds the Deployment controller
			// gives up waiting: a fix is needed (kstatus: Stalled).
			if p.Reason == "ProgressDeadlineExceeded" {
				reason = hcpv1alpha1.ReasonProgressDeadlineExceeded
			}
		}
		setCondition(v, hcpv1alpha1.ConditionHarnessReady, false, reason, msg)
	}
}

func findDeploymentCondition(d *appsv1.Deployment, t appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == t {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// writeStatus patches obj's status from before (obj with the status it had
// before reconciling) and records an Event when Ready changed. Callers
// call it once, and only when the status differs.
func (c *core) writeStatus(ctx context.Context, before, obj client.Object, beforeConds, afterConds []metav1.Condition) error {
	if err := c.Status().Patch(ctx, obj, client.MergeFrom(before)); err != nil {
		return client.IgnoreNotFound(err)
	}
	c.memo.wrote(obj, func() string {
		cached := emptyLike(obj)
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), cached, client.UnsafeDisableDeepCopy); err != nil {
			return ""
		}
		return cached.GetResourceVersion()
	})
	old := meta.FindStatusCondition(beforeConds, hcpv1alpha1.ConditionReady)
	cur := meta.FindStatusCondition(afterConds, hcpv1alpha1.ConditionReady)
	if cur == nil || (old != nil && old.Status == cur.Status && old.Reason == cur.Reason) {
		return nil
	}
	ctrl.LoggerFrom(ctx).Info("Ready changed", "status", cur.Status, "reason", cur.Reason, "message", cur.Message)
	typ := corev1.EventTypeNormal
	if cur.Status != metav1.ConditionTrue && !waiting(cur) {
		// ScaledToZero is Ready=True (someone's choice: a user, an
		// autoscaler on an empty queue), so Normal: alerting on Warning
		// Events does not page for it.
		typ = corev1.EventTypeWarning
	}
	if typ == corev1.EventTypeNormal && firstRollout(obj.GetGeneration(), beforeConds) {
		// No Normal Event in a new object's first rollout (a wait, then
		// Ready): its conditions say as much, and at scale each would be
		// one more API write per object. A Warning (a fix needed, a
		// failure) has one, and so has every change of Ready after it.
		return nil
	}
	c.recorder.Eventf(obj, nil, typ, cur.Reason, "Reconcile", "Ready=%s: %s", cur.Status, cur.Message)
	return nil
}

// podSelector renders the harness Deployment's pod selector for the /scale
// subresource's status.selector ("" if it has none).
func podSelector(d *appsv1.Deployment) string {
	if d.Spec.Selector == nil {
		return ""
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return ""
	}
	return sel.String()
}
