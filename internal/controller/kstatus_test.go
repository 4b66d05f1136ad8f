package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// kstatusOf reads obj from the API server (uncached) and computes its
// kstatus the way Flux, kpt and `kubectl wait` libraries do.
func kstatusOf(ctx context.Context, obj client.Object) (*status.Result, error) {
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return nil, err
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	return status.Compute(&unstructured.Unstructured{Object: m})
}

// kstatusIs waits for obj's kstatus to be want with a message containing
// msg, once the operator has written status for its generation: before
// that, an object without conditions reads Current (kstatus' caveat,
// docs/gitops.md).
func kstatusIs(obj client.Object, want status.Status, msg string) func(context.Context) error {
	return func(ctx context.Context) error {
		res, err := kstatusOf(ctx, obj)
		if err != nil {
			return err
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return err
		}
		if observed, _, _ := unstructured.NestedInt64(m, "status", "observedGeneration"); observed != obj.GetGeneration() {
			return fmt.Errorf("status.observedGeneration %d, generation %d", observed, obj.GetGeneration())
		}
		if res.Status != want || !strings.Contains(res.Message, msg) {
			return fmt.Errorf("kstatus %s %q, want %s containing %q", res.Status, res.Message, want, msg)
		}
		return nil
	}
}

// TestKstatus: Callees, Callers and CapabilityPolicies written by the real
// reconcilers read as kstatus InProgress while they wait for other
// controllers, Failed while they need a fix, and Current once Ready.
func TestKstatus(t *testing.T) {
	ns := newNamespace(t, "kstatus-")
	dumpOnFailure(t, ns)

	// A Callee waiting for the topology operator: Reconciling.
	callee := newCallee(ns, "lab")
	create(t, callee)
	eventually(t, "pending Callee is InProgress", kstatusIs(callee, status.InProgressStatus, "TopologyReady"))
	if c := meta.FindStatusCondition(callee.Status.Conditions, hcpv1alpha1.ConditionReconciling); c == nil ||
		c.Reason != hcpv1alpha1.ReasonTopologyPending || c.ObservedGeneration != callee.Generation {
		t.Errorf("Reconciling = %+v", c)
	}
	if callee.Status.ObservedGeneration != callee.Generation {
		t.Errorf("observedGeneration %d, generation %d", callee.Status.ObservedGeneration, callee.Generation)
	}

	// Its topology declared and its Deployment available: Current, and
	// neither abnormal condition is left.
	base, _, _ := childNames("callee", "lab")
	for _, o := range topologyChildren(ns, base) {
		setTopologyStatus(t, o, true, "")
	}
	declareShared(t, callee.Labels[hcpv1alpha1.LabelVhostKey])
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}
	setDeploymentAvailable(t, dep, 1)
	eventually(t, "ready Callee is Current", kstatusIs(callee, status.CurrentStatus, "Ready"))
	for _, typ := range []string{hcpv1alpha1.ConditionReconciling, hcpv1alpha1.ConditionStalled} {
		if c := meta.FindStatusCondition(callee.Status.Conditions, typ); c != nil {
			t.Errorf("a Ready Callee has %+v", c)
		}
	}

	// The harness crash-loops past its progress deadline: Stalled (Failed).
	eventually(t, "Deployment past its deadline", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
			return err
		}
		dep.Status.ReadyReplicas, dep.Status.AvailableReplicas = 0, 0
		dep.Status.Conditions = []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionFalse, Reason: "MinimumReplicasUnavailable", Message: "Deployment does not have minimum availability."},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded", Message: `ReplicaSet "x" has timed out progressing.`},
		}
		return k8sClient.Status().Update(ctx, dep)
	})
	eventually(t, "crash-looping Callee is Failed", kstatusIs(callee, status.FailedStatus, "timed out progressing"))

	// A Callee naming a connection Secret that does not exist: Stalled.
	broken := newCallee(ns, "broken", func(c *hcpv1alpha1.Callee) {
		c.Spec.Broker.RabbitmqClusterReference = &hcpv1alpha1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: "nope"}}
	})
	create(t, broken)
	eventually(t, "broken Callee is Failed", kstatusIs(broken, status.FailedStatus, "not found"))
	if c := meta.FindStatusCondition(broken.Status.Conditions, hcpv1alpha1.ConditionStalled); c == nil || c.Reason != hcpv1alpha1.ReasonBrokerSecretNotFound {
		t.Errorf("Stalled = %+v", c)
	}
	if c := meta.FindStatusCondition(broken.Status.Conditions, hcpv1alpha1.ConditionReconciling); c != nil {
		t.Errorf("a stalled Callee is also %+v", c)
	}

	// An external Caller: InProgress, then Current once its topology is.
	caller := newCaller(ns, "alpha")
	create(t, caller)
	eventually(t, "pending Caller is InProgress", kstatusIs(caller, status.InProgressStatus, ""))
	cbase, _, _ := childNames("caller", "alpha")
	for _, o := range topologyChildren(ns, cbase) {
		setTopologyStatus(t, o, true, "")
	}
	eventually(t, "ready Caller is Current", kstatusIs(caller, status.CurrentStatus, ""))

	// CapabilityPolicies: valid is Current (even selecting nothing yet:
	// RulesMatched is informational); an invalid selector is Failed.
	good := &hcpv1alpha1.CapabilityPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "good"},
		Spec: hcpv1alpha1.CapabilityPolicySpec{Rules: []hcpv1alpha1.PolicyRule{{
			Name: "r", Callers: hcpv1alpha1.CallerMatch{IDs: []string{"alpha"}}, Capabilities: []string{"*"}, MaxRiskLevel: hcpv1alpha1.RiskR2,
		}}},
	}
	bad := good.DeepCopy()
	bad.Name = "bad"
	bad.Spec.CalleeSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "lab", Operator: "Equals", Values: []string{"materials"}}}}
	create(t, good, bad)
	eventually(t, "valid policy is Current", kstatusIs(good, status.CurrentStatus, ""))
	eventually(t, "invalid policy is Failed", kstatusIs(bad, status.FailedStatus, ""))
	if good.Status.ObservedGeneration != good.Generation {
		t.Errorf("policy observedGeneration %d, generation %d", good.Status.ObservedGeneration, good.Generation)
	}
}

