package caller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestCrossNamespaceSessionWithTheOperatorsGrants: the Callee runs in
// namespace A, the Caller in B, so the session's HCPSession is in A. The
// sidecar acts as its ServiceAccount with exactly the RBAC the operator
// grants it (resource.Role in B; resource.SessionReaderRole in A: get by
// name, and its position in the status, for A listed in its Caller's
// status.sessionNamespaces). The first pod delivers the first events,
// records its position in the HCPSession in A, and is replaced (a new pod,
// an empty state directory). While the grant in A is missing (Forbidden),
// the new pod holds the session: nothing delivered, nothing acked, nothing
// refused. Once it is back, the new pod resumes from the recorded position:
// every remaining event reaches the app once, none twice, and no gap is
// announced for the events the first pod delivered.
func TestCrossNamespaceSessionWithTheOperatorsGrants(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest and RabbitMQ")
	}
	a := newAPIBed(t)
	calleeNS := a.env.CreateNamespace(t, "callee-")
	b := newBed(t, "lab")
	ctx := context.Background()

	// The Caller object, its sidecar's ServiceAccount and Role in its
	// namespace, and the namespace the operator grants.
	callerObj := &v1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: b.callerID}}
	if err := a.env.Client.Create(ctx, callerObj); err != nil {
		t.Fatal(err)
	}
	callerObj.Status.SessionNamespaces = []string{calleeNS}
	if err := a.env.Client.Status().Update(ctx, callerObj); err != nil {
		t.Fatal(err)
	}
	sub := resource.ForCaller(callerObj)
	for _, o := range []client.Object{resource.ServiceAccount(sub), resource.Role(sub), resource.RoleBinding(sub)} {
		if err := a.env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	grant := func() []client.Object {
		return []client.Object{resource.SessionReaderRole(sub, calleeNS), resource.SessionReaderRoleBinding(sub, calleeNS)}
	}
	for _, o := range grant() {
		if err := a.env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	sa := a.impersonate(a.ns, resource.ServiceAccount(sub).Name)
	w := a.writerAs(b, sa, a.ns)
	asSidecar := func(o *Options) {
		o.Client, o.Reader, o.Status, o.Config.Namespace = sa, sa, w, a.ns
		o.StatusIn = func(ns string) StatusWriter { return a.writerAs(b, sa, ns) }
		o.SeedTimeout = 2 * time.Second
	}

	r1 := b.start(asSidecar)
	const n = 8
	s := newScript(t, "lab", r1.submit(t, taskReq("lab")).MessageID, n)
	a.hcpSessionIn(calleeNS, "lab", b.callerID, s.taskID, 0)
	c := b.callee("lab")
	for _, m := range s.msgs[:4] { // task_accepted, events 1..3
		c.publish(m)
	}
	eventually(t, 20*time.Second, "events 1..3", func() error {
		if got := b.lastSeq(s.sessionID); got != 3 {
			return fmt.Errorf("last sequence %d", got)
		}
		return nil
	})
	r1.stop(t)
	if got := a.ackedIn(calleeNS, s.sessionID); got != 3 {
		t.Fatalf("callerAckedSequence in %s after the first pod stopped: %d, want 3", calleeNS, got)
	}
	for _, o := range grant() {
		if err := a.env.Client.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	gapsBefore := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped))

	b.start(asSidecar, withStateDir(t.TempDir()))
	for _, m := range s.msgs[4:] {
		c.publish(m)
	}
	unsolicited := func() float64 {
		return testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonUnsolicitedSession))
	}
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if got := b.lastSeq(s.sessionID); got != 3 {
			t.Fatalf("delivered while it could not be verified (no grant in %s yet): last sequence %d", calleeNS, got)
		}
		if got := unsolicited(); got != 0 {
			t.Fatalf("refused as unsolicited while it could not be verified: %s = %.0f", ReasonUnsolicitedSession, got)
		}
	}
	// The management API's counts lag a few seconds: read at the end.
	if d, want := b.queueDepth(topology.EventQueue(b.callerID)), len(s.msgs)-4; d != want {
		t.Fatalf("queue depth %d while held, want %d (nothing acked)", d, want)
	}

	for _, o := range grant() {
		if err := a.env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "every remaining event at the app once the grant is there", func() error {
		l, _ := b.app.Session(s.sessionID)
		if l.LastSequence != n || l.Terminal != "task_completed" {
			return fmt.Errorf("last sequence %d, terminal %q; unsolicited %.0f", l.LastSequence, l.Terminal, unsolicited())
		}
		return nil
	})
	for seq := int64(4); seq < n; seq++ {
		if b.messageOf(s.sessionID, seq) == "" {
			t.Errorf("event %d never reached the app", seq)
		}
	}
	if got := unsolicited(); got != 0 {
		t.Errorf("%s = %.0f, want 0", ReasonUnsolicitedSession, got)
	}
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped)) - gapsBefore; got != 0 {
		t.Errorf("%.0f events announced lost (gap skipped) after the replacement, want 0: the first pod delivered them", got)
	}
	if snap := b.app.Snapshot(); snap.Duplicates != 0 || snap.Deduplicated != 0 || snap.Problems != 0 {
		t.Errorf("app saw %d duplicates, %d redelivered copies, %d problems, want none", snap.Duplicates, snap.Deduplicated, snap.Problems)
	}
	eventually(t, 10*time.Second, "the last position recorded in "+calleeNS, func() error {
		if got := a.ackedIn(calleeNS, s.sessionID); got != n {
			return fmt.Errorf("callerAckedSequence %d, want %d", got, n)
		}
		return nil
	})
}

// ackedIn reads status.callerAckedSequence of the HCPSession ns/name.
func (a *apiBed) ackedIn(ns, name string) int64 {
	a.t.Helper()
	var hs v1alpha1.HCPSession
	if err := a.env.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &hs); err != nil {
		a.t.Fatal(err)
	}
	return hs.Status.CallerAckedSequence
}

// impersonate is a client acting as the ServiceAccount ns/name.
func (a *apiBed) impersonate(ns, name string) client.Client {
	a.t.Helper()
	cfg := rest.CopyConfig(a.env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	c, err := client.New(cfg, client.Options{Scheme: a.env.Scheme})
	if err != nil {
		a.t.Fatal(err)
	}
	return c
}

// writerAs runs a status writer of HCPSessions in ns that writes as c.
func (a *apiBed) writerAs(b *bed, c client.Client, ns string) *status.Writer {
	w := status.New(status.Options{Client: c, Namespace: ns, Interval: time.Second, Metrics: b.metrics, Log: b.logger().WithName("status")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	a.t.Cleanup(func() {
		cancel()
		<-done
	})
	return w
}
