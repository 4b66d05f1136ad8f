package controller

import (
	"strings"
	"testing"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

func TestHarnessReadyFromDeployment(t *testing.T) {
	dep := func(gen, observed int64, replicas int32, conds ...appsv1.DeploymentCondition) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "d", Generation: gen},
			Spec:       appsv1.DeploymentSpec{Replicas: &replicas},
			Status:     appsv1.DeploymentStatus{ObservedGeneration: observed, Conditions: conds, ReadyReplicas: 1},
		}
	}
	avail := func(s corev1.ConditionStatus, msg string) appsv1.DeploymentCondition {
		return appsv1.DeploymentCondition{Type: appsv1.DeploymentAvailable, Status: s, Message: msg}
	}
	stuck := appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Message: `ReplicaSet "d-1" has timed out progressing.`}
	for _, tc := range []struct {
		name         string
		d            *appsv1.Deployment
		ok           bool
		reason, want string
	}{
		{"not observed yet", dep(2, 1, 1), false, hcpv1alpha1.ReasonDeploymentProgressing, "generation 2 not yet observed"},
		{"no condition yet", dep(1, 1, 1), false, hcpv1alpha1.ReasonDeploymentProgressing, "no Available condition yet"},
		{"available", dep(1, 1, 2, avail(corev1.ConditionTrue, "")), true, hcpv1alpha1.ReasonDeploymentAvailable, "1/2 replicas ready"},
		{"unavailable", dep(1, 1, 1, avail(corev1.ConditionFalse, "Deployment does not have minimum availability."), stuck), false,
			hcpv1alpha1.ReasonDeploymentUnavailable, `minimum availability.; ReplicaSet "d-1" has timed out`},
		{"scaled to zero", dep(1, 0, 0), false, hcpv1alpha1.ReasonScaledToZero, "scaled to zero"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Generation: 4}}
			v := calleeView(c)
			setHarnessReady(v, tc.d)
			got := meta.FindStatusCondition(c.Status.Conditions, hcpv1alpha1.ConditionHarnessReady)
			if got == nil || (got.Status == metav1.ConditionTrue) != tc.ok || got.Reason != tc.reason || !strings.Contains(got.Message, tc.want) || got.ObservedGeneration != 4 {
				t.Errorf("got %+v", got)
			}
		})
	}
}

func TestTopologyObjectReady(t *testing.T) {
	q := func(gen, observed int64, conds ...topologyv1beta1.Condition) *topologyv1beta1.Queue {
		return &topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Generation: gen}, Status: topologyv1beta1.QueueStatus{ObservedGeneration: observed, Conditions: conds}}
	}
	ready := topologyv1beta1.Condition{Type: "Ready", Status: corev1.ConditionTrue}
	failed := topologyv1beta1.Condition{Type: "Ready", Status: corev1.ConditionFalse,
		Message: `Error: API responded with a 406 Not Acceptable: PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'hcp.cmd.x'`}
	for _, tc := range []struct {
		name string
		q    *topologyv1beta1.Queue
		ok   bool
		want string
	}{
		{"no status", q(1, 0), false, "not yet declared by the messaging-topology-operator"},
		{"ready", q(2, 2, ready), true, ""},
		{"ready for an older generation", q(3, 2, ready), false, "not yet declared at generation 3"},
		{"refused arguments explain themselves", q(2, 1, failed), false, "inequivalent arg 'x-max-length' for queue 'hcp.cmd.x' (RabbitMQ cannot change the arguments of an existing queue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, msg := topologyObjectReady(tc.q)
			if ok != tc.ok || !strings.Contains(msg, tc.want) {
				t.Errorf("got %t %q", ok, msg)
			}
		})
	}
}

