package controller

import (
	"errors"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// TestStatusPace: a status write whose only change is the message of a
// wait is held back for what is left of pendingPace since the last write;
// any other change, a first write, or a write after pendingPace is not.
func TestStatusPace(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newStatusPace(DefaultFirstStatusWait)
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

// TestFirstStatusHold: a new object's first status is held while it only
// waits, for DefaultFirstStatusWait from the first reconcile that held it
// or the last whose wait said something else (a step of the rollout), and
// not again once that is over (even after a sweep); an error, a failure,
// Ready, or a status written before end or prevent the hold.
func TestFirstStatusHold(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newStatusPace(DefaultFirstStatusWait)
	p.now = func() time.Time { return now }
	callee := func(uid string, ready metav1.ConditionStatus, reason, msg string) *hcpv1alpha1.Callee {
		c := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}}
		if reason != "" {
			c.Status.Conditions = []metav1.Condition{{Type: hcpv1alpha1.ConditionReady, Status: ready, Reason: reason, Message: msg}}
		}
		return c
	}
	fresh := callee("uid-1", "", "", "")
	pending := func(msg string) *hcpv1alpha1.Callee {
		return callee("uid-1", metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, msg)
	}
	hold := func(before, after *hcpv1alpha1.Callee, err error) time.Duration {
		return p.holdFirst(after, calleeView(before), calleeView(after), err)
	}
	if d := hold(fresh, pending("Queue q: not yet declared"), nil); d != DefaultFirstStatusWait {
		t.Errorf("first wait: held %s, want %s", d, DefaultFirstStatusWait)
	}
	now = now.Add(10 * time.Second)
	if d := hold(fresh, pending("Queue q: not yet declared"), nil); d != DefaultFirstStatusWait-10*time.Second {
		t.Errorf("10 s later, the same wait: held %s, want %s", d, DefaultFirstStatusWait-10*time.Second)
	}
	// A rollout that keeps moving is held for as long as it moves: each
	// step (the Queue came up, now the User is awaited) starts the wait
	// again, here 9 steps 45 s apart, 7 minutes in all.
	for step := range 9 {
		now = now.Add(45 * time.Second)
		if d := hold(fresh, pending(fmt.Sprintf("step %d: not yet declared", step)), nil); d != DefaultFirstStatusWait {
			t.Fatalf("step %d, %s after the first: held %s, want %s", step, now.Sub(time.Unix(1000, 0)), d, DefaultFirstStatusWait)
		}
	}
	now = now.Add(10 * time.Second)
	if d := hold(fresh, pending("User u: not yet declared"), nil); d != DefaultFirstStatusWait {
		t.Errorf("another step: held %s, want %s", d, DefaultFirstStatusWait)
	}
	for name, tc := range map[string]struct {
		before, after *hcpv1alpha1.Callee
		err           error
	}{
		"an error":        {fresh, pending("x"), errors.New("boom")},
		"a failure":       {fresh, callee("uid-1", metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyFailed, "refused"), nil},
		"a problem":       {fresh, callee("uid-1", metav1.ConditionFalse, hcpv1alpha1.ReasonIDConflict, "taken"), nil},
		"Ready":           {fresh, callee("uid-1", metav1.ConditionTrue, hcpv1alpha1.ReasonScaledToZero, ""), nil},
		"written already": {pending("Queue q: not yet declared"), pending("User u: not yet declared"), nil},
	} {
		if d := hold(tc.before, tc.after, tc.err); d != 0 {
			t.Errorf("%s: held %s, want 0", name, d)
		}
	}
	now = now.Add(DefaultFirstStatusWait)
	if d := hold(fresh, pending("User u: not yet declared"), nil); d != 0 {
		t.Errorf("after DefaultFirstStatusWait of the same wait: held %s, want 0", d)
	}
	// Over: a step now does not hold it again.
	if d := hold(fresh, pending("x"), nil); d != 0 {
		t.Errorf("a step after the hold ended: held %s, want 0", d)
	}
	// Sweeps (another object's hold) do not start uid-1's again.
	for range 3 {
		now = now.Add(2 * pendingPace)
		p.holdFirst(callee("uid-2", "", "", ""), calleeView(fresh), calleeView(pending("y")), nil)
		if d := hold(fresh, pending("x"), nil); d != 0 {
			t.Fatalf("after a sweep: held %s, want 0", d)
		}
	}
	// A write ends the hold: a later first write (the status lost, say)
	// is held again.
	p.wrote("uid-1")
	if d := hold(fresh, pending("x"), nil); d != DefaultFirstStatusWait {
		t.Errorf("after a write: held %s, want %s", d, DefaultFirstStatusWait)
	}
	// FirstStatusWait 0: no hold.
	p = newStatusPace(0)
	if d := hold(fresh, pending("x"), nil); d != 0 {
		t.Errorf("FirstStatusWait 0: held %s, want 0", d)
	}
}

