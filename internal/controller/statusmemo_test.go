package controller

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// laggingCache reads Callees as they were when frozen (if set): a cache
// that has not yet received the watch events of the writes since.
type laggingCache struct {
	client.Client
	frozen *hcpv1alpha1.Callee
}

func (l *laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if c, ok := obj.(*hcpv1alpha1.Callee); ok && l.frozen != nil {
		l.frozen.DeepCopyInto(c)
		return nil
	}
	return l.Client.Get(ctx, key, obj, opts...)
}

// TestReconcileFromALaggingCache: the harness loop's second reconcile
// reads its Callee from a cache that has not shown the first one's status
// write (activeSessions 1). Its new count, 0, equals the stale status, so
// it used to write nothing and the API server kept 1: nothing reconciles
// the Callee again, since its status write starts no reconcile
// (ownUpdate). It must write 0, and Ready's Event must not come twice.
func TestReconcileFromALaggingCache(t *testing.T) {
	s := runtime.NewScheme()
	if err := hcpv1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	callee := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lab", Generation: 1}}
	api := fake.NewClientBuilder().WithScheme(s).WithObjects(callee).WithStatusSubresource(&hcpv1alpha1.Callee{}).Build()
	cache := &laggingCache{Client: api}
	rec := events.NewFakeRecorder(10)
	active := int32(1)
	h := &harnessReconciler[*hcpv1alpha1.Callee]{
		core:      newCore(cache, api, s, rec, Options{}, topology.RoleCallee),
		newObject: func() *hcpv1alpha1.Callee { return &hcpv1alpha1.Callee{} },
		build: func(_ context.Context, c *hcpv1alpha1.Callee, _ view) (ctrl.Result, error) {
			c.Status.ActiveSessions = active
			return ctrl.Result{}, nil
		},
	}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(callee)}
	stale := &hcpv1alpha1.Callee{}
	if err := api.Get(t.Context(), req.NamespacedName, stale); err != nil {
		t.Fatal(err)
	}

	cache.frozen = stale // the writes' events do not arrive
	if _, err := h.Reconcile(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	active = 0
	if _, err := h.Reconcile(t.Context(), req); err != nil {
		t.Fatal(err)
	}

	got := &hcpv1alpha1.Callee{}
	if err := api.Get(t.Context(), req.NamespacedName, got); err != nil {
		t.Fatal(err)
	}
	if got.Status.ActiveSessions != 0 {
		t.Errorf("the API server's activeSessions %d after the second reconcile, want 0", got.Status.ActiveSessions)
	}
	if n := len(rec.Events); n != 1 {
		t.Errorf("%d Ready Events, want 1 (the first status's)", n)
	}
}

// TestStatusMemo: a reconcile that reads its Callee from a cache that has
// not shown the last status write gets that write's status; once the
// cache shows it (the watch's event, or the read itself), or the object
// is gone, or the write is older than memoTTL, the cache's status stands.
func TestStatusMemo(t *testing.T) {
	callee := func(rv string, active int32) *hcpv1alpha1.Callee {
		return &hcpv1alpha1.Callee{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lab", UID: "uid-1", ResourceVersion: rv},
			Status:     hcpv1alpha1.CalleeStatus{ActiveSessions: active},
		}
	}
	now := time.Unix(1_800_000_000, 0)
	m := newStatusMemo()
	m.now = func() time.Time { return now }
	pred := ownUpdate(m)
	cached := "10" // the version the cache holds when the write returns
	inCache := func() string { return cached }

	m.wrote(callee("11", 1), inCache)
	stale := callee("10", 0)
	m.fresh(stale)
	if stale.Status.ActiveSessions != 1 || stale.ResourceVersion != "10" {
		t.Errorf("a read that lags the write: activeSessions %d at resourceVersion %s, want the written 1 at the cache's 10", stale.Status.ActiveSessions, stale.ResourceVersion)
	}

	// The watch brings the write: the memo forgets it, and a status the
	// cache holds from then on stands.
	pred.Update(event.UpdateEvent{ObjectOld: callee("10", 0), ObjectNew: callee("11", 1)})
	later := callee("12", 0)
	m.fresh(later)
	if later.Status.ActiveSessions != 0 {
		t.Errorf("after the cache showed the write: activeSessions %d, want the cache's 0", later.Status.ActiveSessions)
	}

	// A read at the written version forgets it too.
	m.wrote(callee("13", 2), inCache)
	same := callee("13", 2)
	m.fresh(same)
	stale = callee("12", 0)
	m.fresh(stale)
	if stale.Status.ActiveSessions != 0 {
		t.Errorf("after a read at the written version: activeSessions %d, want the cache's 0", stale.Status.ActiveSessions)
	}

	// A deleted object is forgotten.
	m.wrote(callee("14", 3), inCache)
	pred.Delete(event.DeleteEvent{Object: callee("14", 3)})
	if len(m.m) != 0 {
		t.Errorf("the memo holds %d writes after the deletion, want none", len(m.m))
	}

	// A write the watch skipped (a relist from a newer version) is
	// trusted for memoTTL, then no longer.
	m.wrote(callee("15", 4), inCache)
	now = now.Add(memoTTL / 2)
	read := callee("17", 0)
	m.fresh(read)
	if read.Status.ActiveSessions != 4 {
		t.Errorf("within memoTTL: activeSessions %d, want the written 4", read.Status.ActiveSessions)
	}
	now = now.Add(memoTTL)
	read = callee("17", 0)
	m.fresh(read)
	if read.Status.ActiveSessions != 0 || len(m.m) != 0 {
		t.Errorf("after memoTTL: activeSessions %d, %d writes kept; want the cache's 0 and none", read.Status.ActiveSessions, len(m.m))
	}

	// The write's event reached the cache before the write returned: the
	// memo keeps nothing (it used to keep the write until the object's
	// next reconcile, a copy of every idle object).
	cached = "18"
	m.wrote(callee("18", 5), inCache)
	if len(m.m) != 0 {
		t.Errorf("a write the cache held already: %d writes kept, want none", len(m.m))
	}

	// A write the watch skipped and no reconcile read again is swept by a
	// later write once older than memoTTL.
	cached = "19"
	m.wrote(callee("20", 6), inCache)
	other := callee("30", 1)
	other.UID = "uid-2"
	now = now.Add(memoTTL + time.Second)
	m.wrote(other, inCache)
	if _, ok := m.m["uid-1"]; ok || len(m.m) != 1 {
		t.Errorf("after memoTTL and another write: %d writes kept (uid-1 among them: %v), want only the new one", len(m.m), ok)
	}
}
