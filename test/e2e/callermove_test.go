//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
)

// A fault that replaces the caller pod replaces the sample app's in-memory
// record with it. On the local stack every app also writes a receipt log on
// the node (recordOnNode), which outlives its pod; on an existing cluster
// what the old app received is polled until it stops, and joined to the
// new one's (chaos_test.go, callerMoves). A message the old app received
// in its last poll interval can then be missing from the record.

// recordUntilGone reads the caller app's record every 50 ms until its app
// container no longer runs (or its pod is gone) and sends the last one. The
// caller sidecar drains before the app is stopped, so nothing reaches the
// app after the last read that answered.
func (r *samplesRun) recordUntilGone(t *testing.T) <-chan samplecaller.Snapshot {
	out := make(chan samplecaller.Snapshot, 1)
	app, pod := r.app, r.callerPod.DeepCopy()
	url := fmt.Sprintf("http://127.0.0.1:%d/received", appPort)
	go func() {
		var last samplecaller.Snapshot
		defer func() { out <- last }()
		stop := func() {}
		defer func() { stop() }()
		for deadline := time.Now().Add(chaosTimeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var snap samplecaller.Snapshot
			err := getJSON(ctx, app, url, &snap)
			cancel()
			if err == nil {
				last = snap
				continue
			}
			// Gone only when its app container is: a failed request may be
			// the port-forward ending (kubectl's ends with the first broken
			// connection), then a new one reaches the app again.
			if !r.appRunning(pod) {
				return
			}
			stop()
			if hc, s, err := r.openPodHTTP(pod, appPort); err == nil {
				app, stop = hc, s
			}
		}
	}()
	return out
}

// appRunning: the pod exists and its app container runs.
func (r *samplesRun) appRunning(pod *corev1.Pod) bool {
	p := &corev1.Pod{}
	if err := r.c.Get(context.Background(), client.ObjectKeyFromObject(pod), p); err != nil {
		return !apierrors.IsNotFound(err)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == pod.Spec.Containers[0].Name {
			return cs.State.Running != nil
		}
	}
	return false
}

// joinRecords replays what the old and then the new caller app received
// through one recorder, so duplicates and gaps across the move count. Each
// message keeps the time it was received (its n-th copy the n-th time).
func joinRecords(before, after samplecaller.Snapshot) samplecaller.Snapshot {
	rec := samplecaller.NewRecorder()
	at := map[string][]time.Time{}
	for _, snap := range []samplecaller.Snapshot{before, after} {
		for id, s := range snap.Sessions {
			all := append(append([]samplecaller.Received(nil), s.Messages...), s.Repeated...)
			sort.SliceStable(all, func(i, j int) bool { return all[i].At.Before(all[j].At) })
			for _, m := range all {
				at[m.MessageID] = append(at[m.MessageID], m.At)
				rec.Record(samplecaller.Message{
					SessionID: id, CalleeID: s.CalleeID, TaskMessageID: s.TaskMessageID, MessageID: m.MessageID, Type: m.Type,
					Sequence: m.Sequence, EventType: m.EventType, Data: m.Data, Redelivered: m.Redelivered, Lost: m.Lost, Payload: m.Payload,
				})
			}
		}
	}
	joined := rec.Snapshot()
	for _, s := range joined.Sessions {
		seen := map[string]int{}
		stamp := func(r *samplecaller.Received) {
			if ts := at[r.MessageID]; seen[r.MessageID] < len(ts) {
				r.At = ts[seen[r.MessageID]]
			}
			seen[r.MessageID]++
		}
		for i := range s.Messages {
			stamp(&s.Messages[i])
		}
		for i := range s.Repeated {
			stamp(&s.Repeated[i])
		}
	}
	return joined
}
