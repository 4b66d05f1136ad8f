package caller

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// hcpSessionIn creates, in namespace ns, the HCPSession the callee sidecar
// would create when it decides the task taskID of callerID, with
// callerAckedSequence acked.
func (a *apiBed) hcpSessionIn(ns, calleeID, callerID, taskID string, acked int64) *v1alpha1.HCPSession {
	a.t.Helper()
	sid := topology.SessionID(calleeID, callerID, taskID)
	hs := &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: sid, Namespace: ns, Labels: map[string]string{
			v1alpha1.LabelCalleeID: calleeID, v1alpha1.LabelCallerID: callerID,
		}},
		Spec: v1alpha1.HCPSessionSpec{SessionID: sid, CalleeID: calleeID, CallerID: callerID, Capability: "analyze",
			TaskMessageID: taskID, RiskLevel: "R1", DataClassification: "T1"},
	}
	ctx := context.Background()
	if err := a.env.Client.Create(ctx, hs); err != nil {
		a.t.Fatal(err)
	}
	orig := hs.DeepCopy()
	hs.Status.State = v1alpha1.SessionRunning
	hs.Status.CallerAckedSequence = acked
	if err := a.env.Client.Status().Patch(ctx, hs, client.MergeFrom(orig)); err != nil {
		a.t.Fatal(err)
	}
	return hs
}

// downReader is a client.Reader whose API server can be taken down, and
// that counts the reads asked of it.
type downReader struct {
	client.Reader
	down  atomic.Bool
	reads atomic.Int64
}

var errAPIDown = errors.New("dial tcp 10.96.0.1:443: connect: connection refused")

func (r *downReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	r.reads.Add(1)
	if r.down.Load() {
		return errAPIDown
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

func (r *downReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	r.reads.Add(1)
	if r.down.Load() {
		return errAPIDown
	}
	return r.Reader.List(ctx, list, opts...)
}

// TestUnverifiedSessionIsHeldThroughAnAPIOutage: a new caller pod (no local
// record) receives a session's events while the API server cannot be
// reached, for longer than SeedTimeout (30 s). Nothing of the session is
// delivered or acked meanwhile; once the API server answers, the session
// resumes exactly from its HCPSession's callerAckedSequence.
func TestUnverifiedSessionIsHeldThroughAnAPIOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest and RabbitMQ")
	}
	a := newAPIBed(t)
	b := newBed(t, "lab")
	const n, acked = 6, 2
	s := newScript(t, "lab", "6a1f0c2e-5b7d-4e8a-9c3f-1d2e3f4a5b6c", n)
	a.hcpSessionIn(a.ns, "lab", b.callerID, s.taskID, acked)
	api := &downReader{Reader: a.env.Client}
	api.down.Store(true)
	b.start(a.withAPI(a.writer(b)), func(o *Options) { o.Client, o.Reader = nil, api })
	c := b.callee("lab")
	for _, m := range s.msgs[1:] { // events 1..n and task_completed: the earlier pod had task_accepted
		c.publish(m)
	}
	queued := len(s.msgs) - 1
	outage := DefaultSeedTimeout + 5*time.Second
	for end := time.Now().Add(outage); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if l, ok := b.app.Session(s.sessionID); ok {
			t.Fatalf("delivered while unverified, %s into the outage: %d messages", outage-time.Until(end), len(l.Messages))
		}
	}
	// The management API's counts lag a few seconds: read at the end.
	if d := b.queueDepth(topology.EventQueue(b.callerID)); d != queued {
		t.Fatalf("queue depth %d after the outage, want %d (nothing acked)", d, queued)
	}
	api.down.Store(false)
	eventually(t, 30*time.Second, "the session resumed after the outage", func() error {
		l, _ := b.app.Session(s.sessionID)
		if l.LastSequence != n || l.Terminal != "task_completed" || l.Events != n-acked {
			return fmt.Errorf("last %d terminal %q events %d", l.LastSequence, l.Terminal, l.Events)
		}
		return nil
	})
	if l, _ := b.app.Session(s.sessionID); l.Messages[0].Sequence != acked+1 {
		t.Errorf("the first message delivered is %+v, want event %d", l.Messages[0], acked+1)
	}
	if got := b.messageOf(s.sessionID, acked); got != "" {
		t.Errorf("event %d, acked before the move, was delivered again", acked)
	}
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonUnsolicitedSession)); got != 0 {
		t.Errorf("%s = %.0f, want 0", ReasonUnsolicitedSession, got)
	}
}
