package status

import (
	"context"
	"errors"
	"strings"
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
	w, cc, clk, m := newFixture(t, time.Hour, session("s1"), session("s2"))
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
	w.Seed("s2", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRunning}, clk.Now())
	w.Update("s2", func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = 1 })
	deadline := time.Now().Add(5 * time.Second)
	for stateLabel(t, cc, "s2") != "RUNNING" {
		if time.Now().After(deadline) {
			t.Fatal("the label waited for the status interval")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if cc.count() != 0 {
		t.Fatalf("%d status writes within the interval", cc.count())
	}
}

// TestTerminalLabelIsNotWrittenOver: a terminal state the object's label
// already carries (the callee sidecar writes it with the terminal record,
// then SeedLabel) costs no label write: not for the progress written
// before the terminal status, which must not put RUNNING back, and not for
// the terminal status itself.
func TestTerminalLabelIsNotWrittenOver(t *testing.T) {
	w, cc, clk, m := newFixture(t, time.Second, session("s1"))
	w.SetStateLabel(v1alpha1.LabelSessionState)
	w.Seed("s1", v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRunning}, clk.Now())
	w.SeedLabel("s1", v1alpha1.SessionRunning)
	// The terminal record's write, label included, as the callee makes it.
	obj := &v1alpha1.HCPSession{}
	if err := cc.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "s1"}, obj); err != nil {
		t.Fatal(err)
	}
	obj.Labels = map[string]string{v1alpha1.LabelSessionState: string(v1alpha1.SessionCompleted)}
	if err := cc.Update(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
	w.SeedLabel("s1", v1alpha1.SessionCompleted)

	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.LastSequence = 7 })
	clk.Step(time.Second)
	if err := w.Flush(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionCompleted; s.LastSequence = 9 })
	if err := w.Flush(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if got := stateLabel(t, cc, "s1"); got != "COMPLETED" {
		t.Fatalf("label %q, want COMPLETED", got)
	}
	if n := testutil.ToFloat64(m.LabelWrites.WithLabelValues("ok")); n != 0 || cc.count() != 2 {
		t.Fatalf("%v label writes and %d status writes; want none and 2 (the progress, the terminal status)", n, cc.count())
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

// TestHoldWaitsForTheWriteInFlightAndKeepsOthersOff: Hold returns only
// once the write in flight has returned, no write starts while held (a
// Flush meanwhile waits), and the release lets the pending one go.
func TestHoldWaitsForTheWriteInFlightAndKeepsOthersOff(t *testing.T) {
	w, cc, _, _ := newFixture(t, time.Hour, session("s1"))
	entered, releaseWrite := cc.holdNext()
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning })
	<-entered
	var held atomic.Bool
	got := make(chan func())
	go func() {
		release := w.Hold("s1")
		held.Store(true)
		got <- release
	}()
	time.Sleep(50 * time.Millisecond)
	if held.Load() {
		t.Fatal("Hold returned while a write was in flight")
	}
	releaseWrite()
	release := <-got
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionCompleted })
	flushed := make(chan error, 1)
	go func() { flushed <- w.Flush(context.Background(), "s1") }()
	time.Sleep(100 * time.Millisecond)
	if n := cc.count(); n != 1 {
		t.Fatalf("%d writes while held, want only the one before the Hold", n)
	}
	release()
	select {
	case err := <-flushed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the Flush did not return after the release")
	}
	if n := cc.count(); n != 2 || !strings.Contains(cc.last(), "COMPLETED") {
		t.Fatalf("%d writes, the last %s; want 2, COMPLETED", n, cc.last())
	}
}
