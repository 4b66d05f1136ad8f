package controller

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// countingReader counts the lists sent to the API server.
type countingReader struct {
	client.Reader
	lists atomic.Int64
}

func (r *countingReader) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	r.lists.Add(1)
	return r.Reader.List(ctx, l, opts...)
}

// TestLiveUsersOfKeyRequests: the finalizer's "is anyone else using this
// vhost?" asks the API server only when it must: not while the cache shows
// another user, and once per vhost until this manager claims again, so a
// mass deletion of N users is not N lists of N objects.
func TestLiveUsersOfKeyRequests(t *testing.T) {
	ns := newNamespace(t, "users-")
	dumpOnFailure(t, ns)
	holder := newCallee(ns, "holder")
	create(t, holder)
	api := &countingReader{Reader: k8sClient}
	c := newCore(suiteManager.GetClient(), api, suiteManager.GetScheme(), nil, suiteOptions(), topology.RoleCallee)
	c.claims = &claimLog{}
	ghost := calleeView(&hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ghost", UID: "ghost-uid"}})

	var key string
	eventually(t, "the cache shows the holder's claim", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(holder), holder); err != nil {
			return err
		}
		if key = holder.Labels[hcpv1alpha1.LabelVhostKey]; key == "" {
			return errors.New("not claimed yet")
		}
		user, err := c.userOfKey(ctx, key, "", ghost.obj.GetUID())
		if err != nil {
			return err
		}
		if user == nil {
			return errors.New("not in the cache yet")
		}
		return nil
	})

	users, err := c.liveUsersOfKey(t.Context(), ghost, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(users) != 1 || users[0].GetName() != "holder" {
		t.Errorf("users %v, want the holder", users)
	}
	if n := api.lists.Load(); n != 0 {
		t.Errorf("%d API lists while the cache shows a user, want 0", n)
	}

	// A vhost nobody uses: the API server is asked once (Callees and
	// Callers: two lists), then trusted until a claim.
	const unused = "nobody-uses-this-key"
	for i := range 3 {
		users, err := c.liveUsersOfKey(t.Context(), ghost, unused)
		if err != nil {
			t.Fatal(err)
		}
		if len(users) != 0 {
			t.Fatalf("users of an unused key: %v", users)
		}
		if n := api.lists.Load(); n != 2 {
			t.Fatalf("after %d checks: %d API lists, want 2", i+1, n)
		}
	}
	done := c.claims.claiming()
	if _, err := c.liveUsersOfKey(t.Context(), ghost, unused); err != nil {
		t.Fatal(err)
	}
	if n := api.lists.Load(); n != 4 {
		t.Errorf("during a claim: %d API lists, want 4 (asked again)", n)
	}
	done()
	if _, err := c.liveUsersOfKey(t.Context(), ghost, unused); err != nil {
		t.Fatal(err)
	}
	if n := api.lists.Load(); n != 6 {
		t.Errorf("after a claim: %d API lists, want 6 (asked again)", n)
	}
	if _, err := c.liveUsersOfKey(t.Context(), ghost, unused); err != nil {
		t.Fatal(err)
	}
	if n := api.lists.Load(); n != 6 {
		t.Errorf("after a claim and a check: %d API lists, want 6 (trusted)", n)
	}

	// Without a claim log (a reconciler built outside Setup) every check
	// asks.
	c.claims = nil
	if _, err := c.liveUsersOfKey(t.Context(), ghost, unused); err != nil {
		t.Fatal(err)
	}
	if n := api.lists.Load(); n != 8 {
		t.Errorf("without a claim log: %d API lists, want 8", n)
	}
}

// TestLiveUse: the index that answers "who else uses this vhost key" and
// "does any creator of the vhost retain it" holds a user only while its
// claim stands and it is not being deleted, and files a creator of the
// vhost under the deletion policy it asks for.
func TestLiveUse(t *testing.T) {
	const key = "0123456789"
	user := func(edit func(*hcpv1alpha1.Caller)) *hcpv1alpha1.Caller {
		c := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: "agent",
			Labels:     map[string]string{hcpv1alpha1.LabelVhostKey: key},
			Finalizers: []string{TopologyFinalizer},
		}}
		if edit != nil {
			edit(c)
		}
		return c
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		obj  *hcpv1alpha1.Caller
		want []string
	}{
		{"a user of a vhost it does not create", user(nil), []string{key}},
		{"a creator that retains by default", user(func(c *hcpv1alpha1.Caller) { c.Spec.Broker.CreateVhost = true }),
			[]string{key, key + useVhostRetain}},
		{"a creator that asks for delete", user(func(c *hcpv1alpha1.Caller) {
			c.Spec.Broker.CreateVhost, c.Spec.Broker.VhostDeletionPolicy = true, "delete"
		}), []string{key, key + useVhostDelete}},
		{"not claimed yet", user(func(c *hcpv1alpha1.Caller) { c.Labels = nil }), nil},
		{"its claim's finalizer gone", user(func(c *hcpv1alpha1.Caller) { c.Finalizers = nil }), nil},
		{"being deleted", user(func(c *hcpv1alpha1.Caller) {
			c.Spec.Broker.CreateVhost = true
			c.DeletionTimestamp = &now
		}), nil},
	} {
		if got := liveUse(tc.obj); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