func TestIDOrdering(t *testing.T) {
	t0 := metav1.Now()
	t1 := metav1.NewTime(t0.Add(1e9))
	mk := func(ns, name string, ts metav1.Time) *hcpv1alpha1.Callee {
		return &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: ts}}
	}
	if !olderThan(mk("b", "x", t0), mk("a", "x", t1)) {
		t.Error("creation time must come first")
	}
	if !olderThan(mk("a", "y", t0), mk("b", "x", t0)) || olderThan(mk("b", "x", t0), mk("a", "y", t0)) {
		t.Error("ties must break by namespace/name, one way only")
	}
	c := mk("a", "x", t0)
	if claimed(c, "k") {
		t.Error("claimed without label and finalizer")
	}
	c.Labels = map[string]string{hcpv1alpha1.LabelVhostKey: "k"}
	c.Finalizers = []string{TopologyFinalizer}
	if !claimed(c, "k") || claimed(c, "other") {
		t.Error("claim is label plus finalizer, for that key")
	}
}

// TestReadyNamesWhatItWaitsFor: Ready names the condition that needs a
// fix first, then one that is waiting, and ScaledToZero only when nothing
// else is false: a Callee scaled to zero whose topology is still pending is
// Reconciling (TopologyPending); once nothing else is false it is
// Ready=True ScaledToZero, with neither Reconciling nor Stalled (kstatus
// Current).
func TestReadyNamesWhatItWaitsFor(t *testing.T) {
	cond := func(typ, reason string) metav1.Condition {
		st := metav1.ConditionFalse
		if reason == hcpv1alpha1.ReasonReconciled {
			st = metav1.ConditionTrue
		}
		return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: reason + " message"}
	}
	for _, tc := range []struct {
		topology, harness string
		want, kstatus     string
	}{
		{hcpv1alpha1.ReasonTopologyPending, hcpv1alpha1.ReasonScaledToZero, hcpv1alpha1.ReasonTopologyPending, hcpv1alpha1.ConditionReconciling},
		{hcpv1alpha1.ReasonReconciled, hcpv1alpha1.ReasonScaledToZero, hcpv1alpha1.ReasonScaledToZero, ""},
		{hcpv1alpha1.ReasonTopologyFailed, hcpv1alpha1.ReasonScaledToZero, hcpv1alpha1.ReasonTopologyFailed, hcpv1alpha1.ConditionStalled},
		{hcpv1alpha1.ReasonTopologyPending, hcpv1alpha1.ReasonDeploymentUnavailable, hcpv1alpha1.ReasonDeploymentUnavailable, hcpv1alpha1.ConditionReconciling},
		{hcpv1alpha1.ReasonTopologyPending, hcpv1alpha1.ReasonDeploymentProgressing, hcpv1alpha1.ReasonTopologyPending, hcpv1alpha1.ConditionReconciling},
	} {
		t.Run(tc.topology+"+"+tc.harness, func(t *testing.T) {
			c := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
			c.Status.Conditions = []metav1.Condition{cond(hcpv1alpha1.ConditionTopologyReady, tc.topology), cond(hcpv1alpha1.ConditionHarnessReady, tc.harness)}
			setReady(calleeView(c))
			ready := meta.FindStatusCondition(c.Status.Conditions, hcpv1alpha1.ConditionReady)
			wantStatus := metav1.ConditionFalse
			if tc.kstatus == "" {
				wantStatus = metav1.ConditionTrue
			}
			if ready == nil || ready.Status != wantStatus || ready.Reason != tc.want {
				t.Fatalf("Ready %+v, want %s %s", ready, wantStatus, tc.want)
			}
			for _, typ := range []string{hcpv1alpha1.ConditionReconciling, hcpv1alpha1.ConditionStalled} {
				k := meta.FindStatusCondition(c.Status.Conditions, typ)
				if typ != tc.kstatus && k != nil {
					t.Errorf("unexpected %+v", k)
				}
				if typ == tc.kstatus && (k == nil || k.Reason != tc.want) {
					t.Errorf("%s %+v, want reason %s", typ, k, tc.want)
				}
			}
		})
	}
}
