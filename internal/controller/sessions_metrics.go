package controller

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// The manager's own metrics about HCPSessions, computed at each scrape from
// its cache. Labels name the session's Callee (the object), caller id,
// capability and L2 state, never the session: their number is bounded by
// the deployment, not by the traffic.
var (
	sessionsDesc = prometheus.NewDesc("hcp_operator_sessions",
		"HCPSessions in the manager's cache, by callee, caller, capability and L2 state (an undecided claim counts as PENDING).",
		sessionLabels, nil)
	sessionIdleDesc = prometheus.NewDesc("hcp_operator_session_idle_seconds_max",
		"Non-terminal HCPSessions: the longest time since one of them last published an event (status.lastEventAt, else its start, else its creation), by callee, caller, capability and state.",
		sessionLabels, nil)
	sessionLabels = []string{"namespace", "callee", "caller", "capability", "state"}
)

// sessionCollector is a prometheus.Collector over the manager's cache.
type sessionCollector struct {
	mu  sync.Mutex
	c   client.Reader
	clk clock.PassiveClock
}

// registerSessionMetrics registers the session collector on
// controller-runtime's registry (served at the manager's /metrics). A
// second manager in the same process (tests) takes it over.
func registerSessionMetrics(c client.Reader, clk clock.PassiveClock) error {
	col := NewSessionCollector(c, clk)
	err := crmetrics.Registry.Register(col)
	if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
		if old, ok := are.ExistingCollector.(*sessionCollector); ok {
			nc := col.(*sessionCollector)
			old.mu.Lock()
			old.c, old.clk = nc.c, nc.clk
			old.mu.Unlock()
			return nil
		}
	}
	return err
}

// NewSessionCollector returns the collector of hcp_operator_sessions and
// hcp_operator_session_idle_seconds_max over c (the manager's cached
// client); clk nil means the real clock. The manager registers one
// (SetupWithManager); tools and tests use it to list the metric names.
func NewSessionCollector(c client.Reader, clk clock.PassiveClock) prometheus.Collector {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &sessionCollector{c: c, clk: clk}
}

func (s *sessionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sessionsDesc
	ch <- sessionIdleDesc
}

type sessionKey struct{ namespace, callee, caller, capability, state string }

func (s *sessionCollector) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	c, clk := s.c, s.clk
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var list hcpv1alpha1.HCPSessionList
	if err := c.List(ctx, &list); err != nil {
		ch <- prometheus.NewInvalidMetric(sessionsDesc, err)
		return
	}
	count := map[sessionKey]float64{}
	idle := map[sessionKey]float64{}
	now := clk.Now()
	for i := range list.Items {
		hs := &list.Items[i]
		k := sessionKeyOf(hs)
		count[k]++
		if hcpv1alpha1.SessionState(k.state).IsTerminal() {
			continue
		}
		d := max(now.Sub(lastActivity(hs)).Seconds(), 0)
		if cur, ok := idle[k]; !ok || d > cur {
			idle[k] = d
		}
	}
	for k, n := range count {
		ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, n, k.namespace, k.callee, k.caller, k.capability, k.state)
	}
	for k, d := range idle {
		ch <- prometheus.MustNewConstMetric(sessionIdleDesc, prometheus.GaugeValue, d, k.namespace, k.callee, k.caller, k.capability, k.state)
	}
}

func sessionKeyOf(hs *hcpv1alpha1.HCPSession) sessionKey {
	callee := hs.Labels[hcpv1alpha1.LabelCallee]
	if callee == "" {
		callee = hs.Spec.CalleeID
	}
	state := string(hs.DecidedState())
	if state == "" {
		state = string(hcpv1alpha1.SessionPending) // an undecided claim
	}
	return sessionKey{namespace: hs.Namespace, callee: callee, caller: hs.Spec.CallerID, capability: hs.Spec.Capability, state: state}
}

// lastActivity is when the session last showed progress: its last event,
// else its start, else its creation.
func lastActivity(hs *hcpv1alpha1.HCPSession) time.Time {
	for _, t := range []*metav1.Time{hs.Status.LastEventAt, hs.Status.StartedAt} {
		if t != nil {
			return t.Time
		}
	}
	return hs.CreationTimestamp.Time
}
