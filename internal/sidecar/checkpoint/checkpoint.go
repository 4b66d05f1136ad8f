// Package checkpoint stores what a callee session needs to resume on
// another replica or after its harness restarted: the harness task it was
// started with, what the L3 gate admitted it with, and the last checkpoint
// the harness handed the sidecar (an opaque blob of at most MaxState
// bytes, with its id and the event sequence it was taken at). They live in
// one ConfigMap per session, owned by the HCPSession (so garbage collection
// removes it with the session), outside the HCPSession's status: status
// writes stay small and frequent, the blob is written only when the
// harness checkpoints.
//
// A record is bound to its session and its Callee (bind.go): labels name
// the Callee, the only owner reference is the HCPSession's UID, and an
// Ed25519 signature with the Callee's session-token key covers all of it
// (the namespace, the session's name and UID, the Callee, the owner epoch,
// the gate's decision, the task and the checkpoint). Load returns a record
// only when all of that checks out, so an object written by anyone else
// (another Callee's sidecar, a person with write access to ConfigMaps)
// never reaches a harness. Save is conditional on the owner epoch: it never
// lowers the stored one, and it writes with a resourceVersion precondition.
//
// A ConfigMap rather than a Secret: the sidecar's ServiceAccount would need
// to read Secrets of the namespace to update one, which would expose the
// other harnesses' broker credentials. Harnesses keep secrets out of their
// checkpoints (pass references instead); docs/harness-api.md says so.
package checkpoint

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// kindHCPSession is the kind of a record's one owner.
const kindHCPSession = "HCPSession"

// MaxState is the largest checkpoint blob.
const MaxState = 64 << 10

// ErrTooLarge is returned for a blob above MaxState.
var ErrTooLarge = fmt.Errorf("checkpoint state above %d bytes", MaxState)

// ErrStaleEpoch is returned by Save when the stored record was written by
// a later owner of the session (a higher owner epoch): this replica lost
// the session and must not overwrite it.
var ErrStaleEpoch = errors.New("the checkpoint was written by a later owner of the session")

// Keys of the ConfigMap.
const (
	keyTask       = "task.json"
	keyDecision   = "decision.json"
	keyEpoch      = "owner-epoch"
	keyState      = "state"
	keyID         = "checkpoint-id"
	keyDesc       = "description"
	keySequence   = "sequence"
	keyCreatedAt  = "created-at"
	keyResumable  = "resumable"
	keySignature  = "signature"
	keyKeyID      = "signature-kid"
	namePrefix    = "hcp-session-"
	fieldOwner    = "hcp-sidecar"
	labelPurpose  = "hcp.io/purpose"
	labelPurposeV = "session-checkpoint"
)

// saveAttempts bounds Save's read-check-write rounds lost to a concurrent
// writer of the same epoch (two checkpoint requests of one harness).
const saveAttempts = 4

// Name is the ConfigMap of a session.
func Name(sessionID string) string { return namePrefix + sessionID }

// Checkpoint is the harness's last checkpoint of a session.
type Checkpoint struct {
	ID          string
	Description string
	Resumable   bool
	// Sequence is the sequence of its checkpoint_created event.
	Sequence  int64
	CreatedAt time.Time
	State     []byte
}

// Record is what is stored for a session.
type Record struct {
	Task []byte
	// Decision is what the gate admitted the session with.
	Decision Decision
	// Epoch is the owner epoch of the replica that wrote the record.
	Epoch      int64
	Checkpoint *Checkpoint // nil before the first checkpoint
}

// Owner is the session a record belongs to: its HCPSession's name and UID,
// and the gate's decision as the HCPSession records it.
type Owner struct {
	Name     string
	UID      types.UID
	Decision Decision
}

// Store reads and writes the records of one Callee in one namespace.
type Store struct {
	C         client.Client
	R         client.Reader
	Namespace string
	// CalleeID and CalleeName (the Callee object's name, label
	// hcp.io/callee) are the Callee whose records this store writes and
	// accepts.
	CalleeID   string
	CalleeName string
	// Signer is the Callee's current session-token key; Verifiers are the
	// keys accepted (the current one and those retired by a rotation).
	Signer    func() ed25519.PrivateKey
	Verifiers func() token.KeySet
}

