package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// TestStatusPace: a status write whose only change is the message of a
// wait is held back for what is left of pendingPace since the last write;
// any other change, a first write, or a write after pendingPace is not.
func TestStatusPace(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newStatusPace()
	p.now = func() time.Time { return now }
	callee := func(ready metav1.ConditionStatus, reason, msg string, active int32) *hcpv1alpha1.Callee {
		c := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{UID: "uid-1"}}
		c.Status.ActiveSessions = active
		c.Status.Conditions = []metav1.Condition{
			{Type: hcpv1alpha1.ConditionTopologyReady, Status: metav1.ConditionFalse, Reason: reason, Message: msg},
			{Type: hcpv1alpha1.ConditionReady, Status: ready, Reason: reason, Message: "TopologyReady: " + msg},
		}
		return c
	}
	pending := func(msg string) *hcpv1alpha1.Callee {
		return callee(metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, msg, 0)
	}
	hold := func(before, after *hcpv1alpha1.Callee) time.Duration {
		return p.hold(after, calleeView(before), calleeView(after))
	}
	a, b := pending("Queue q, User u: not yet declared"), pending("Binding b: not yet declared")
	if d := hold(a, b); d != 0 {
		t.Errorf("no write yet: held %s, want 0", d)
	}
	p.wrote("uid-1")
	now = now.Add(time.Second)
	if d := hold(a, b); d != pendingPace-time.Second {
		t.Errorf("only the wait's message changed 1 s after a write: held %s, want %s", d, pendingPace-time.Second)
	}
	for name, after := range map[string]*hcpv1alpha1.Callee{
		"reason changed":      callee(metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyFailed, "Binding b: failed", 0),
		"Ready":               callee(metav1.ConditionTrue, hcpv1alpha1.ReasonReconciled, "", 0),
		"another field":       callee(metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, "Binding b: not yet declared", 1),
		"the message as well": callee(metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, "Queue q, User u: not yet declared", 1),
	} {
		if d := hold(a, after); d != 0 {
			t.Errorf("%s: held %s, want 0", name, d)
		}
	}
	now = now.Add(pendingPace)
	if d := hold(a, b); d != 0 {
		t.Errorf("after pendingPace: held %s, want 0", d)
	}
}
