package status

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

func stateLabel(t *testing.T, cc *countingClient, name string) string {
	t.Helper()
	var s v1alpha1.HCPSession
	if err := cc.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	return s.Labels[v1alpha1.LabelSessionState]
}

// TestStateLabelFollowsState: with SetStateLabel, every status write that
// changes the state is followed by one label write, and nothing else costs
// a label write: not progress, not a change undone within an interval.
func TestStateLabelFollowsState(t *testing.T) {
	w, cc, clk, m := newFixture(t, time.Second, session("s1"))
	w.SetStateLabel(v1alpha1.LabelSessionState)
	ok := func() float64 { return testutil.ToFloat64(m.LabelWrites.WithLabelValues("ok")) }

	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning })
	if err := w.Flush(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if got := stateLabel(t, cc, "s1"); got != "RUNNING" || ok() != 1 {
		t.Fatalf("label %q after %v label writes, want RUNNING after 1", got, ok())
	}
	// Progress: status writes, no label writes.
	for i := range 5 {
		w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = int64(i + 1) })
		clk.Step(time.Second)
	}
	// Paused and resumed within one interval: the state written is still
	// RUNNING, so no label write.
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionPaused })
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning; s.LastSequence = 9 })
	clk.Step(time.Second)
	if err := w.Flush(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if ok() != 1 {
		t.Fatalf("%v label writes, want 1", ok())
	}
	// Terminal: written at once, label included, before Flush returns.
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionCompleted })
	if err := w.Flush(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if got := stateLabel(t, cc, "s1"); got != "COMPLETED" || ok() != 2 {
		t.Fatalf("label %q after %v label writes, want COMPLETED after 2", got, ok())
	}
	if w.Pending("s1") {
		t.Fatal("still pending")
	}
}

// TestStateLabelAfterSeed: a state the caller wrote itself (an
// optimistic-lock write, then Seed) gets its label at once, without a
// status write, and Flush waits for it.
func TestStateLabelAfterSeed(t *testing.T) {
	w, cc, clk, m := newFixture(t, time.Hour, session("s1"))
	w.SetStateLabel(v1alpha1.LabelSessionState)
	w.Seed("s1", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRejected}, clk.Now())
	if !w.Pending("s1") {
		t.Fatal("the label is not pending after Seed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.Flush(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if got := stateLabel(t, cc, "s1"); got != "REJECTED" {
		t.Fatalf("label %q", got)
	}
	if cc.count() != 0 || testutil.ToFloat64(m.LabelWrites.WithLabelValues("ok")) != 1 {
		t.Fatalf("%d status writes, %v label writes; want 0 and 1", cc.count(), testutil.ToFloat64(m.LabelWrites.WithLabelValues("ok")))
	}

	// A seeded state with a status update pending within the interval:
	// the label does not wait for the interval.
	w.Seed("s1", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRunning}, clk.Now())
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = 1 })
	deadline := time.Now().Add(5 * time.Second)
	for stateLabel(t, cc, "s1") != "RUNNING" {
		if time.Now().After(deadline) {
			t.Fatal("the label waited for the status interval")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if cc.count() != 0 {
		t.Fatalf("%d status writes within the interval", cc.count())
	}
}

// TestStateLabelRetried: a failed label write fails Flush (so the session
// is not forgotten) and is retried after an interval.
func TestStateLabelRetried(t *testing.T) {
	w, cc, clk, m := newFixture(t, time.Second, session("s1"))
	var fail atomic.Bool
	fail.Store(true)
	w.c = failingLabels{countingClient: cc, fail: &fail}
	w.SetStateLabel(v1alpha1.LabelSessionState)
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionFailed })
	if err := w.Flush(context.Background(), "s1"); err == nil {
		t.Fatal("Flush succeeded although the label write failed")
	}
	if st := get(t, cc, "s1"); st.State != v1alpha1.SessionFailed {
		t.Fatalf("status %+v: the status write must stand", st)
	}
	fail.Store(false)
	clk.Step(time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for stateLabel(t, cc, "s1") != "FAILED" {
		if time.Now().After(deadline) {
			t.Fatal("the label write was not retried")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if e, o := testutil.ToFloat64(m.LabelWrites.WithLabelValues("error")), testutil.ToFloat64(m.LabelWrites.WithLabelValues("ok")); e != 1 || o != 1 {
		t.Fatalf("label writes: %v errors, %v ok; want 1 and 1", e, o)
	}
	if cc.count() != 1 {
		t.Fatalf("%d status writes, want 1", cc.count())
	}
}

// failingLabels fails every (metadata) Patch while fail is set; status
// patches go through.
type failingLabels struct {
	*countingClient
	fail *atomic.Bool
}

func (f failingLabels) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
	if f.fail.Load() {
		return errors.New("injected failure")
	}
	return f.countingClient.Patch(ctx, obj, p, opts...)
}