// TestReconcilingStalledFromReady covers every Ready reason: stalled
// reasons give Stalled, the others Reconciling, True gives neither, and
// the derived condition follows Ready's reason and message.
func TestReconcilingStalledFromReady(t *testing.T) {
	stalled := []string{
		hcpv1alpha1.ReasonBrokerNotConfigured, hcpv1alpha1.ReasonBrokerSecretNotFound, hcpv1alpha1.ReasonBrokerSecretUnlabeled,
		hcpv1alpha1.ReasonBrokerSecretInvalid, hcpv1alpha1.ReasonIDConflict, hcpv1alpha1.ReasonInvalidID,
		hcpv1alpha1.ReasonTLSSecretNotFound, hcpv1alpha1.ReasonTLSSecretUnlabeled, hcpv1alpha1.ReasonTLSSecretInvalid,
		hcpv1alpha1.ReasonTopologyFailed, hcpv1alpha1.ReasonProgressDeadlineExceeded,
		hcpv1alpha1.ReasonInvalidSelector, hcpv1alpha1.ReasonInvalidRules,
	}
	reconciling := []string{
		hcpv1alpha1.ReasonTopologyPending, hcpv1alpha1.ReasonDeploymentProgressing, hcpv1alpha1.ReasonDeploymentUnavailable,
		hcpv1alpha1.ReasonDeleting, hcpv1alpha1.ReasonReconcileFailed,
	}
	c := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Generation: 3}}
	v := calleeView(c)
	check := func(reason string, want status.Status, present, absent string) {
		t.Helper()
		setCondition(v, hcpv1alpha1.ConditionReady, false, reason, "because "+reason)
		c.Status.ObservedGeneration = 3
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(c)
		if err != nil {
			t.Fatal(err)
		}
		res, err := status.Compute(&unstructured.Unstructured{Object: m})
		if err != nil {
			t.Fatal(err)
		}
		got := meta.FindStatusCondition(c.Status.Conditions, present)
		if res.Status != want || got == nil || got.Status != metav1.ConditionTrue || got.Reason != reason ||
			got.Message != "because "+reason || got.ObservedGeneration != 3 || meta.FindStatusCondition(c.Status.Conditions, absent) != nil {
			t.Errorf("%s: kstatus %s, %s = %+v, conditions %+v", reason, res.Status, present, got, c.Status.Conditions)
		}
	}
	// Alternate so that each case also removes the other condition.
	for i := range max(len(stalled), len(reconciling)) {
		if i < len(stalled) {
			check(stalled[i], status.FailedStatus, hcpv1alpha1.ConditionStalled, hcpv1alpha1.ConditionReconciling)
		}
		if i < len(reconciling) {
			check(reconciling[i], status.InProgressStatus, hcpv1alpha1.ConditionReconciling, hcpv1alpha1.ConditionStalled)
		}
	}
	setCondition(v, hcpv1alpha1.ConditionReady, true, hcpv1alpha1.ReasonReconciled, "ok")
	if len(c.Status.Conditions) != 1 {
		t.Errorf("Ready=True left %+v", c.Status.Conditions)
	}
}

