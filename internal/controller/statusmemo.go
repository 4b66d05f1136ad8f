package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// statusMemo (nil: none) keeps, per Callee or Caller, the status its
// reconciler last wrote, until the cache shows that write.
//
// A reconcile starts from the cached object. One that starts before the
// cache has seen the status its reconciler just wrote (the next event was
// already queued) would take the older status for the API server's: if
// its new status equals the older one it writes nothing, and a merge patch
// from the older one leaves out what the write changed since. Nothing
// would mend it: the write's own event starts no reconcile (ownUpdate).
// So a reconcile reads its object's status from the memo while the cache
// lags (fresh), and the watch tells the memo when the cache caught up
// (seen, from the For watch's ownUpdate; the id-peer watch of the same
// informer passes nil). The reconcilers are the only writers of these
// statuses, so the last write is the API server's status until the next
// one.
//
// A write's event can reach the watch before its reconcile records the
// write (the response and the event travel apart): then the cache already
// holds the write, and wrote keeps nothing. Entries older than memoTTL
// (a write whose event the watch skipped) are swept by a later write.
type statusMemo struct {
	mu sync.Mutex
	m  map[types.UID]written
	// swept is when wrote last dropped the entries older than memoTTL.
	swept time.Time
	// now is time.Now; tests set it.
	now func() time.Time
}

type written struct {
	resourceVersion string
	obj             client.Object
	at              time.Time
}

// memoTTL bounds how long a write waits to be seen: a watch that restarts
// from a newer list skips its event, and a cache that lags this much is
// behind every other write too.
const memoTTL = time.Minute

func newStatusMemo() *statusMemo {
	return &statusMemo{m: map[types.UID]written{}, now: time.Now}
}

// wrote records obj as its status write returned it, unless the cache
// holds that version already (cachedVersion reads the cache's: the
// informer stores a version before its watch event reaches seen, and both
// run under the memo's lock).
func (s *statusMemo) wrote(obj client.Object, cachedVersion func() string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if now.Sub(s.swept) > memoTTL {
		for uid, w := range s.m {
			if now.Sub(w.at) > memoTTL {
				delete(s.m, uid)
			}
		}
		s.swept = now
	}
	if cachedVersion() == obj.GetResourceVersion() {
		delete(s.m, obj.GetUID())
		return
	}
	keep := obj.DeepCopyObject().(client.Object)
	keep.SetManagedFields(nil) // fresh reads the status only
	s.m[obj.GetUID()] = written{resourceVersion: obj.GetResourceVersion(), obj: keep, at: now}
}

// seen is called with each version of an object the cache receives: the
// memo forgets a write the cache now holds, and an object that is gone.
func (s *statusMemo) seen(obj client.Object, deleted bool) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.m[obj.GetUID()]; ok && (deleted || w.resourceVersion == obj.GetResourceVersion()) {
		delete(s.m, obj.GetUID())
	}
}

// fresh gives obj, read from the cache, the status last written for it
// if the cache has not shown that write yet.
func (s *statusMemo) fresh(obj client.Object) {
	if s == nil {
		return
	}
	s.mu.Lock()
	w, ok := s.m[obj.GetUID()]
	switch {
	case !ok:
	case w.resourceVersion == obj.GetResourceVersion() || s.now().Sub(w.at) > memoTTL:
		delete(s.m, obj.GetUID())
		ok = false
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	from, ok1 := viewOf(w.obj)
	to, ok2 := viewOf(obj)
	if ok1 && ok2 {
		to.setStatus(from.status)
	}
}
