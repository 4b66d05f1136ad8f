package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// opAdd is the JSON patch operation that sets a member.
const opAdd = "add"

// Owner-epoch guarded writes. A session whose desired status carries an
// ownerEpoch (the callee sidecar's, which claimed it with that epoch) is
// written only while the stored status.ownerEpoch is still that epoch: each
// write is a JSON patch whose first operation tests it, so a replica that
// lost the session (a later claim stored a higher epoch) cannot overwrite
// its successor's status, whatever it still holds in memory. A guarded
// write that fails is checked against a fresh read: a higher stored epoch
// means the session is lost (ErrFenced, the OnFenced callback), anything
// else is retried like any failed write.

// ErrFenced is returned by Flush when the session was claimed by another
// owner (a higher status.ownerEpoch is stored): this writer writes nothing
// more for it.
var ErrFenced = errors.New("status: the session was claimed by a later owner (a higher status.ownerEpoch); not written")

// fencedError carries the stored epoch that fenced a write.
type fencedError struct{ stored, mine int64 }

func (e *fencedError) Error() string {
	return fmt.Sprintf("status: stored ownerEpoch %d is above this writer's %d", e.stored, e.mine)
}

func (e *fencedError) Unwrap() error { return ErrFenced }

// SetOwnerEpochGuard turns the guarded writes on (the callee sidecar's
// writer, which owns status.ownerEpoch); the caller sidecar's writer, which
// writes only callerAckedSequence, leaves it off.
func (w *Writer) SetOwnerEpochGuard(on bool) {
	w.mu.Lock()
	w.guard = on
	w.mu.Unlock()
}

// guarded reports the epoch a write of target is conditional on (0: none).
func (w *Writer) guarded(target v1alpha1.HCPSessionStatus) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.guard {
		return 0
	}
	return target.OwnerEpoch
}

// SetReader sets the reader a failed guarded write is checked with (the
// API server, uncached, ideally); the default is the writer's client.
func (w *Writer) SetReader(r client.Reader) {
	w.mu.Lock()
	w.reader = r
	w.mu.Unlock()
}

// SetOnFenced sets what is told (in a goroutine of its own) when a
// guarded write finds the session claimed by a later owner.
func (w *Writer) SetOnFenced(f func(name string)) {
	w.mu.Lock()
	w.onFenced = f
	w.mu.Unlock()
}

// jsonOp is one JSON patch (RFC 6902) operation.
type jsonOp struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	Value json.RawMessage `json:"value,omitempty"`
}

// statusOps are the operations turning the stored status from base into
// target, field by field at the top level of status (a field another
// writer owns, such as the caller sidecar's callerAckedSequence, is left
// alone). whole replaces the status at once (the object has none yet).
func statusOps(base, target v1alpha1.HCPSessionStatus, whole bool) ([]jsonOp, error) {
	t, err := json.Marshal(target)
	if err != nil {
		return nil, err
	}
	if whole {
		return []jsonOp{{Op: opAdd, Path: "/status", Value: t}}, nil
	}
	var bm, tm map[string]json.RawMessage
	b, err := json.Marshal(base)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &bm); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(t, &tm); err != nil {
		return nil, err
	}
	var ops []jsonOp
	for k, v := range tm {
		if string(bm[k]) != string(v) {
			ops = append(ops, jsonOp{Op: opAdd, Path: "/status/" + escape(k), Value: v})
		}
	}
	for k := range bm {
		if _, ok := tm[k]; !ok {
			ops = append(ops, jsonOp{Op: "remove", Path: "/status/" + escape(k)})
		}
	}
	return ops, nil
}

func escape(k string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(k) }

func testEpoch(epoch int64) jsonOp {
	return jsonOp{Op: "test", Path: "/status/ownerEpoch", Value: json.RawMessage(strconv.FormatInt(epoch, 10))}
}

// firstWriteReads bounds how often a session's first guarded write reads
// the object again after another writer changed it in between.
const firstWriteReads = 4

