package status

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// racingReader reads through c and, on its first reads, lets another
// writer change the object right after: the guarded first write's
// resourceVersion is stale by the time it patches, as when the caller
// sidecar writes callerAckedSequence (or the callee its state label) just
// after the HCPSession's create.
type racingReader struct {
	c     client.Client
	races atomic.Int32 // how many reads are followed by another write
	other func(ctx context.Context) error
	reads atomic.Int32
}

func (r *racingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	r.reads.Add(1)
	if err := r.c.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if r.races.Add(-1) >= 0 {
		return r.other(ctx)
	}
	return nil
}

func (r *racingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return r.c.List(ctx, list, opts...)
}

// The first guarded write of a session (the object has no owner epoch
// yet) is conditional on the resourceVersion it read. Another writer's
// change in between (the caller sidecar's callerAckedSequence, a label)
// is not a loss of the session: the write reads again and goes through in
// the same attempt, not after a failure, a logged error and a backoff.
// Twice in a row, too; and a higher epoch stored in between still fences.
// Each change in between costs one read more, no other: the read before
// the next attempt also tells a later owner's epoch.
func TestGuardedFirstWriteGoesThroughAnotherWritersChange(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest")
	}
	e := testbed.StartEnv(t, testbed.Options{WithoutTopologyCRDs: true, AddToScheme: []func(*runtime.Scheme) error{v1alpha1.AddToScheme}})
	ns := e.CreateNamespace(t, "status-race-")
	for _, tc := range []struct {
		name    string
		races   int32
		patch   string
		fenced  bool
		wantAck int64
	}{
		{name: "3a1e2f3a-9c3f-4d1e-8a7b-0c6d5e4f3a21", races: 1, patch: `{"status":{"callerAckedSequence":%d}}`, wantAck: 2},
		{name: "3a1e2f3a-9c3f-4d1e-8a7b-0c6d5e4f3a22", races: 2, patch: `{"status":{"callerAckedSequence":%d}}`, wantAck: 4},
		{name: "3a1e2f3a-9c3f-4d1e-8a7b-0c6d5e4f3a23", races: 1, patch: `{"status":{"ownerEpoch":2,"podName":"pod-b"}}`, fenced: true},
	} {
		t.Run(tc.name[len(tc.name)-2:], func(t *testing.T) {
			obj := session(tc.name)
			obj.Namespace = ns
			if err := e.Client.Create(t.Context(), obj); err != nil {
				t.Fatal(err)
			}
			rr := &racingReader{c: e.Client}
			rr.other = func(ctx context.Context) error {
				// Each change a different one: the last wantAck.
				patch := tc.patch
				if strings.Contains(patch, "%d") {
					patch = fmt.Sprintf(patch, tc.wantAck-int64(rr.races.Load()))
				}
				return e.Client.Status().Patch(ctx, obj.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch)))
			}
			rr.races.Store(tc.races)
			var failed atomic.Int32
			cc := &failCounter{Client: e.Client, failed: &failed}
			w := New(Options{Client: cc, Namespace: ns, Interval: time.Hour, Log: testr.New(t)})
			w.SetOwnerEpochGuard(true)
			w.SetReader(rr)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = w.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			w.Update(obj.Name, func(st *v1alpha1.HCPSessionStatus) {
				st.State, st.PodName, st.OwnerEpoch = v1alpha1.SessionRunning, "pod-a", 1
			})
			fctx, fcancel := context.WithTimeout(t.Context(), 150*time.Millisecond) // below the first retry's backoff
			defer fcancel()
			err := w.Flush(fctx, obj.Name)
			var hs v1alpha1.HCPSession
			if gerr := e.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), &hs); gerr != nil {
				t.Fatal(gerr)
			}
			if tc.fenced {
				if err != ErrFenced || hs.Status.OwnerEpoch != 2 || hs.Status.PodName != "pod-b" {
					t.Fatalf("a later owner's claim in between: Flush = %v, stored %+v; want ErrFenced and the claim kept", err, hs.Status)
				}
				return
			}
			if err != nil {
				t.Fatalf("another writer's change between the read and the patch: Flush = %v (%d failed patches); want the write to go through in the same attempt", err, failed.Load())
			}
			if hs.Status.OwnerEpoch != 1 || hs.Status.PodName != "pod-a" || hs.Status.CallerAckedSequence != tc.wantAck {
				t.Fatalf("stored %+v; want epoch 1, pod-a and the other writer's callerAckedSequence %d kept", hs.Status, tc.wantAck)
			}
			if got, want := rr.reads.Load(), tc.races+1; got != want {
				t.Fatalf("%d reads of the object for %d changes in between; want %d", got, tc.races, want)
			}
		})
	}
}

// failCounter counts the status patches the API server refused.
type failCounter struct {
	client.Client
	failed *atomic.Int32
}

func (c *failCounter) Status() client.SubResourceWriter {
	return &failCountingStatus{SubResourceWriter: c.Client.Status(), failed: c.failed}
}

type failCountingStatus struct {
	client.SubResourceWriter
	failed *atomic.Int32
}

func (s *failCountingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	err := s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
	if err != nil {
		s.failed.Add(1)
	}
	return err
}
