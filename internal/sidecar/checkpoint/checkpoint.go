// Package checkpoint stores what a callee session needs to resume on
// another replica or after its harness restarted: the harness task it was
// started with and the last checkpoint the harness handed the sidecar (an
// opaque blob of at most MaxState bytes, with its id and the event sequence
// it was taken at). They live in one ConfigMap per session, owned by the
// HCPSession (so garbage collection removes it with the session), outside
// the HCPSession's status: status writes stay small and frequent, the blob
// is written only when the harness checkpoints.
//
// A ConfigMap rather than a Secret: the sidecar's ServiceAccount would need
// to read Secrets of the namespace to update one, which would expose the
// other harnesses' broker credentials. Harnesses keep secrets out of their
// checkpoints (pass references instead); docs/harness-api.md says so.
package checkpoint

import (
	"context"
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
)

// MaxState is the largest checkpoint blob.
const MaxState = 64 << 10

// ErrTooLarge is returned for a blob above MaxState.
var ErrTooLarge = fmt.Errorf("checkpoint state above %d bytes", MaxState)

// Keys of the ConfigMap.
const (
	keyTask       = "task.json"
	keyState      = "state"
	keyID         = "checkpoint-id"
	keyDesc       = "description"
	keySequence   = "sequence"
	keyCreatedAt  = "created-at"
	keyResumable  = "resumable"
	namePrefix    = "hcp-session-"
	fieldOwner    = "hcp-sidecar"
	labelPurposeV = "session-checkpoint"
)

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
	Task       []byte
	Checkpoint *Checkpoint // nil before the first checkpoint
}

// Store reads and writes the records of one namespace.
type Store struct {
	C         client.Client
	R         client.Reader
	Namespace string
	CalleeID  string
}

// Save writes the task and the checkpoint of a session owned by hs.
func (s *Store) Save(ctx context.Context, hs Owner, task []byte, cp Checkpoint) error {
	if len(cp.State) > MaxState {
		return ErrTooLarge
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: Name(hs.Name), Namespace: s.Namespace,
			Labels: map[string]string{
				v1alpha1.LabelCalleeID:  s.CalleeID,
				v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue,
				"hcp.io/purpose":        labelPurposeV,
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "HCPSession",
				Name: hs.Name, UID: hs.UID, BlockOwnerDeletion: ptr.To(false),
			}},
		},
		Data: map[string]string{
			keyTask:      string(task),
			keyID:        cp.ID,
			keyDesc:      cp.Description,
			keyResumable: strconv.FormatBool(cp.Resumable),
			keySequence:  strconv.FormatInt(cp.Sequence, 10),
			keyCreatedAt: cp.CreatedAt.UTC().Format(time.RFC3339Nano),
		},
		BinaryData: map[string][]byte{keyState: cp.State},
	}
	err := s.C.Create(ctx, cm, client.FieldOwner(fieldOwner))
	if apierrors.IsAlreadyExists(err) {
		err = s.C.Update(ctx, cm, client.FieldOwner(fieldOwner))
	}
	if err != nil {
		return fmt.Errorf("storing the checkpoint of session %s: %w", hs.Name, err)
	}
	return nil
}

// Owner identifies the HCPSession a record belongs to.
type Owner struct {
	Name string
	UID  types.UID
}

// Load reads a session's record; (nil, nil) when there is none.
func (s *Store) Load(ctx context.Context, sessionID string) (*Record, error) {
	var cm corev1.ConfigMap
	err := s.R.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: Name(sessionID)}, &cm)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the checkpoint of session %s: %w", sessionID, err)
	}
	rec := &Record{Task: []byte(cm.Data[keyTask])}
	if id := cm.Data[keyID]; id != "" {
		seq, err := strconv.ParseInt(cm.Data[keySequence], 10, 64)
		if err != nil {
			return nil, errors.New("checkpoint record: bad sequence")
		}
		at, _ := time.Parse(time.RFC3339Nano, cm.Data[keyCreatedAt])
		rec.Checkpoint = &Checkpoint{
			ID: id, Description: cm.Data[keyDesc], Resumable: cm.Data[keyResumable] == "true",
			Sequence: seq, CreatedAt: at, State: cm.BinaryData[keyState],
		}
	}
	return rec, nil
}
