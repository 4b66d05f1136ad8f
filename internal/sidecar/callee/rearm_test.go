package callee

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/lease"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
)

// fenceFixture is a sidecar reduced to what the fence needs: a Lease
// Keeper on a fake clock, an API server (fake client) holding one session,
// and a harness recording the stop requests it gets.
type fenceFixture struct {
	s     *Sidecar
	ss    *sess
	c     client.Client
	clk   *clocktesting.FakeClock
	k     *lease.Keeper
	mu    sync.Mutex
	stops []string
}

func newFenceFixture(t *testing.T) *fenceFixture {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{coordinationv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	f := &fenceFixture{clk: clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))}
	hs := &v1alpha1.HCPSession{ObjectMeta: metav1.ObjectMeta{Name: "s1", Namespace: "ns"},
		Status: v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRunning, PodName: "pod-a", OwnerEpoch: 1}}
	f.c = fake.NewClientBuilder().WithScheme(scheme).WithObjects(hs).WithStatusSubresource(hs).Build()
	f.k = lease.New(lease.Options{Client: f.c, Namespace: "ns", Pod: "pod-a", Holder: "pod-a/1", Duration: 60 * time.Second, Margin: 10 * time.Second, Clock: f.clk})
	if err := f.k.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	harness := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.stops = append(f.stops, r.URL.Path)
		f.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(harness.Close)
	hu, _ := url.Parse(harness.URL)
	life, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	log := testr.New(t)
	f.s = &Sidecar{pod: "pod-a", ns: "ns", c: f.c, reader: f.c, lease: f.k, clk: f.clk, log: log, life: life, harness: hu,
		http: http.DefaultClient, t: Timeouts{HarnessTimeout: 5 * time.Second, Retention: time.Minute},
		st: status.New(status.Options{Client: f.c, Namespace: "ns", Clock: f.clk, Log: log}), sessions: map[string]*sess{}}
	f.ss = &sess{sc: f.s, id: "s1", epoch: 1, lock: make(chan struct{}, 1)}
	f.ss.confirmedUnder()
	f.s.sessions["s1"] = f.ss
	return f
}

// takenOver records a claim of the session by another replica (epoch 2,
// pod-b), as its takeover writes it.
func (f *fenceFixture) takenOver(t *testing.T) {
	t.Helper()
	var hs v1alpha1.HCPSession
	if err := f.c.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: "s1"}, &hs); err != nil {
		t.Fatal(err)
	}
	hs.Status.OwnerEpoch, hs.Status.PodName = 2, "pod-b"
	if err := f.c.Status().Update(t.Context(), &hs); err != nil {
		t.Fatal(err)
	}
}

// After a lapse (a partition, a pause), renewing the Lease does not reopen
// the fence for a session: only re-reading its HCPSession does. A session
// another replica claimed meanwhile is then found lost, and its harness is
// told to stop with ownership_lost; the replica never publishes for it.
func TestFenceStaysClosedAfterTheLeaseComesBack(t *testing.T) {
	f := newFenceFixture(t)
	ctx := t.Context()
	if err := f.s.fence(f.ss); err != nil {
		t.Fatalf("fence of a fresh owner: %v", err)
	}
	f.clk.Step(51 * time.Second) // no renewal: lapsed
	if err := f.s.fence(f.ss); !errors.Is(err, errFenced) {
		t.Fatalf("fence after a lapse: %v", err)
	}
	f.takenOver(t) // meanwhile
	// The partition heals: the Lease is renewed before the watch tells.
	if err := f.k.Acquire(ctx); err != nil || !f.k.Valid() {
		t.Fatalf("renew: %v", err)
	}
	if err := f.s.fence(f.ss); err == nil {
		t.Fatal("the fence reopened with the renewal, before the session was re-read")
	}
	f.s.revalidate(ctx)
	if err := f.s.fence(f.ss); !errors.Is(err, errOwnershipLost) {
		t.Fatalf("fence after the re-read found epoch 2: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		n := len(f.stops)
		f.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the harness was not told to stop")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A session still owned after the lapse reopens once it is re-read.
func TestFenceReopensAfterTheReRead(t *testing.T) {
	f := newFenceFixture(t)
	f.clk.Step(51 * time.Second)
	if err := f.k.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := f.s.fence(f.ss); !errors.Is(err, errFenced) {
		t.Fatalf("fence before the re-read: %v", err)
	}
	f.s.revalidate(t.Context())
	if err := f.s.fence(f.ss); err != nil {
		t.Fatalf("fence after the re-read: %v", err)
	}
}

// A lapsed Lease stops the harness's work (ownership_lost) before anyone
// may take the session over, not only the publishing.
func TestLapsedLeaseStopsTheHarness(t *testing.T) {
	f := newFenceFixture(t)
	f.ss.delivered.Store(true)
	f.s.stopLapsed()
	if len(f.stopsNow()) != 0 {
		t.Fatal("the harness was stopped while the Lease was valid")
	}
	f.clk.Step(51 * time.Second)
	f.s.stopLapsed()
	f.s.stopLapsed() // once
	deadline := time.Now().Add(5 * time.Second)
	for len(f.stopsNow()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := f.stopsNow(); len(got) != 1 || got[0] != "/hcp/v1/sessions/s1/abort" {
		t.Fatalf("stop requests %v", got)
	}
	if f.ss.delivered.Load() || !f.ss.harnessStopped.Load() {
		t.Fatal("the session is still counted as running on the harness")
	}
}

func (f *fenceFixture) stopsNow() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.stops...)
}
