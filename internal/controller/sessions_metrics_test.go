package controller

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

func TestSessionCollector(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	at := func(ago time.Duration) *metav1.Time { return &metav1.Time{Time: now.Add(-ago)} }
	hs := func(name, caller, capability string, state hcpv1alpha1.SessionState, created time.Duration, last *metav1.Time) client.Object {
		return &hcpv1alpha1.HCPSession{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "lab", CreationTimestamp: *at(created),
				Labels: map[string]string{hcpv1alpha1.LabelCallee: "cvd"}},
			Spec:   hcpv1alpha1.HCPSessionSpec{SessionID: name, CalleeID: "cvd-id", CallerID: caller, Capability: capability},
			Status: hcpv1alpha1.HCPSessionStatus{State: state, LastEventAt: last},
		}
	}
	s := runtime.NewScheme()
	if err := hcpv1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		hs("a", "alpha", "run", hcpv1alpha1.SessionRunning, time.Hour, at(30*time.Second)),
		hs("b", "alpha", "run", hcpv1alpha1.SessionRunning, time.Hour, at(20*time.Minute)), // stuck
		hs("c", "alpha", "run", hcpv1alpha1.SessionCompleted, 2*time.Hour, at(time.Hour)),  // terminal: no idle series
		hs("d", "beta", "scan", "", 90*time.Second, nil),                                   // undecided claim
	).Build()
	col := &sessionCollector{c: c, clk: clocktesting.NewFakePassiveClock(now)}
	want := `
# HELP hcp_operator_session_idle_seconds_max Non-terminal HCPSessions: the longest time since one of them last published an event (status.lastEventAt, else its start, else its creation), by callee, caller, capability and state.
# TYPE hcp_operator_session_idle_seconds_max gauge
hcp_operator_session_idle_seconds_max{callee="cvd",caller="alpha",capability="run",namespace="lab",state="RUNNING"} 1200
hcp_operator_session_idle_seconds_max{callee="cvd",caller="beta",capability="scan",namespace="lab",state="PENDING"} 90
# HELP hcp_operator_sessions HCPSessions in the manager's cache, by callee, caller, capability and L2 state (an undecided claim counts as PENDING).
# TYPE hcp_operator_sessions gauge
hcp_operator_sessions{callee="cvd",caller="alpha",capability="run",namespace="lab",state="COMPLETED"} 1
hcp_operator_sessions{callee="cvd",caller="alpha",capability="run",namespace="lab",state="RUNNING"} 2
hcp_operator_sessions{callee="cvd",caller="beta",capability="scan",namespace="lab",state="PENDING"} 1
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// TestSessionCollectorRegistered: the suite's manager registered the
// collector on controller-runtime's registry (served at /metrics): a
// second one with the same descriptors is refused as already registered.
func TestSessionCollectorRegistered(t *testing.T) {
	probe := &sessionCollector{}
	err := crmetrics.Registry.Register(probe)
	if err == nil {
		crmetrics.Registry.Unregister(probe)
		t.Fatal("the session collector is not registered on controller-runtime's registry")
	}
	if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); !ok {
		t.Fatalf("Register: %v", err)
	}
}
