// Package cachetrim is the transform of the sidecars' object cache. A
// sidecar caches every HCPSession of its Callee or Caller (one per live
// session), and reads from that cache only what decides and routes:
// names, labels, annotations, the spec's ids, capability, risk and
// limits, and the status's state, owner, epoch, positions, times and
// error. What the harness reports for people (the result summary,
// progress, the last checkpoint) and the caller's free-text intent are
// never read from the cache, and each can be a KiB or more: the cached
// copy goes without them. Status writes are merge patches that never clear
// those fields, so a base read from the cache writes the same. A caller
// sidecar reads still less of them (CallerSession).
package cachetrim

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// CallerSession is the transform of a caller sidecar's HCPSessions. A
// caller reads from its cache only whether a session is its own and whose
// (names, uid, creation time, the spec's ids, capability and risk), how
// it was decided (the state, the error) and where its app stands
// (callerAckedSequence, and the owner epoch its status writes are fenced
// by). The cached copy is a new object with only those: its status.state
// is the decided state (HCPSession.DecidedState: RUNNING once the admitted
// annotation is set), and it has no labels or annotations (the cache holds
// only this caller's sessions, by its label selector; a terminal record
// alone is a KiB or more, kept until the session is deleted); every
// condition, time and limit is the callee's. Other kinds get Transform.
func CallerSession(in any) (any, error) {
	s, ok := in.(*v1alpha1.HCPSession)
	if !ok {
		return Transform(in)
	}
	out := &v1alpha1.HCPSession{
		TypeMeta: s.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion,
			CreationTimestamp: s.CreationTimestamp, DeletionTimestamp: s.DeletionTimestamp,
		},
		Spec: v1alpha1.HCPSessionSpec{
			SessionID: s.Spec.SessionID, CalleeID: s.Spec.CalleeID, CallerID: s.Spec.CallerID,
			Capability: s.Spec.Capability, TaskMessageID: s.Spec.TaskMessageID, RiskLevel: s.Spec.RiskLevel,
		},
		Status: v1alpha1.HCPSessionStatus{
			State: s.DecidedState(), OwnerEpoch: s.Status.OwnerEpoch, CallerAckedSequence: s.Status.CallerAckedSequence, Error: s.Status.Error,
		},
	}
	return out, nil
}
