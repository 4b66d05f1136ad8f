package status

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
)

const ns = "ns"

// countingClient is a fake API server that records every status patch.
type countingClient struct {
	client.Client
	mu      sync.Mutex
	patches []string    // the patch bodies, in order
	at      []time.Time // the fake clock's time of each patch
	clk     *clocktesting.FakeClock
	// gate, when set, holds the next status patch (after recording it)
	// until it is closed; entered is closed when that patch arrives.
	gate, entered chan struct{}
}

// holdNext makes the next status patch wait until the returned release
// is called; entered is closed once it waits.
func (c *countingClient) holdNext() (entered <-chan struct{}, release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gate, in := make(chan struct{}), make(chan struct{})
	c.gate, c.entered = gate, in
	return in, func() { close(gate) }
}

func (c *countingClient) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.patches)
}

func (c *countingClient) last() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.patches) == 0 {
		return ""
	}
	return c.patches[len(c.patches)-1]
}

func newFixture(t *testing.T, interval time.Duration, objs ...client.Object) (*Writer, *countingClient, *clocktesting.FakeClock, *metrics.Metrics) {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	cc := &countingClient{}
	cc.Client = fake.NewClientBuilder().WithScheme(s).
		WithStatusSubresource(&v1alpha1.HCPSession{}).
		WithObjects(objs...).
		WithInterceptorFuncs(interceptor.Funcs{
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
				data, err := p.Data(obj)
				if err != nil {
					return err
				}
				cc.mu.Lock()
				cc.patches = append(cc.patches, string(data))
				if cc.clk != nil {
					cc.at = append(cc.at, cc.clk.Now())
				}
				gate, entered := cc.gate, cc.entered
				cc.gate, cc.entered = nil, nil
				cc.mu.Unlock()
				if gate != nil {
					close(entered)
					<-gate
				}
				return c.SubResource(sub).Patch(ctx, obj, p, opts...)
			},
		}).Build()
	clk := clocktesting.NewFakeClock(time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC))
	cc.clk = clk
	m := metrics.New(prometheus.NewRegistry())
	w := New(Options{Client: cc, Namespace: ns, Interval: interval, Clock: clk, Metrics: m, Log: testr.New(t)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return w, cc, clk, m
}

func session(name string) *v1alpha1.HCPSession {
	return &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1alpha1.HCPSessionSpec{SessionID: name, CalleeID: "callee", CallerID: "caller", Capability: "c", TaskMessageID: name},
	}
}

// settle waits (in real time) until the writer has made want writes, and
// then a little longer to catch any extra one.
func settle(t *testing.T, cc *countingClient, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for cc.count() < want && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if got := cc.count(); got != want {
		t.Fatalf("writes = %d, want %d; patches: %v", got, want, cc.patches)
	}
}

func get(t *testing.T, cc *countingClient, name string) v1alpha1.HCPSessionStatus {
	t.Helper()
	var s v1alpha1.HCPSession
	if err := cc.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	return s.Status
}

func TestCoalescesToOneWritePerInterval(t *testing.T) {
	w, cc, clk, m := newFixture(t, time.Second, session("s1"))
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning })
	settle(t, cc, 1) // first write goes at once

	// 100 events/s for 3 s of fake time: 300 updates.
	seq := int64(0)
	for step := range 300 {
		seq++
		w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = seq; s.EventCount = seq })
		clk.Step(10 * time.Millisecond)
		if step%100 == 99 {
			// each full interval allows exactly one more write
			settle(t, cc, 1+(step+1)/100)
		}
	}
	clk.Step(time.Second)
	settle(t, cc, 4) // nothing left: the last update was written at t=3s
	st := get(t, cc, "s1")
	if st.LastSequence != 300 || st.EventCount != 300 || st.State != v1alpha1.SessionRunning {
		t.Fatalf("stored status = %+v, want the latest (seq 300, RUNNING)", st)
	}
	if n := testutil.ToFloat64(m.StatusWrites.WithLabelValues("ok")); n != 4 {
		t.Fatalf("hcp_sidecar_status_writes_total{result=ok} = %v, want 4", n)
	}
}

func TestTerminalStateIsWrittenAtOnce(t *testing.T) {
	w, cc, _, _ := newFixture(t, time.Second, session("s1"))
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning })
	settle(t, cc, 1)
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = 5 })
	settle(t, cc, 1) // within the interval: waits
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) {
		s.State = v1alpha1.SessionCompleted
		s.LastSequence = 7
	})
	settle(t, cc, 2) // terminal: at once, with the pending change folded in
	if st := get(t, cc, "s1"); st.State != v1alpha1.SessionCompleted || st.LastSequence != 7 {
		t.Fatalf("stored status = %+v", st)
	}
}

func TestNoWriteWithoutChange(t *testing.T) {
	w, cc, clk, _ := newFixture(t, time.Second, session("s1"))
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning; s.LastSequence = 3 })
	settle(t, cc, 1)
	for range 50 {
		w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning; s.LastSequence = 3 })
		clk.Step(100 * time.Millisecond)
	}
	settle(t, cc, 1)
	// A change and its undo within one interval cancel out.
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = 4 })
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = 3 })
	clk.Step(2 * time.Second)
	settle(t, cc, 1)
	if w.Pending("s1") {
		t.Fatal("Pending reports a change after an undo")
	}
}

func TestFlushIgnoresInterval(t *testing.T) {
	w, cc, _, _ := newFixture(t, time.Hour, session("s1"))
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning })
	settle(t, cc, 1)
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = 9 })
	if err := w.Flush(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	settle(t, cc, 2)
	if err := w.Flush(context.Background(), "s1"); err != nil { // nothing pending
		t.Fatal(err)
	}
	settle(t, cc, 2)
}

