package callee

import (
	"context"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// AnnotationDecidingPod names, on an HCPSession created as a claim, the pod
// deciding its task, until status.podName says who owns it: a duplicate on
// another replica waits for that pod while it lives, and the recovery sweep
// removes the claim of a pod that is gone. Set at creation, so that the
// create is the only write before the decision.
const AnnotationDecidingPod = "hcp.io/deciding-pod"

// decidingPod is the pod that owns hs, or decides its task.
func decidingPod(hs *v1alpha1.HCPSession) string {
	if hs.Status.PodName != "" {
		return hs.Status.PodName
	}
	return hs.Annotations[AnnotationDecidingPod]
}

// newHCPSession builds the HCPSession recording a decision.
func (s *Sidecar) newHCPSession(cl *v1alpha1.Callee, c *command, v policy.Verdict) *v1alpha1.HCPSession {
	sid, callerID, msgID, ts := c.sid, c.callerID, c.msgID, c.ts
	hs := &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{
			Name:      sid,
			Namespace: s.ns,
			Labels: map[string]string{
				v1alpha1.LabelCalleeID:  s.id,
				v1alpha1.LabelCallerID:  callerID,
				v1alpha1.LabelCallee:    s.cfg.ObjectName,
				v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue,
				// The status writer keeps it in step from here on.
				v1alpha1.LabelSessionState: string(v1alpha1.SessionPending),
			},
		},
		Spec: v1alpha1.HCPSessionSpec{
			SessionID:          sid,
			CalleeID:           s.id,
			CallerID:           callerID,
			Capability:         truncateRunes(ts.Capability, 128),
			TaskMessageID:      msgID,
			RiskLevel:          v1alpha1.RiskLevel(v.Risk),
			DataClassification: v1alpha1.DataClass(ts.Constraints.DataClassification),
			Intent:             truncateRunes(ts.Intent, 1024),
		},
	}
	hs.Annotations = map[string]string{AnnotationDecidingPod: s.pod, AnnotationSignedCheckpoints: annotationTrue}
	if v.Admitted {
		hs.Spec.MaxDuration = v1alpha1.ISO8601Duration(task.FormatDuration(v.MaxDuration))
		hs.Annotations[AnnotationSequenceCeiling] = strconv.Itoa(DefaultSequenceBlock)
		if !c.iat.IsZero() {
			hs.Spec.IssuedAt = &metav1.Time{Time: c.iat}
		}
		if !v.Counted {
			// No concurrency limit applies, so no recount can overturn
			// the verdict: the create itself records the decision, and
			// the reply does not wait for a second write.
			hs.Annotations[v1alpha1.AnnotationAdmitted] = annotationTrue
			hs.Labels[v1alpha1.LabelSessionState] = string(v1alpha1.SessionRunning)
		}
	}
	if cl != nil {
		hs.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: v1alpha1.GroupVersion.String(),
			Kind:       "Callee",
			Name:       cl.Name,
			UID:        cl.UID,
			Controller: ptr.To(true),
		}}
	}
	return hs
}

// casStatus patches the status of hs with an optimistic lock: it fails with
// Conflict when anyone changed the object since hs was read. hs is updated
// from the response.
func (s *Sidecar) casStatus(ctx context.Context, hs *v1alpha1.HCPSession, mutate func(*v1alpha1.HCPSessionStatus)) error {
	base := hs.DeepCopy()
	mutate(&hs.Status)
	status.SetConditions(&hs.Status, s.clk.Now())
	err := s.c.Status().Patch(ctx, hs, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}), client.FieldOwner(status.FieldOwner))
	if s.m != nil {
		switch {
		case err == nil:
			s.m.StatusWrites.WithLabelValues("ok").Inc()
		case apierrors.IsConflict(err):
			s.m.StatusWrites.WithLabelValues("conflict").Inc()
		default:
			s.m.StatusWrites.WithLabelValues("error").Inc()
		}
	}
	if err != nil {
		*hs = *base
	}
	return err
}
