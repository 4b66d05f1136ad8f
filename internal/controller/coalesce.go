package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// StatusMessageInterval is how long a Callee's or Caller's status change
// that only rewrites condition messages waits after the object's last
// status write: while the topology operator marks an object's children
// Ready one by one, TopologyReady's message names the ones still pending,
// and writing each step costs the API server a write per child. A change
// of anything else (a condition's status or reason, observedGeneration,
// replicas, ids) is written at once, so what kstatus, kubectl wait and
// GitOps tools read is never late.
const StatusMessageInterval = 5 * time.Second

// messagesOnly reports whether after's status differs from before's only
// in condition messages.
func messagesOnly(before, after client.Object) bool {
	b, a := before.DeepCopyObject().(client.Object), after.DeepCopyObject().(client.Object)
	bv, ok1 := viewOf(b)
	av, ok2 := viewOf(a)
	if !ok1 || !ok2 {
		return false
	}
	for _, v := range []view{bv, av} {
		for i := range *v.conditions {
			(*v.conditions)[i].Message = ""
		}
	}
	return equality.Semantic.DeepEqual(bv.status, av.status)
}

// statusWrites remembers when each object's status was last written, for
// StatusMessageInterval. Safe for concurrent use.
type statusWrites struct {
	interval time.Duration
	mu       sync.Mutex
	at       map[types.UID]time.Time
	// pruneAt is the size at which wrote drops the entries that no longer
	// hold anything back.
	pruneAt int
}

func newStatusWrites(interval time.Duration) *statusWrites {
	return &statusWrites{interval: interval, at: map[types.UID]time.Time{}, pruneAt: 1024}
}

// wait is how long a message-only change of uid must wait; 0 means write
// now.
func (w *statusWrites) wait(uid types.UID, now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	last, ok := w.at[uid]
	if !ok {
		return 0
	}
	if d := w.interval - now.Sub(last); d > 0 {
		return d
	}
	delete(w.at, uid)
	return 0
}

// wrote records a status write of uid at now.
func (w *statusWrites) wrote(uid types.UID, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.at[uid] = now
	if len(w.at) < w.pruneAt {
		return
	}
	for id, t := range w.at {
		if now.Sub(t) >= w.interval {
			delete(w.at, id)
		}
	}
	w.pruneAt = max(1024, 2*len(w.at))
}