// Save writes the task and the checkpoint of session o as its owner at
// epoch: a record of a later epoch is never overwritten (ErrStaleEpoch),
// and the write carries the resourceVersion read, so a concurrent writer
// cannot be overwritten unseen.
func (s *Store) Save(ctx context.Context, o Owner, epoch int64, task []byte, cp Checkpoint) error {
	if len(cp.State) > MaxState {
		return ErrTooLarge
	}
	cm, err := s.build(o, epoch, task, cp)
	if err != nil {
		return fmt.Errorf("storing the checkpoint of session %s: %w", o.Name, err)
	}
	for range saveAttempts {
		var cur corev1.ConfigMap
		err = s.R.Get(ctx, client.ObjectKeyFromObject(cm), &cur)
		switch {
		case apierrors.IsNotFound(err):
			cm.ResourceVersion = ""
			err = s.C.Create(ctx, cm, client.FieldOwner(fieldOwner))
		case err == nil:
			if stored, ok := storedEpoch(&cur, o.UID); ok && stored > epoch {
				return fmt.Errorf("storing the checkpoint of session %s at owner epoch %d: %w (epoch %d)", o.Name, epoch, ErrStaleEpoch, stored)
			}
			cm.ResourceVersion = cur.ResourceVersion
			err = s.C.Update(ctx, cm, client.FieldOwner(fieldOwner))
		}
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("storing the checkpoint of session %s: %w", o.Name, err)
	}
	return nil
}

// storedEpoch is the owner epoch of a record of the session with uid; not
// ok for a record of another incarnation of the name (garbage collection
// has not removed it yet) or without an epoch.
func storedEpoch(cm *corev1.ConfigMap, uid types.UID) (int64, bool) {
	if len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].UID != uid {
		return 0, false
	}
	n, err := strconv.ParseInt(cm.Data[keyEpoch], 10, 64)
	return n, err == nil
}

// build is the signed ConfigMap of a record.
func (s *Store) build(o Owner, epoch int64, task []byte, cp Checkpoint) (*corev1.ConfigMap, error) {
	dec, err := o.Decision.encode()
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: Name(o.Name), Namespace: s.Namespace,
			Labels: map[string]string{
				v1alpha1.LabelCalleeID:  s.CalleeID,
				v1alpha1.LabelCallee:    s.CalleeName,
				v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue,
				labelPurpose:            labelPurposeV,
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: kindHCPSession,
				Name: o.Name, UID: o.UID, BlockOwnerDeletion: ptr.To(false),
			}},
		},
		Data: map[string]string{
			keyTask:      string(task),
			keyDecision:  dec,
			keyEpoch:     strconv.FormatInt(epoch, 10),
			keyID:        cp.ID,
			keyDesc:      cp.Description,
			keyResumable: strconv.FormatBool(cp.Resumable),
			keySequence:  strconv.FormatInt(cp.Sequence, 10),
			keyCreatedAt: cp.CreatedAt.UTC().Format(time.RFC3339Nano),
		},
		BinaryData: map[string][]byte{keyState: cp.State},
	}
	k := s.Signer()
	kid := token.KeyID(k.Public().(ed25519.PublicKey))
	cm.Data[keyKeyID] = kid
	cm.Data[keySignature] = sign(k, s.message(cm, o.Name, o.UID))
	return cm, nil
}

// Load reads session o's record and verifies it (bind.go): (nil, nil) when
// there is none; an error matching ErrUnverified when the object is not a
// record this Callee saved for this very session.
func (s *Store) Load(ctx context.Context, o Owner) (*Record, error) {
	var cm corev1.ConfigMap
	err := s.R.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: Name(o.Name)}, &cm)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the checkpoint of session %s: %w", o.Name, err)
	}
	rec, err := s.verify(&cm, o)
	if err != nil {
		return nil, fmt.Errorf("the checkpoint of session %s (ConfigMap %s): %w", o.Name, cm.Name, err)
	}
	return rec, nil
}

// decode reads a verified ConfigMap.
func decode(cm *corev1.ConfigMap) (*Record, error) {
	rec := &Record{Task: []byte(cm.Data[keyTask])}
	var err error
	if rec.Epoch, err = strconv.ParseInt(cm.Data[keyEpoch], 10, 64); err != nil {
		return nil, errors.New("bad owner epoch")
	}
	if rec.Decision, err = decodeDecision(cm.Data[keyDecision]); err != nil {
		return nil, err
	}
	if id := cm.Data[keyID]; id != "" {
		seq, err := strconv.ParseInt(cm.Data[keySequence], 10, 64)
		if err != nil {
			return nil, errors.New("bad sequence")
		}
		at, _ := time.Parse(time.RFC3339Nano, cm.Data[keyCreatedAt])
		rec.Checkpoint = &Checkpoint{
			ID: id, Description: cm.Data[keyDesc], Resumable: cm.Data[keyResumable] == "true",
			Sequence: seq, CreatedAt: at, State: cm.BinaryData[keyState],
		}
	}
	return rec, nil
}
