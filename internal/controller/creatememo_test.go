package controller

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestCreateMemo: a create is recent until the cache shows it or
// createMemoTTL passes; a nil memo remembers nothing.
func TestCreateMemo(t *testing.T) {
	gvk := schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
	key := client.ObjectKey{Namespace: "ns", Name: "hcp-callee-a"}
	m := newCreateMemo()
	if m.recent(gvk, key) {
		t.Error("recent before any create")
	}
	m.created(gvk, key)
	if !m.recent(gvk, key) || m.recent(schema.GroupVersionKind{Group: "rabbitmq.com", Version: "v1beta1", Kind: "Binding"}, key) {
		t.Error("a create is recent for its kind and name only")
	}
	m.seen(gvk, key)
	if m.recent(gvk, key) {
		t.Error("recent after the cache showed it")
	}
	m.created(gvk, key)
	m.at[createKey{gvk, key}] = time.Now().Add(-2 * createMemoTTL)
	if m.recent(gvk, key) {
		t.Error("recent after createMemoTTL")
	}
	var none *createMemo
	none.created(gvk, key)
	none.seen(gvk, key)
	if none.recent(gvk, key) {
		t.Error("a nil memo remembered a create")
	}
}