// TestScaledToZeroIsCurrent: scaling a harness to zero (by hand, or
// KEDA on an empty queue) is a choice, not a fault: Ready=True with reason
// ScaledToZero, so kstatus reads Current (Flux's --wait and kpt are done)
// and the Event (none in the first rollout) is Normal: it does not page
// whoever alerts on Warning Events. HarnessReady stays False
// ScaledToZero: nothing consumes the queue. While its topology is still
// pending it says so (Reconciling), scaling it up again gives Ready=True
// Reconciled, and down again ScaledToZero with its Normal Event.
func TestScaledToZeroIsCurrent(t *testing.T) {
	ns := newNamespace(t, "zero-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "idle", func(c *hcpv1alpha1.Callee) { c.Spec.Harness.Replicas = new(int32(0)) })
	create(t, callee)
	eventually(t, "Ready=False TopologyPending", calleeCondition(callee, hcpv1alpha1.ConditionReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, "TopologyReady: "))
	if c := meta.FindStatusCondition(callee.Status.Conditions, hcpv1alpha1.ConditionReconciling); c == nil || c.Reason != hcpv1alpha1.ReasonTopologyPending {
		t.Errorf("scaled to zero, topology pending: Reconciling %+v, want TopologyPending", c)
	}
	base, _, _ := childNames("callee", "idle")
	declarePrerequisites(t, ns, base)
	for _, o := range topologyChildren(ns, base) {
		setTopologyStatus(t, o, true, "")
	}
	declareShared(t, callee.Labels[hcpv1alpha1.LabelVhostKey])
	eventually(t, "Ready=True ScaledToZero", calleeCondition(callee, hcpv1alpha1.ConditionReady, metav1.ConditionTrue, hcpv1alpha1.ReasonScaledToZero, "scaled to zero"))
	eventually(t, "kstatus Current", kstatusIs(callee, status.CurrentStatus, ""))
	for _, typ := range []string{hcpv1alpha1.ConditionReconciling, hcpv1alpha1.ConditionStalled} {
		if c := meta.FindStatusCondition(callee.Status.Conditions, typ); c != nil {
			t.Errorf("a Callee scaled to zero has %+v", c)
		}
	}
	if c := meta.FindStatusCondition(callee.Status.Conditions, hcpv1alpha1.ConditionHarnessReady); c == nil ||
		c.Status != metav1.ConditionFalse || c.Reason != hcpv1alpha1.ReasonScaledToZero {
		t.Errorf("HarnessReady %+v, want False ScaledToZero", c)
	}
	if typ, ok := eventReasons(t.Context(), ns, "Callee", "idle")[hcpv1alpha1.ReasonScaledToZero]; ok {
		t.Errorf("a %s ScaledToZero Event in the first rollout, want none: Ready says it", typ)
	}

	// Scaled up again (as KEDA does through the /scale subresource): the
	// harness becomes available and Ready's reason goes back to Reconciled.
	scale := func(replicas int32) {
		t.Helper()
		update(t, callee, func(c *hcpv1alpha1.Callee) { c.Spec.Harness.Replicas = new(replicas) })
	}
	scale(1)
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}
	eventually(t, "the Deployment scaled to 1", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
			return err
		}
		if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
			return fmt.Errorf("replicas %v", dep.Spec.Replicas)
		}
		return nil
	})
	setDeploymentAvailable(t, dep, 1)
	eventually(t, "Ready=True Reconciled", calleeCondition(callee, hcpv1alpha1.ConditionReady, metav1.ConditionTrue, hcpv1alpha1.ReasonReconciled, ""))

	// And down again: ScaledToZero, with a Normal Event.
	scale(0)
	eventually(t, "Ready=True ScaledToZero again", calleeCondition(callee, hcpv1alpha1.ConditionReady, metav1.ConditionTrue, hcpv1alpha1.ReasonScaledToZero, "scaled to zero"))
	eventually(t, "a Normal ScaledToZero Event", func(ctx context.Context) error {
		switch typ := eventReasons(ctx, ns, "Callee", "idle")[hcpv1alpha1.ReasonScaledToZero]; typ {
		case corev1.EventTypeNormal:
			return nil
		case "":
			return errors.New("no ScaledToZero Event yet")
		default:
			return fmt.Errorf("ScaledToZero Event of type %s, want Normal", typ)
		}
	})
}