// TestFirstStatusHoldWhileOthersProgress: a first wait that says the same
// thing stays held while topology children of other objects keep becoming
// Ready (the topology operator works through its queue: 1,000 + 1,000 new
// objects wait over ten minutes for their turn), is written a
// FirstStatusWait after progress stops, and in any case after
// maxFirstHolds FirstStatusWaits.
func TestFirstStatusHoldWhileOthersProgress(t *testing.T) {
	start := time.Unix(1000, 0)
	now := start
	p := newStatusPace(DefaultFirstStatusWait)
	p.now = func() time.Time { return now }
	fresh := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{UID: "uid-1"}}
	pending := fresh.DeepCopy()
	pending.Status.Conditions = []metav1.Condition{{Type: hcpv1alpha1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: hcpv1alpha1.ReasonTopologyPending, Message: "Queue q, User u: not yet declared"}}
	hold := func() time.Duration { return p.holdFirst(pending, calleeView(fresh), calleeView(pending), nil) }
	if d := hold(); d != DefaultFirstStatusWait {
		t.Fatalf("first wait: held %s, want %s", d, DefaultFirstStatusWait)
	}
	// Another object's Queue comes up every 20 s for 5 minutes.
	for range 15 {
		now = now.Add(20 * time.Second)
		p.progress()
		if d := hold(); d != DefaultFirstStatusWait {
			t.Fatalf("%s in, just after progress: held %s, want %s", now.Sub(start), d, DefaultFirstStatusWait)
		}
	}
	now = now.Add(DefaultFirstStatusWait / 2)
	if d := hold(); d != DefaultFirstStatusWait/2 {
		t.Errorf("half a wait after the last progress: held %s, want %s", d, DefaultFirstStatusWait/2)
	}
	now = now.Add(DefaultFirstStatusWait / 2)
	if d := hold(); d != 0 {
		t.Errorf("a wait after the last progress: held %s, want 0 (written)", d)
	}
	p.progress()
	if d := hold(); d != 0 {
		t.Errorf("progress after the hold ended: held %s, want 0 (not held again)", d)
	}

	// Progress that never stops: the hold ends at maxFirstHolds waits.
	pending.UID, fresh.UID = "uid-2", "uid-2"
	start = now
	if d := hold(); d != DefaultFirstStatusWait {
		t.Fatalf("uid-2's first wait: held %s, want %s", d, DefaultFirstStatusWait)
	}
	for now.Sub(start) < maxFirstHolds*DefaultFirstStatusWait-DefaultFirstStatusWait {
		now = now.Add(30 * time.Second)
		p.progress()
		if d := hold(); d <= 0 {
			t.Fatalf("%s in, with progress every 30 s: written, want held", now.Sub(start))
		}
	}
	now = start.Add(maxFirstHolds*DefaultFirstStatusWait - time.Second)
	p.progress()
	if d := hold(); d != time.Second {
		t.Errorf("a second before maxFirstHolds waits: held %s, want 1s", d)
	}
	now = now.Add(time.Second)
	p.progress()
	if d := hold(); d != 0 {
		t.Errorf("maxFirstHolds waits in: held %s, want 0 (written)", d)
	}
}