// TestFirstProgressWaitsTheInterval: a session's first write that only
// moves sequences (the caller sidecar's callerAckedSequence) is coalesced
// like any later one, so a short session costs one write where it cost two
// (its first ack at once, its last at its end).
func TestFirstProgressWaitsTheInterval(t *testing.T) {
	w, cc, clk, _ := newFixture(t, time.Second, session("s1"))
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.CallerAckedSequence = 3 })
	clk.Step(500 * time.Millisecond)
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.CallerAckedSequence = 4 })
	settle(t, cc, 0)
	clk.Step(500 * time.Millisecond) // an interval after the first change
	settle(t, cc, 1)
	if st := get(t, cc, "s1"); st.CallerAckedSequence != 4 {
		t.Fatalf("callerAckedSequence = %d, want 4 in the one write", st.CallerAckedSequence)
	}
}

// TestUpdateAfterLingers: a state set with UpdateAfter waits out its linger
// unless the state changes again first; then one write carries both, at
// once.
func TestUpdateAfterLingers(t *testing.T) {
	w, cc, clk, _ := newFixture(t, time.Second, session("s1"), session("s2"))
	running := func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning; s.PodName = "pod-a" }
	w.UpdateAfter("s1", 200*time.Millisecond, running)
	w.UpdateAfter("s2", 200*time.Millisecond, running)
	settle(t, cc, 0)
	w.Update("s2", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionCompleted })
	settle(t, cc, 1)
	if st := get(t, cc, "s2"); st.State != v1alpha1.SessionCompleted || st.PodName != "pod-a" {
		t.Fatalf("s2 = %+v, want COMPLETED with RUNNING's fields, in one write", st)
	}
	clk.Step(200 * time.Millisecond)
	settle(t, cc, 2)
	if st := get(t, cc, "s1"); st.State != v1alpha1.SessionRunning {
		t.Fatalf("s1 state = %q after the linger, want RUNNING", st.State)
	}
}

func TestPatchCarriesOnlyChangedFields(t *testing.T) {
	obj := session("s1")
	w, cc, clk, _ := newFixture(t, time.Second, obj)
	// The callee sidecar's view.
	callee := New(Options{Client: cc, Namespace: ns, Clock: clocktesting.NewFakeClock(time.Now())})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = callee.Run(ctx) }()
	callee.Update("s1", func(s *v1alpha1.HCPSessionStatus) {
		s.State = v1alpha1.SessionRunning
		s.LastSequence = 40
		s.PodName = "pod-a"
	})
	settle(t, cc, 1)

	// The caller sidecar (w) knows nothing but its own field.
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.CallerAckedSequence = 12 })
	clk.Step(time.Second) // a first write that is not a state change waits an interval
	settle(t, cc, 2)
	var p map[string]map[string]any
	if err := json.Unmarshal([]byte(cc.last()), &p); err != nil {
		t.Fatal(err)
	}
	if len(p) != 1 || len(p["status"]) != 1 || p["status"]["callerAckedSequence"] != float64(12) {
		t.Fatalf("caller patch = %s, want only status.callerAckedSequence", cc.last())
	}
	st := get(t, cc, "s1")
	if st.State != v1alpha1.SessionRunning || st.LastSequence != 40 || st.PodName != "pod-a" || st.CallerAckedSequence != 12 {
		t.Fatalf("stored status = %+v: a writer clobbered the other's fields", st)
	}
}

func TestGoneObjectStopsWrites(t *testing.T) {
	w, cc, clk, m := newFixture(t, time.Second)
	w.Update("missing", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning })
	settle(t, cc, 1)
	for range 5 {
		w.Update("missing", func(s *v1alpha1.HCPSessionStatus) { s.LastSequence++ })
		clk.Step(2 * time.Second)
	}
	settle(t, cc, 1)
	if err := w.Flush(context.Background(), "missing"); err != nil && err != ErrNotFound {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(m.StatusWrites.WithLabelValues("error")); n != 1 {
		t.Fatalf("error writes = %v, want 1", n)
	}
}

func TestSeedCountsAsWrite(t *testing.T) {
	w, cc, clk, _ := newFixture(t, time.Second, session("s1"))
	w.Seed("s1", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRunning, PodName: "p"}, clk.Now())
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = 2 })
	settle(t, cc, 0) // within the interval of the seeded write
	clk.Step(time.Second)
	settle(t, cc, 1)
	if got := cc.last(); got != `{"status":{"lastSequence":2}}` {
		t.Fatalf("patch = %s", got)
	}
}

// TestForgetWaitsForTheWriteInFlight: a caller that forgets a session and
// then writes its status itself (the release at a drain) must not have
// its write overwritten by a patch the writer had already sent. The
// patch carries only the fields it changed, so a stale lastSequence
// landing after the release would make the next replica reuse sequence
// numbers.
func TestForgetWaitsForTheWriteInFlight(t *testing.T) {
	w, cc, _, _ := newFixture(t, time.Second, session("s1"))
	entered, release := cc.holdNext()
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning; s.LastSequence = 9 })
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the writer did not write")
	}
	done := make(chan error, 1)
	go func() {
		w.Forget("s1")
		hs := session("s1")
		base := hs.DeepCopy()
		hs.Status.LastSequence = 10
		done <- cc.Status().Patch(context.Background(), hs, client.MergeFrom(base))
	}()
	time.Sleep(50 * time.Millisecond) // Forget returning early lets the release land first
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Forget did not return after the write in flight ended")
	}
	settle(t, cc, 2)
	if st := get(t, cc, "s1"); st.LastSequence != 10 {
		t.Fatalf("stored lastSequence = %d, want 10: the writer's patch landed after the caller's own write", st.LastSequence)
	}
}
