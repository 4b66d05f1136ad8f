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
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
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

// FuzzLoad: Load reads a ConfigMap of any content without a panic and
// fails only on a bad sequence of a checkpoint that has an id; what it
// returns is what the ConfigMap says. And Save followed by Load (through a
// fake API client) returns the task and checkpoint saved.
func FuzzLoad(f *testing.F) {
	task := []byte(`{"session_id":"7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e","capability":"cvd.run-synthesis","inputs":{"steps":20}}`)
	at := time.Date(2025, 1, 15, 8, 30, 0, 123456789, time.UTC)
	// As Save writes a real checkpoint, then variations a writer other than
	// the sidecar could leave behind.
	f.Add(task, "ckpt-8", "after step 8", strconv.FormatInt(17, 10), at.Format(time.RFC3339Nano), "true", []byte(`{"step":8,"film":"s3://b/f"}`), int64(17), at.UnixNano())
	f.Add(task, "", "", "", "", "", []byte(nil), int64(0), int64(0))
	f.Add(task, "c", "d", "-9223372036854775808", "2025-01-15T08:30:00Z", "TRUE", []byte{0, 0xff}, int64(-1), int64(-62135596800000000))
	f.Add([]byte("\xff"), "c", "\xff", "1e3", "yesterday", "1", bytes.Repeat([]byte{1}, MaxState+1), int64(1)<<62, int64(253402300799999999))
	// One fake API client for every input of this process (inputs run one
	// at a time); building one per input was most of a run's cost.
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).Build()
	store := &Store{C: c, R: c, Namespace: "ns", CalleeID: "lab"}
	owner := Owner{Name: "7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e", UID: "uid-1"}
	f.Fuzz(func(t *testing.T, task []byte, id, desc, seq, created, resumable string, state []byte, seqN, createdN int64) {
		cm := &corev1.ConfigMap{
			Data: map[string]string{keyTask: string(task), keyID: id, keyDesc: desc, keySequence: seq,
				keyCreatedAt: created, keyResumable: resumable},
			BinaryData: map[string][]byte{keyState: state},
		}
		s := &Store{R: cmReader{cm: cm}, Namespace: "ns"}
		rec, err := s.Load(context.Background(), "7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e")
		_, seqErr := strconv.ParseInt(seq, 10, 64)
		if (err != nil) != (id != "" && seqErr != nil) {
			t.Fatalf("Load error %v for id %q, sequence %q", err, id, seq)
		}
		if err == nil {
			if !bytes.Equal(rec.Task, task) || (rec.Checkpoint == nil) != (id == "") {
				t.Fatalf("Load returned %+v", rec)
			}
			if c := rec.Checkpoint; c != nil {
				want, perr := time.Parse(time.RFC3339Nano, created)
				if perr != nil {
					want = time.Time{} // informational: a bad time is dropped, not an error
				}
				if c.ID != id || c.Description != desc || c.Resumable != (resumable == "true") ||
					c.Sequence != mustInt(seq) ||
					!c.CreatedAt.Equal(want) || !bytes.Equal(c.State, state) {
					t.Fatalf("Load returned %+v", c)
				}
			}
		}

		// The round trip, for what the sidecar saves: strings that are
		// UTF-8 (they come from JSON) and a creation time of its clock.
		if !utf8.Valid(task) || !utf8.ValidString(id) || !utf8.ValidString(desc) {
			return
		}
		cp := Checkpoint{ID: id, Description: desc, Resumable: resumable == "true", Sequence: seqN,
			CreatedAt: time.Unix(0, createdN).UTC(), State: state}
		// Start from no record: Save creates it (its update path is the
		// same write).
		err = c.Delete(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: Name(owner.Name)}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		err = store.Save(context.Background(), owner, task, cp)
		if len(state) > MaxState {
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Save of %d bytes: %v", len(state), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Save: %v", err)
		}
		back, err := store.Load(context.Background(), owner.Name)
		if err != nil || !bytes.Equal(back.Task, task) {
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
		var stored corev1.ConfigMap
		err = c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: Name(owner.Name)}, &stored)
		if err != nil || len(stored.OwnerReferences) != 1 || stored.OwnerReferences[0].UID != owner.UID {
			t.Fatalf("stored ConfigMap owned by %v: %v", stored.OwnerReferences, err)
		}
	})
}

func mustInt(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
