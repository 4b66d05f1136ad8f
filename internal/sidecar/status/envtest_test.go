package status

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// TestWritesAgainstAPIServer drives a session at 100 events/s for 3 s
// against a real API server and counts the status writes: the first at
// once, then at most one per interval, the terminal state at once, and the
// stored status is the latest.
func TestWritesAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest")
	}
	e := testbed.StartEnv(t, testbed.Options{WithoutTopologyCRDs: true, AddToScheme: []func(*runtime.Scheme) error{v1alpha1.AddToScheme}})
	ns := e.CreateNamespace(t, "status-")
	obj := session("2b7e1e5a-9c3f-4d1e-8a7b-0c6d5e4f3a21")
	obj.Namespace = ns
	obj.Spec.TaskMessageID = "6f9619ff-8b86-4011-b42d-00c04fc964ff"
	obj.Spec.SessionID = obj.Name
	if err := e.Client.Create(t.Context(), obj); err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	w := New(Options{Client: e.Client, Namespace: ns, Interval: time.Second, Metrics: m, Log: testr.New(t)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	writes := func() int { return int(testutil.ToFloat64(m.StatusWrites.WithLabelValues("ok"))) }
	const rate, seconds = 100, 3
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	start := time.Now()
	var seq int64
	for seq < rate*seconds {
		<-tick.C
		seq++
		s := seq
		w.Update(obj.Name, func(st *v1alpha1.HCPSessionStatus) {
			st.State = v1alpha1.SessionRunning
			st.LastSequence, st.EventCount = s, s
			pct := int32(s * 100 / (rate * seconds))
			st.Progress = &v1alpha1.SessionProgress{Stage: "run", Percent: &pct}
		})
	}
	elapsed := time.Since(start)
	time.Sleep(1200 * time.Millisecond) // the tail of the last interval
	n := writes()
	// One write at the first event, then one per started interval.
	limit := 2 + int(elapsed/time.Second)
	t.Logf("%d events in %s: %d status writes (limit %d)", seq, elapsed.Round(time.Millisecond), n, limit)
	if n > limit || n < seconds {
		t.Fatalf("%d status writes for %d events in %s, want between %d and %d", n, seq, elapsed, seconds, limit)
	}
	var got v1alpha1.HCPSession
	if err := e.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.LastSequence != seq || got.Status.EventCount != seq || *got.Status.Progress.Percent != 100 {
		t.Fatalf("stored status %+v, want the latest (sequence %d)", got.Status, seq)
	}
	if mf := got.ManagedFields; !hasManager(mf, FieldOwner) {
		t.Fatalf("no managed fields of %q: %+v", FieldOwner, mf)
	}

	// Nothing changes: nothing is written.
	before := writes()
	for range 50 {
		w.Update(obj.Name, func(st *v1alpha1.HCPSessionStatus) { st.LastSequence = seq })
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(1100 * time.Millisecond)
	if writes() != before {
		t.Fatalf("%d writes without a change", writes()-before)
	}

	// A terminal state is written at once, even inside the interval.
	w.Update(obj.Name, func(st *v1alpha1.HCPSessionStatus) { st.LastSequence = seq + 1 })
	w.Update(obj.Name, func(st *v1alpha1.HCPSessionStatus) { st.State = v1alpha1.SessionCompleted })
	at := time.Now()
	testbed.Eventually(t, 2*time.Second, "COMPLETED stored", func(ctx context.Context) error {
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(obj), &got); err != nil {
			return err
		}
		if got.Status.State != v1alpha1.SessionCompleted {
			return errState(got.Status.State)
		}
		return nil
	})
	if d := time.Since(at); d > 500*time.Millisecond {
		t.Fatalf("terminal state stored after %s", d)
	}
}

type errState v1alpha1.SessionState

func (e errState) Error() string { return "state " + string(e) }

func hasManager(mf []metav1.ManagedFieldsEntry, name string) bool {
	for _, f := range mf {
		if f.Manager == name {
			return true
		}
	}
	return false
}
