package status

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/go-logr/logr/testr"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// A terminal status write that fails (the API server is down) is retried
// with exponential backoff until it lands: not dropped, and not retried in
// a hot loop either.
func TestTerminalWriteRetriedWithBackoff(t *testing.T) {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	var attempts, failuresLeft atomic.Int32
	failuresLeft.Store(4)
	cl := fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&v1alpha1.HCPSession{}).WithObjects(session("s1")).
		WithInterceptorFuncs(interceptor.Funcs{
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
				attempts.Add(1)
				if failuresLeft.Add(-1) >= 0 {
					return apierrors.NewServiceUnavailable("test: the API server is down")
				}
				return c.SubResource(sub).Patch(ctx, obj, p, opts...)
			},
		}).Build()
	clk := clocktesting.NewFakeClock(time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC))
	w := New(Options{Client: cl, Namespace: ns, Interval: time.Second, Clock: clk, Log: testr.New(t)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	w.Update("s1", func(st *v1alpha1.HCPSessionStatus) { st.State = v1alpha1.SessionCompleted })
	waitAttempts := func(want int32) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for attempts.Load() < want && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		time.Sleep(30 * time.Millisecond)
		if got := attempts.Load(); got != want {
			t.Fatalf("%d write attempts, want %d (no hot loop while the clock stands still)", got, want)
		}
	}
	waitAttempts(1)
	// Each retry waits for the clock: 4 failures, then success.
	for i := int32(2); i <= 5; i++ {
		clk.Step(RetryBackoffMax)
		waitAttempts(i)
	}
	var hs v1alpha1.HCPSession
	if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "s1"}, &hs); err != nil {
		t.Fatal(err)
	}
	if hs.Status.State != v1alpha1.SessionCompleted {
		t.Fatalf("state %s after the API server came back", hs.Status.State)
	}
	// Landed: nothing more is written.
	clk.Step(time.Minute)
	waitAttempts(5)
}

func TestRetryBackoff(t *testing.T) {
	want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond}
	for i, w := range want {
		if got := retryBackoff(i + 1); got != w {
			t.Errorf("retryBackoff(%d) = %s, want %s", i+1, got, w)
		}
	}
	if got := retryBackoff(100); got != RetryBackoffMax {
		t.Errorf("retryBackoff(100) = %s, want the cap %s", got, RetryBackoffMax)
	}
}
