package caller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestHCPSessionStatusAndBinding runs against envtest and the real broker:
// the acknowledged sequence reaches HCPSession status.callerAckedSequence
// through the coalescing status writer; a session this sidecar has no
// record of (its local state lost) is bound to the callee its HCPSession
// names, so another callee's events are still dropped; a session whose
// HCPSession lives elsewhere is delivered without a status write.
func TestHCPSessionStatusAndBinding(t *testing.T) {
	sb := newStatusBed(t, 200*time.Millisecond, "lab", "evil")
	b, r := sb.b, sb.r
	newSession, acked := sb.newSession, sb.acked

	// 1. A session submitted through the sidecar, its HCPSession here.
	const n = 30
	v := r.submit(t, taskReq("lab"))
	hs := newSession(v.MessageID)
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	for _, m := range s.msgs {
		c.publish(m)
	}
	eventually(t, 20*time.Second, "the stream", func() error { return b.complete(s.sessionID, n) })
	eventually(t, 10*time.Second, "status.callerAckedSequence", func() error {
		if got := acked(hs.Name); got != n {
			return fmt.Errorf("callerAckedSequence %d, want %d", got, n)
		}
		return nil
	})
	writes := testutil.ToFloat64(b.metrics.StatusWrites.WithLabelValues("ok"))
	t.Logf("callerAckedSequence reached %d with %.0f coalesced status writes for %d events", n, writes, n)
	if writes >= n {
		t.Errorf("%.0f status writes for %d events: not coalesced", writes, n)
	}

	// 2. A session the sidecar knows nothing about (as after losing its
	// state): its HCPSession names the callee, so "evil" is refused.
	unknownTask := envelope.NewMessageID()
	hs2 := newSession(unknownTask)
	s2 := newScript(t, "lab", unknownTask, 5)
	forged, err := envelope.New(envelope.TypeEvent, s2.sessionID, mustEvent(t, 1, &session.LogData{Level: session.LogInfo, Message: "forged"}))
	if err != nil {
		t.Fatal(err)
	}
	b.callee("evil").publish(forged)
	for _, m := range s2.msgs[1:] { // no task_accepted: the sidecar never sees one
		c.publish(m)
	}
	eventually(t, 20*time.Second, "the unknown session's events", func() error {
		l, ok := b.app.Session(s2.sessionID)
		if !ok || l.LastSequence != 5 || l.Terminal != "task_completed" || len(l.Problems) > 0 {
			return fmt.Errorf("%+v", l)
		}
		return nil
	})
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonSpoofedSender)); got != 1 {
		t.Errorf("spoofed_sender %.0f, want 1", got)
	}
	var sv SessionView
	r.call(t, "GET", "/hcp/v1/sessions/"+s2.sessionID, nil, &sv)
	if sv.CalleeID != "lab" || sv.Unverified {
		t.Errorf("session bound to %q (unverified %v), want lab from the HCPSession", sv.CalleeID, sv.Unverified)
	}
	eventually(t, 10*time.Second, "its callerAckedSequence", func() error {
		if got := acked(hs2.Name); got != 5 {
			return fmt.Errorf("callerAckedSequence %d", got)
		}
		return nil
	})

	// 3. A session whose HCPSession is not in this namespace (a callee in
	// another namespace): delivered, no status write attempted.
	v3 := r.submit(t, taskReq("lab"))
	s3 := newScript(t, "lab", v3.MessageID, 4)
	before := testutil.ToFloat64(b.metrics.StatusWrites.WithLabelValues("error"))
	for _, m := range s3.msgs {
		c.publish(m)
	}
	eventually(t, 20*time.Second, "the third stream", func() error { return b.complete(s3.sessionID, 4) })
	time.Sleep(500 * time.Millisecond)
	if after := testutil.ToFloat64(b.metrics.StatusWrites.WithLabelValues("error")); after != before {
		t.Errorf("status write errors %.0f → %.0f for a session without HCPSession", before, after)
	}
}

// statusBed is a caller sidecar on the real broker whose status writer
// (with its interval) writes HCPSessions in namespace ns of envtest.
type statusBed struct {
	t   *testing.T
	env *testbed.Env
	ns  string
	b   *bed
	r   *running
}

func newStatusBed(t *testing.T, interval time.Duration, callees ...string) *statusBed {
	env := testbed.StartEnv(t, testbed.Options{WithoutTopologyCRDs: true, AddToScheme: []func(*runtime.Scheme) error{v1alpha1.AddToScheme}})
	ns := env.CreateNamespace(t, "caller-")
	b := newBed(t, callees...)
	writer := status.New(status.Options{Client: env.Client, Namespace: ns, Interval: interval, Metrics: b.metrics, Log: b.logger().WithName("status")})
	wctx, wcancel := context.WithCancel(context.Background())
	wdone := make(chan error, 1)
	go func() { wdone <- writer.Run(wctx) }()
	t.Cleanup(func() {
		wcancel()
		<-wdone
	})
	r := b.start(func(o *Options) {
		o.Client = env.Client
		o.Status = writer
		o.Config.Namespace = ns
	})
	return &statusBed{t: t, env: env, ns: ns, b: b, r: r}
}

// newSession creates the HCPSession of the bed caller's task taskID on
// callee lab, as the callee sidecar does.
func (sb *statusBed) newSession(taskID string) *v1alpha1.HCPSession {
	sid := topology.SessionID("lab", "alpha", taskID)
	hs := &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: sid, Namespace: sb.ns},
		Spec: v1alpha1.HCPSessionSpec{SessionID: sid, CalleeID: "lab", CallerID: sb.b.callerID, Capability: "analyze",
			TaskMessageID: taskID, RiskLevel: "R1", DataClassification: "T1"},
	}
	if err := sb.env.Client.Create(context.Background(), hs); err != nil {
		sb.t.Fatal(err)
	}
	return hs
}

// acked is the stored callerAckedSequence of HCPSession name.
func (sb *statusBed) acked(name string) int64 {
	var hs v1alpha1.HCPSession
	if err := sb.env.Client.Get(context.Background(), types.NamespacedName{Namespace: sb.ns, Name: name}, &hs); err != nil {
		sb.t.Fatal(err)
	}
	return hs.Status.CallerAckedSequence
}
