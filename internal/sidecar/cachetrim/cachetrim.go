// Package cachetrim is the transform of the sidecars' object cache. A
// sidecar caches every HCPSession of its Callee or Caller (one per live
// session), and reads from that cache only what decides and routes:
// names, labels, annotations, the spec's ids, capability, risk and
// limits, and the status's state, owner, epoch, positions, times and
// error. What the harness reports for people (the result summary,
// progress, the last checkpoint) and the caller's free-text intent are
// never read from the cache, and each can be a KiB or more: the cached
// copy goes without them. Status writes are merge patches that never clear
// those fields, so a base read from the cache writes the same.
package cachetrim

import (
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

var stripManagedFields = cache.TransformStripManagedFields()

// Transform strips managed fields from every object (the sidecar never
// reads them; its writes are patches), and trims an HCPSession as the
// package says. Use it as the cache's DefaultTransform.
func Transform(in any) (any, error) {
	if s, ok := in.(*v1alpha1.HCPSession); ok {
		s.Spec.Intent = ""
		s.Status.Result, s.Status.Progress, s.Status.LastCheckpoint = nil, nil, nil
	}
	return stripManagedFields(in)
}
