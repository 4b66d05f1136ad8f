package status

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/heapmeter"
)

// acceptingClient takes every patch and keeps nothing: what the writer
// retains is the writer's own.
type acceptingClient struct{ client.Client }

func (acceptingClient) Status() client.SubResourceWriter { return acceptingStatus{} }

func (acceptingClient) Patch(context.Context, client.Object, client.Patch, ...client.PatchOption) error {
	return nil
}

type acceptingStatus struct{ client.SubResourceWriter }

func (acceptingStatus) Patch(context.Context, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
	return nil
}

// runningStatus is a live session's status as the callee sidecar writes it.
func runningStatus(now time.Time) func(*v1alpha1.HCPSessionStatus) {
	return func(st *v1alpha1.HCPSessionStatus) {
		t := metav1.NewTime(now)
		st.State, st.PodName, st.OwnerEpoch = v1alpha1.SessionRunning, "lab-7d9f8c6b5-x2x4z", 3
		st.StartedAt, st.LastEventAt, st.TokenExpiresAt = &t, &t, &t
		st.LastSequence, st.EventCount = 1200, 1200
	}
}

// A session whose status is written keeps one copy of it in the writer, not
// two (what was written and what is wanted are the same then): at 1,000
// live sessions the second copy was about 0.4 KiB per session in each
// sidecar. The heap is shared with whatever else the test process runs, so
// each figure is the least of three tries.
func TestQuietSessionsKeepOneStatus(t *testing.T) {
	one, per := math.Inf(1), math.Inf(1)
	for range 3 {
		one = min(one, statusBytes())
		per = min(per, retainedPerSession(t))
	}
	// The entry's own fields and the map's share are a few hundred bytes;
	// a second status is `one` more (about 400 bytes).
	if limit := one + 600; per > limit {
		t.Errorf("the writer retains %.0f bytes per written session; a status is %.0f, so it keeps more than one copy (limit %.0f)", per, one, limit)
	}
	t.Logf("%.0f bytes per written session, a status %.0f", per, one)
}

const retainSessions = 10000

// statusBytes is the heap one running session's status takes.
func statusBytes() float64 {
	now := time.Now()
	return heapmeter.PerItem(retainSessions, func(int) any {
		st := &v1alpha1.HCPSessionStatus{}
		runningStatus(now)(st)
		SetConditions(st, now)
		return st
	})
}

// retainedPerSession is the heap a writer keeps per session once each
// session's running status is written.
func retainedPerSession(t *testing.T) float64 {
	now := time.Now()
	w := New(Options{Client: acceptingClient{}, Namespace: ns, Interval: time.Millisecond, WritesPerSecond: 1e6, Log: logr.Discard()})
	w.SetDeriveConditions(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	names := make([]string, retainSessions)
	for i := range names {
		names[i] = fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
	}
	h1 := heapmeter.Live()
	for _, name := range names {
		w.Update(name, runningStatus(now))
	}
	if err := w.FlushAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if w.Pending(name) {
			t.Fatalf("%s still pending after FlushAll", name)
		}
	}
	per := float64(heapmeter.Live()-h1) / retainSessions
	runtime.KeepAlive(names)
	runtime.KeepAlive(w)
	return per
}
