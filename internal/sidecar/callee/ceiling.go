package callee

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// reserver persists the sequence ceiling in an annotation, skipping what was
// reserved already (preReserved: the block written at creation). The write
// is conditional on this replica's owner epoch (guardedMetaPatch), so a
// replica that lost the session can never move the ceiling, and it only
// ever raises it: the next owner continues after the stored ceiling, and
// no two owners use the same numbers.
func (ss *sess) reserver(preReserved int64) session.ReserveFunc {
	return func(ceiling int64) error {
		if ceiling <= preReserved {
			return nil
		}
		ctx, cancel := context.WithTimeout(ss.sc.life, 10*time.Second)
		defer cancel()
		err := ss.guardedMetaPatch(ctx, []map[string]any{annotationOp(AnnotationSequenceCeiling, strconv.FormatInt(ceiling, 10))}, func(hs *v1alpha1.HCPSession) bool {
			return storedCeiling(hs) >= ceiling // never lowered
		})
		if err != nil {
			return fmt.Errorf("reserving sequence numbers up to %d: %w", ceiling, err)
		}
		return nil
	}
}

// guardedMetaPatch applies ops (annotationOp, labelOp) to the session's
// HCPSession, conditional on this replica's owner epoch: a JSON patch whose
// first operation tests status.ownerEpoch. When the test fails the object
// is read: a later owner's epoch means the session is lost
// (errOwnershipLost, and loseSession runs); a session admitted at creation
// whose status does not carry the epoch yet is written conditional on its
// resourceVersion instead, read again and retried (guardRetries times) when
// another write (the status writer's first, which stores the epoch) came
// in between; done (if not nil) tells a write that is not needed any more.
// A deleted object counts as written. When the status writer has not
// stored the epoch yet (a task that ended before the session's first
// status write), the object is read first: a test of the epoch would only
// fail.
func (ss *sess) guardedMetaPatch(ctx context.Context, ops []map[string]any, done func(*v1alpha1.HCPSession) bool) error {
	err := errEpochNotStored
	if e, known := ss.sc.st.StoredEpoch(ss.id); !known || e == ss.epoch {
		err = ss.patchMeta(ctx, patchOp("test", "/status/ownerEpoch", ss.epoch), ops)
	}
	for range guardRetries {
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		hs, rerr := ss.sc.readSession(ctx, ss.id)
		switch {
		case apierrors.IsNotFound(rerr):
			return nil
		case rerr != nil:
			return err
		case ss.sc.lostTo(ss, hs):
			go ss.sc.loseSession(ss, "a write found a later owner's epoch stored", "storedEpoch", hs.Status.OwnerEpoch)
			return errOwnershipLost
		case done != nil && done(hs):
			return nil
		case hs.Status.OwnerEpoch == ss.epoch:
			err = ss.patchMeta(ctx, patchOp("test", "/status/ownerEpoch", ss.epoch), ops)
		case hs.Status.OwnerEpoch == 0 && ss.epoch == 1:
			err = ss.patchMeta(ctx, patchOp("test", "/metadata/resourceVersion", hs.ResourceVersion), ops)
		default:
			return err
		}
	}
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// errEpochNotStored stands for the failed test of an owner epoch that the
// status writer has not stored yet (guardedMetaPatch reads instead).
var errEpochNotStored = errors.New("the owner epoch is not stored yet")

// guardRetries bounds guardedMetaPatch's reads and retries after a failed
// test: each lost only to a concurrent write of this same owner.
const guardRetries = 5

// patchMeta applies ops after the test operation, in one JSON patch.
func (ss *sess) patchMeta(ctx context.Context, test map[string]any, ops []map[string]any) error {
	patch, err := json.Marshal(append([]map[string]any{test}, ops...))
	if err != nil {
		return err
	}
	hs := &v1alpha1.HCPSession{ObjectMeta: metav1.ObjectMeta{Name: ss.id, Namespace: ss.sc.ns}}
	return ss.sc.c.Patch(ctx, hs, client.RawPatch(types.JSONPatchType, patch), client.FieldOwner(status.FieldOwner))
}

// storedCeiling is the ceiling annotation of hs (0 if none).
func storedCeiling(hs *v1alpha1.HCPSession) int64 {
	c, _ := strconv.ParseInt(hs.Annotations[AnnotationSequenceCeiling], 10, 64)
	return c
}

// patchOp is one JSON patch (RFC 6902) operation.
func patchOp(op, path string, value any) map[string]any {
	return map[string]any{"op": op, "path": path, "value": value}
}

// pointerEscape escapes a map key for a JSON pointer (RFC 6901).
var pointerEscape = strings.NewReplacer("~", "~0", "/", "~1")

// annotationOp sets annotation key to value.
func annotationOp(key, value string) map[string]any {
	return patchOp("add", "/metadata/annotations/"+pointerEscape.Replace(key), value)
}

// labelOp sets label key to value (the object has labels: the gate
// creates it with them).
func labelOp(key, value string) map[string]any {
	return patchOp("add", "/metadata/labels/"+pointerEscape.Replace(key), value)
}
