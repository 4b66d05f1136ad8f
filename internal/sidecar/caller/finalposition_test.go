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
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestShortSessionOneWrite runs against envtest and the real broker, with
// the caller's default status interval: a session shorter than the
// interval costs one write of callerAckedSequence, made soon after its
// last message (session_closed) and holding it. Before, the write at
// task_completed held the sequence before session_closed, which a second
// write carried an interval later.
func TestShortSessionOneWrite(t *testing.T) {
	env := testbed.StartEnv(t, testbed.Options{WithoutTopologyCRDs: true, AddToScheme: []func(*runtime.Scheme) error{v1alpha1.AddToScheme}})
	ns := env.CreateNamespace(t, "caller-")
	b := newBed(t, "lab")
	writer := status.New(status.Options{Client: env.Client, Namespace: ns, Interval: DefaultStatusInterval, Metrics: b.metrics, Log: b.logger().WithName("status")})
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
	ctx := context.Background()

	const n = 4
	v := r.submit(t, taskReq("lab"))
	sid := topology.SessionID("lab", "alpha", v.MessageID)
	hs := &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: sid, Namespace: ns},
		Spec: v1alpha1.HCPSessionSpec{SessionID: sid, CalleeID: "lab", CallerID: b.callerID, Capability: "analyze",
			TaskMessageID: v.MessageID, RiskLevel: "R1", DataClassification: "T1"},
	}
	if err := env.Client.Create(ctx, hs); err != nil {
		t.Fatal(err)
	}
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	for _, m := range s.msgs {
		c.publish(m)
	}
	eventually(t, 10*time.Second, "the stream", func() error { return b.complete(s.sessionID, n) })
	start := time.Now()
	eventually(t, DefaultStatusInterval/2, "callerAckedSequence at session_closed's", func() error {
		var got v1alpha1.HCPSession
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: sid}, &got); err != nil {
			return err
		}
		if got.Status.CallerAckedSequence != n {
			return fmt.Errorf("callerAckedSequence %d, want %d", got.Status.CallerAckedSequence, n)
		}
		return nil
	})
	t.Logf("callerAckedSequence %d written %s after the app had the session's last message", n, time.Since(start).Round(time.Millisecond))
	// An interval later nothing more was written.
	time.Sleep(DefaultStatusInterval + time.Second)
	if writes := testutil.ToFloat64(b.metrics.StatusWrites.WithLabelValues("ok")); writes != 1 {
		t.Errorf("%.0f status writes for a session shorter than the interval, want 1", writes)
	}
}
