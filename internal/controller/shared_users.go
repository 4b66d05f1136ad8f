package controller

import (
	"context"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// liveUsersOfKey returns the other users of key that are not being
// deleted. The shared topology goes only when none is left, so "none"
// must not come from a cache that may miss a user that has just claimed
// the pair:
//
//   - another user in the cache is enough to keep the topology, with no
//     request: a claimed user goes only through its own finalizer, which
//     asks again;
//   - otherwise the API server is asked, unless it already answered
//     "none" for key and this manager has made no claim since
//     (claimLog): claims are this manager's, so no user can have appeared.
//     A mass deletion of N users thus lists them once, not N times.
func (c *core) liveUsersOfKey(ctx context.Context, v view, key string) ([]client.Object, error) {
	cached, err := c.userOfKey(ctx, key, "", v.obj.GetUID())
	if err != nil {
		return nil, err
	}
	if cached != nil {
		return []client.Object{cached}, nil
	}
	if c.claims.knownUnused(key) {
		return nil, nil
	}
	seq := c.claims.seqNow()
	home, _ := c.home(v)
	var out []client.Object
	for _, ns := range c.sharedNamespaces(home) {
		for _, l := range []client.ObjectList{&hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}} {
			opts := []client.ListOption{client.MatchingLabels{hcpv1alpha1.LabelVhostKey: key}}
			if ns != "" {
				opts = append(opts, client.InNamespace(ns))
			}
			if err := c.apiReader.List(ctx, l, opts...); err != nil {
				return nil, err
			}
			for _, o := range listItems(l) {
				if o.GetUID() != v.obj.GetUID() && o.GetDeletionTimestamp().IsZero() && claimed(o, key) {
					out = append(out, o)
				}
			}
		}
	}
	if len(out) == 0 {
		c.claims.markUnused(key, seq)
	}
	return out, nil
}

// claimLog lets finalizers trust an earlier "no live user" from the API
// server. One is shared by the Callee and Caller reconcilers of a manager
// (Setup); nil turns the memo off (every check asks the API server).
type claimLog struct {
	mu sync.Mutex
	// seq changes before and after every claim patch: a "none" read while
	// a claim was in flight is never trusted.
	seq uint64
	// unused: key → seq at which the API server listed no live user.
	unused map[string]uint64
}

// claiming brackets a claim patch: call it before, and the function it
// returns after.
func (l *claimLog) claiming() func() {
	if l == nil {
		return func() {}
	}
	bump := func() {
		l.mu.Lock()
		l.seq++
		l.mu.Unlock()
	}
	bump()
	return bump
}

func (l *claimLog) seqNow() uint64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq
}

// markUnused records that a list started at seq found no live user of key.
func (l *claimLog) markUnused(key string, seq uint64) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seq != seq {
		return // a claim happened meanwhile
	}
	if l.unused == nil {
		l.unused = map[string]uint64{}
	}
	l.unused[key] = seq
}

// knownUnused: the API server listed no live user of key and no claim
// was made since.
func (l *claimLog) knownUnused(key string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.unused[key]
	return ok && s == l.seq
}