// writeGuarded writes target over base, conditional on the stored owner
// epoch being epoch (see the top of this file).
func (w *Writer) writeGuarded(ctx context.Context, name string, base, target v1alpha1.HCPSessionStatus, epoch int64) error {
	if base.OwnerEpoch == epoch {
		return w.patchGuarded(ctx, name, base, target, epoch, testEpoch(epoch), false)
	}
	// This writer sets the epoch (the first write of a session admitted
	// at its creation, whose status is empty): conditional on the object
	// as read now. Another writer's change in between (the caller
	// sidecar's callerAckedSequence just after the create) fails the
	// test without taking the session: read again and write in the same
	// attempt, instead of failing it into a backoff.
	for read := 1; ; read++ {
		stored, err := w.read(ctx, name)
		if err != nil {
			return err
		}
		switch se := stored.Status.OwnerEpoch; {
		case se > epoch:
			return &fencedError{stored: se, mine: epoch}
		case se == epoch:
			return w.patchGuarded(ctx, name, base, target, epoch, testEpoch(epoch), false)
		}
		rv := jsonOp{Op: "test", Path: "/metadata/resourceVersion", Value: json.RawMessage(strconv.Quote(stored.ResourceVersion))}
		err = w.patchOps(ctx, name, base, target, rv, isZero(stored.Status))
		// A failed test is 422 Invalid. So is a patch the API server
		// refuses for itself: it fails like any write, after
		// firstWriteReads tries. The next read tells a later owner's
		// epoch (no read of checkFenced's in between).
		switch {
		case err == nil || apierrors.IsNotFound(err):
			return err
		case !apierrors.IsInvalid(err) || read == firstWriteReads:
			return w.checkFenced(ctx, name, epoch, err)
		}
	}
}

// patchGuarded patches the status from base to target behind the test
// operation cond; whole replaces the status at once.
func (w *Writer) patchGuarded(ctx context.Context, name string, base, target v1alpha1.HCPSessionStatus, epoch int64, cond jsonOp, whole bool) error {
	err := w.patchOps(ctx, name, base, target, cond, whole)
	if err != nil && !apierrors.IsNotFound(err) {
		err = w.checkFenced(ctx, name, epoch, err)
	}
	return err
}

// patchOps is patchGuarded without the check of a failure.
func (w *Writer) patchOps(ctx context.Context, name string, base, target v1alpha1.HCPSessionStatus, cond jsonOp, whole bool) error {
	more, err := statusOps(base, target, whole)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(append([]jsonOp{cond}, more...))
	if err != nil {
		return err
	}
	obj := &v1alpha1.HCPSession{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns}}
	return w.c.Status().Patch(ctx, obj, client.RawPatch(types.JSONPatchType, patch), client.FieldOwner(w.owner))
}

// writeLabelGuarded sets the state label, conditional on the owner epoch.
func (w *Writer) writeLabelGuarded(ctx context.Context, name, key string, state v1alpha1.SessionState, epoch int64) error {
	v, _ := json.Marshal(string(state))
	patch, err := json.Marshal([]jsonOp{testEpoch(epoch), {Op: opAdd, Path: "/metadata/labels/" + escape(key), Value: v}})
	if err != nil {
		return err
	}
	obj := &v1alpha1.HCPSession{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns}}
	err = w.c.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, patch), client.FieldOwner(w.owner))
	if err != nil && !apierrors.IsNotFound(err) {
		err = w.checkFenced(ctx, name, epoch, err)
	}
	return err
}

// checkFenced tells a failed guarded write lost to a later owner from any
// other failure, by reading the object.
func (w *Writer) checkFenced(ctx context.Context, name string, epoch int64, err error) error {
	stored, rerr := w.read(ctx, name)
	if rerr == nil && stored.Status.OwnerEpoch > epoch {
		return &fencedError{stored: stored.Status.OwnerEpoch, mine: epoch}
	}
	return err
}

func (w *Writer) read(ctx context.Context, name string) (*v1alpha1.HCPSession, error) {
	w.mu.Lock()
	r := w.reader
	w.mu.Unlock()
	if r == nil {
		r = w.c
	}
	var hs v1alpha1.HCPSession
	if err := r.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: name}, &hs); err != nil {
		return nil, err
	}
	return &hs, nil
}

func isZero(st v1alpha1.HCPSessionStatus) bool {
	b, _ := json.Marshal(st)
	return string(b) == "{}"
}
