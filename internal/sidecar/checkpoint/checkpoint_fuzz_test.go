package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// cmReader serves one ConfigMap, as the API server would hand back
// whatever is stored under the session's name (anyone with write access to
// ConfigMaps of the namespace can put anything there).
type cmReader struct {
	client.Reader
	cm *corev1.ConfigMap
}

func (r cmReader) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	r.cm.DeepCopyInto(obj.(*corev1.ConfigMap))
	return nil
}

// FuzzLoad: Load reads a ConfigMap of any content without a panic, and
// accepts none that the Callee's key did not sign, even one that carries
// the right labels, owner and key id. And Save followed by Load (through a
// fake API client) returns the task and checkpoint saved.
func FuzzLoad(f *testing.F) {
	task := []byte(`{"session_id":"7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e","capability":"cvd.run-synthesis","inputs":{"steps":20}}`)
	at := time.Date(2025, 1, 15, 8, 30, 0, 123456789, time.UTC)
	f.Add(task, "ckpt-8", "after step 8", strconv.FormatInt(17, 10), at.Format(time.RFC3339Nano), "true", []byte(`{"step":8,"film":"s3://b/f"}`), int64(17), at.UnixNano(), "c2lnbmF0dXJl")
	f.Add(task, "", "", "", "", "", []byte(nil), int64(0), int64(0), "")
	f.Add(task, "c", "d", "-9223372036854775808", "2025-01-15T08:30:00Z", "TRUE", []byte{0, 0xff}, int64(-1), int64(-62135596800000000), "!!")
	f.Add([]byte("\xff"), "c", "\xff", "1e3", "yesterday", "1", bytes.Repeat([]byte{1}, MaxState+1), int64(1)<<62, int64(253402300799999999), "")
	// One fake API client for every input of this process (inputs run one
	// at a time); building one per input was most of a run's cost.
	c := fakeClient()
	k := ed25519Key(1)
	store := newStore(f, c, "lab", k)
	kid := kidOf(k)
	f.Fuzz(func(t *testing.T, task []byte, id, desc, seq, created, resumable string, state []byte, seqN, createdN int64, sig string) {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: Name(owner.Name), Namespace: "ns",
				Labels: map[string]string{v1alpha1.LabelCallee: "lab", v1alpha1.LabelCalleeID: "lab-id"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HCPSession",
					Name: owner.Name, UID: owner.UID}},
			},
			Data: map[string]string{keyTask: string(task), keyID: id, keyDesc: desc, keySequence: seq,
				keyCreatedAt: created, keyResumable: resumable, keyEpoch: "1", keyDecision: mustEncode(decision),
				keyKeyID: kid, keySignature: sig},
			BinaryData: map[string][]byte{keyState: state},
		}
		s := *store
		s.R = cmReader{cm: cm}
		rec, err := s.Load(context.Background(), owner)
		if !errors.Is(err, ErrUnverified) || rec != nil {
			t.Fatalf("Load of an object the Callee did not sign: %+v, %v", rec, err)
		}

		// The round trip, for what the sidecar saves: strings that are
		// UTF-8 (they come from JSON) and a creation time of its clock.
		if !utf8.Valid(task) || !utf8.ValidString(id) || !utf8.ValidString(desc) {
			return
		}
		cp := Checkpoint{ID: id, Description: desc, Resumable: resumable == "true", Sequence: seqN,
			CreatedAt: time.Unix(0, createdN).UTC(), State: state}
		// Start from no record: Save creates it.
		err = c.Delete(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: Name(owner.Name)}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		err = store.Save(context.Background(), owner, 1, task, cp)
		if len(state) > MaxState {
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Save of %d bytes: %v", len(state), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Save: %v", err)
		}
		back, err := store.Load(context.Background(), owner)
		if err != nil || !bytes.Equal(back.Task, task) || back.Epoch != 1 || back.Decision != decision {
			t.Fatalf("Load after Save: %+v, %v", back, err)
		}
		if id == "" {
			if back.Checkpoint != nil {
				t.Fatalf("a checkpoint without id read back as %+v", back.Checkpoint)
			}
			return
		}
		got := back.Checkpoint
		if got == nil || got.ID != cp.ID || got.Description != cp.Description || got.Resumable != cp.Resumable ||
			got.Sequence != cp.Sequence || !got.CreatedAt.Equal(cp.CreatedAt) || !bytes.Equal(got.State, cp.State) {
			t.Fatalf("saved %+v, read back %+v", cp, got)
		}
	})
}

func mustEncode(d Decision) string {
	s, err := d.encode()
	if err != nil {
		panic(err)
	}
	return s
}
