package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// createMemo remembers the children this manager created lately, until the
// cache shows them. A reconcile that starts before the cache has the
// create (another of the owner's watches fired first: a shared object, a
// Secret, a peer's claim) would otherwise create the child again: a POST
// refused with AlreadyExists, one more API write (on a loaded machine,
// up to 0.15 per Callee/Caller in TestManagerWritesPerObject). With the
// memo it reads the child from the API server instead: a GET, no write.
// The controllers' expectations in kube-controller-manager (ReplicaSet,
// Job) answer the same lag.
type createMemo struct {
	mu sync.Mutex
	at map[createKey]time.Time
}

type createKey struct {
	gvk schema.GroupVersionKind
	key client.ObjectKey
}

// createMemoTTL bounds how long a create is remembered when the cache
// never shows it (the child deleted at once): afterwards a lagging cache
// costs a refused create again, never a missed one.
const createMemoTTL = time.Minute

func newCreateMemo() *createMemo { return &createMemo{at: map[createKey]time.Time{}} }

// created records a create (a nil memo records nothing).
func (m *createMemo) created(gvk schema.GroupVersionKind, key client.ObjectKey) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if len(m.at) >= 1024 {
		for k, t := range m.at {
			if now.Sub(t) > createMemoTTL {
				delete(m.at, k)
			}
		}
	}
	m.at[createKey{gvk, key}] = now
}

// recent reports whether the child was created within createMemoTTL and
// the cache has not shown it since (seen).
func (m *createMemo) recent(gvk schema.GroupVersionKind, key client.ObjectKey) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.at[createKey{gvk, key}]
	return ok && time.Since(t) <= createMemoTTL
}

// seen forgets a create the cache shows.
func (m *createMemo) seen(gvk schema.GroupVersionKind, key client.ObjectKey) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.at, createKey{gvk, key})
}
