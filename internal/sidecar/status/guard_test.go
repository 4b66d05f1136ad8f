package status

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// A writer holding owner epoch 1 writes the status (without clobbering the
// caller sidecar's field) until another owner stores epoch 2; from then on
// it writes nothing, its Flush fails with ErrFenced and it reports the
// session as lost. A zombie's late status (a terminal state, a lower
// sequence) never overwrites its successor's.
func TestGuardedWritesStopAtAHigherEpoch(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest")
	}
	e := testbed.StartEnv(t, testbed.Options{WithoutTopologyCRDs: true, AddToScheme: []func(*runtime.Scheme) error{v1alpha1.AddToScheme}})
	ns := e.CreateNamespace(t, "status-guard-")
	obj := session("7c1e2f3a-9c3f-4d1e-8a7b-0c6d5e4f3a21")
	obj.Namespace = ns
	obj.Labels = map[string]string{v1alpha1.LabelSessionState: "PENDING"}
	if err := e.Client.Create(t.Context(), obj); err != nil {
		t.Fatal(err)
	}
	w := New(Options{Client: e.Client, Namespace: ns, Interval: 50 * time.Millisecond, Log: testr.New(t)})
	w.SetStateLabel(v1alpha1.LabelSessionState)
	w.SetOwnerEpochGuard(true)
	fenced := make(chan string, 1)
	w.SetOnFenced(func(name string) { fenced <- name })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	get := func() *v1alpha1.HCPSession {
		var hs v1alpha1.HCPSession
		if err := e.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), &hs); err != nil {
			t.Fatal(err)
		}
		return &hs
	}
	patchStatus := func(p string) {
		if err := e.Client.Status().Patch(t.Context(), obj.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(p))); err != nil {
			t.Fatal(err)
		}
	}

	// The first write sets the epoch (the object has no status yet).
	w.Update(obj.Name, func(st *v1alpha1.HCPSessionStatus) {
		st.State, st.PodName, st.OwnerEpoch, st.Message = v1alpha1.SessionRunning, "pod-a", 1, "admitted"
	})
	if err := w.Flush(t.Context(), obj.Name); err != nil {
		t.Fatal(err)
	}
	if hs := get(); hs.Status.OwnerEpoch != 1 || hs.Status.State != v1alpha1.SessionRunning || hs.Labels[v1alpha1.LabelSessionState] != "RUNNING" {
		t.Fatalf("first write: %+v %v", hs.Status, hs.Labels)
	}
	// The caller sidecar's field survives the owner's writes; a cleared
	// field is removed.
	patchStatus(`{"status":{"callerAckedSequence":3}}`)
	w.Update(obj.Name, func(st *v1alpha1.HCPSessionStatus) { st.LastSequence, st.Message = 5, "" })
	if err := w.Flush(t.Context(), obj.Name); err != nil {
		t.Fatal(err)
	}
	if hs := get(); hs.Status.LastSequence != 5 || hs.Status.CallerAckedSequence != 3 || hs.Status.Message != "" {
		t.Fatalf("second write: %+v", hs.Status)
	}

	// Another replica claims the session and goes on.
	patchStatus(`{"status":{"ownerEpoch":2,"podName":"pod-b","lastSequence":1100}}`)
	w.Update(obj.Name, func(st *v1alpha1.HCPSessionStatus) {
		st.State, st.LastSequence = v1alpha1.SessionCompleted, 6
	})
	if err := w.Flush(t.Context(), obj.Name); !errors.Is(err, ErrFenced) {
		t.Fatalf("the zombie's Flush = %v, want ErrFenced", err)
	}
	select {
	case name := <-fenced:
		if name != obj.Name {
			t.Fatalf("OnFenced(%q)", name)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnFenced was not called")
	}
	hs := get()
	if hs.Status.OwnerEpoch != 2 || hs.Status.PodName != "pod-b" || hs.Status.LastSequence != 1100 || hs.Status.State != v1alpha1.SessionRunning || hs.Labels[v1alpha1.LabelSessionState] != "RUNNING" {
		t.Fatalf("the zombie overwrote its successor: %+v %v", hs.Status, hs.Labels)
	}
	// Later updates are dropped.
	w.Update(obj.Name, func(st *v1alpha1.HCPSessionStatus) { st.LastSequence = 7 })
	if w.Pending(obj.Name) {
		t.Fatal("a fenced session still has writes pending")
	}
}
