package checkpoint

import (
	"context"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

func key(t *testing.T, seed byte) ed25519.PrivateKey {
	t.Helper()
	return ed25519Key(seed)
}

func ed25519Key(seed byte) ed25519.PrivateKey {
	s := make([]byte, ed25519.SeedSize)
	s[0] = seed
	return ed25519.NewKeyFromSeed(s)
}

func kidOf(k ed25519.PrivateKey) string { return token.KeyID(k.Public().(ed25519.PublicKey)) }

// newStore is the store of Callee name (id name+"-id") signing with k and
// accepting the keys of verify (k's own when empty).
func newStore(t testing.TB, c client.Client, name string, k ed25519.PrivateKey, verify ...ed25519.PrivateKey) *Store {
	t.Helper()
	if len(verify) == 0 {
		verify = []ed25519.PrivateKey{k}
	}
	var pubs []ed25519.PublicKey
	for _, v := range verify {
		pubs = append(pubs, v.Public().(ed25519.PublicKey))
	}
	set, err := token.NewKeySet(pubs...)
	if err != nil {
		t.Fatal(err)
	}
	return &Store{C: c, R: c, Namespace: "ns", CalleeID: name + "-id", CalleeName: name,
		Signer: func() ed25519.PrivateKey { return k }, Verifiers: func() token.KeySet { return set }}
}

var (
	sid       = "7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e"
	decision  = Decision{CallerID: "alpha", Capability: "cvd.run", Risk: "R2", DataClass: "T2", MaxDuration: "PT1H"}
	owner     = Owner{Name: sid, UID: "uid-1", Decision: decision}
	savedTask = []byte(`{"session_id":"7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e","capability":"cvd.run","inputs":{"steps":20}}`)
	savedCP   = Checkpoint{ID: "ckpt-8", Description: "after step 8", Resumable: true, Sequence: 17,
		CreatedAt: time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC), State: []byte(`{"step":8}`)}
)

func fakeClient() client.Client {
	return fake.NewClientBuilder().WithScheme(scheme.Scheme).Build()
}

func saved(t *testing.T, c client.Client, s *Store) *corev1.ConfigMap {
	t.Helper()
	if err := s.Save(context.Background(), owner, 3, savedTask, savedCP); err != nil {
		t.Fatalf("Save: %v", err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: Name(sid)}, &cm); err != nil {
		t.Fatal(err)
	}
	return &cm
}

// A record Save wrote loads back, bound and verified.
func TestSaveLoadRoundTrip(t *testing.T) {
	c := fakeClient()
	s := newStore(t, c, "lab", key(t, 1))
	cm := saved(t, c, s)
	if cm.Labels[v1alpha1.LabelCallee] != "lab" || cm.Labels[v1alpha1.LabelCalleeID] != "lab-id" {
		t.Fatalf("labels %v", cm.Labels)
	}
	rec, err := s.Load(context.Background(), owner)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if string(rec.Task) != string(savedTask) || rec.Epoch != 3 || rec.Decision != decision || rec.Checkpoint == nil ||
		rec.Checkpoint.ID != "ckpt-8" || string(rec.Checkpoint.State) != `{"step":8}` || !rec.Checkpoint.CreatedAt.Equal(savedCP.CreatedAt) {
		t.Fatalf("Load returned %+v", rec)
	}
	// A retired key still in the accepted set verifies (key rotation).
	rotated := newStore(t, c, "lab", key(t, 9), key(t, 9), key(t, 1))
	if _, err := rotated.Load(context.Background(), owner); err != nil {
		t.Fatalf("Load after a key rotation: %v", err)
	}
}

// Load refuses every record that is not exactly what a sidecar of this
// Callee saved for this session: a forged or altered object, one bound to
// another session or Callee, one signed by another key.
func TestLoadRejectsForgedAndMismatched(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		edit  func(cm *corev1.ConfigMap)
		load  func(t *testing.T, c client.Client) (*Record, error)
		store func(t *testing.T, c client.Client) *Store
	}{
		{name: "task changed", edit: func(cm *corev1.ConfigMap) { cm.Data[keyTask] = `{"capability":"cvd.other"}` }},
		{name: "state changed", edit: func(cm *corev1.ConfigMap) { cm.BinaryData[keyState] = []byte(`{"step":9}`) }},
		{name: "checkpoint id changed", edit: func(cm *corev1.ConfigMap) { cm.Data[keyID] = "ckpt-9" }},
		{name: "sequence changed", edit: func(cm *corev1.ConfigMap) { cm.Data[keySequence] = "18" }},
		{name: "epoch raised", edit: func(cm *corev1.ConfigMap) { cm.Data[keyEpoch] = "4" }},
		{name: "decision changed", edit: func(cm *corev1.ConfigMap) {
			cm.Data[keyDecision] = `{"caller_id":"alpha","capability":"cvd.run","risk_level":"R4","data_classification":"T2","max_duration":"PT1H"}`
		}},
		{name: "no tag", edit: func(cm *corev1.ConfigMap) { delete(cm.Data, keySignature) }},
		{name: "tag of another key", edit: func(cm *corev1.ConfigMap) {
			cm.Data[keySignature] = sign(key(t, 2), []byte("x"))
		}},
		{name: "unknown key id", edit: func(cm *corev1.ConfigMap) { cm.Data[keyKeyID] = "nope" }},
		{name: "owner UID changed", edit: func(cm *corev1.ConfigMap) { cm.OwnerReferences[0].UID = "uid-2" }},
		{name: "no owner", edit: func(cm *corev1.ConfigMap) { cm.OwnerReferences = nil }},
		{name: "second owner", edit: func(cm *corev1.ConfigMap) {
			cm.OwnerReferences = append(cm.OwnerReferences, cm.OwnerReferences[0])
			cm.OwnerReferences[1].Name = "other"
		}},
		{name: "callee label of another Callee", edit: func(cm *corev1.ConfigMap) { cm.Labels[v1alpha1.LabelCallee] = "beta" }},
		{name: "callee id label missing", edit: func(cm *corev1.ConfigMap) { delete(cm.Labels, v1alpha1.LabelCalleeID) }},
		{name: "legacy record (no tag, no decision, no epoch)", edit: func(cm *corev1.ConfigMap) {
			delete(cm.Data, keySignature)
			delete(cm.Data, keyKeyID)
			delete(cm.Data, keyDecision)
			delete(cm.Data, keyEpoch)
		}},
		{name: "another session's HCPSession (same name, new UID)", load: func(t *testing.T, c client.Client) (*Record, error) {
			o := owner
			o.UID = "uid-2"
			return newStore(t, c, "lab", key(t, 1)).Load(ctx, o)
		}},
		{name: "another decision on the HCPSession", load: func(t *testing.T, c client.Client) (*Record, error) {
			o := owner
			o.Decision.Risk = "R1"
			return newStore(t, c, "lab", key(t, 1)).Load(ctx, o)
		}},
		{name: "loaded by another Callee", load: func(t *testing.T, c client.Client) (*Record, error) {
			return newStore(t, c, "beta", key(t, 2), key(t, 2), key(t, 1)).Load(ctx, owner)
		}},
		// Another Callee's sidecar writes a record for this session with
		// its own key and labels: this Callee does not accept it.
		{name: "saved by another Callee", store: func(t *testing.T, c client.Client) *Store {
			return newStore(t, c, "beta", key(t, 2))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := fakeClient()
			writer := newStore(t, c, "lab", key(t, 1))
			if tc.store != nil {
				writer = tc.store(t, c)
			}
			cm := saved(t, c, writer)
			if tc.edit != nil {
				tc.edit(cm)
				if err := c.Update(ctx, cm); err != nil {
					t.Fatal(err)
				}
			}
			load := tc.load
			if load == nil {
				load = func(t *testing.T, c client.Client) (*Record, error) {
					return newStore(t, c, "lab", key(t, 1)).Load(ctx, owner)
				}
			}
			rec, err := load(t, c)
			if !errors.Is(err, ErrUnverified) || rec != nil {
				t.Fatalf("Load = %+v, %v; want ErrUnverified", rec, err)
			}
		})
	}
}

// Save never lowers the stored owner epoch, and its write is conditional:
// a record that another owner wrote between Save's read and its write is
// not overwritten.
func TestSaveIsFencedByTheOwnerEpoch(t *testing.T) {
	ctx := context.Background()
	c := fakeClient()
	s := newStore(t, c, "lab", key(t, 1))
	saved(t, c, s) // epoch 3
	if err := s.Save(ctx, owner, 2, savedTask, savedCP); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("Save at epoch 2 over epoch 3: %v, want ErrStaleEpoch", err)
	}
	if err := s.Save(ctx, owner, 3, savedTask, savedCP); err != nil {
		t.Fatalf("Save at the same epoch: %v", err)
	}

	// Between the stale owner's read and its write, the new owner (epoch
	// 5) saves: the stale write fails its resourceVersion precondition,
	// and the retry sees epoch 5.
	newer := savedCP
	newer.ID = "ckpt-new-owner"
	raced := false
	ic := interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
		Update: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if !raced {
				raced = true
				if err := s.Save(ctx, owner, 5, savedTask, newer); err != nil {
					t.Errorf("the new owner's Save: %v", err)
				}
			}
			return cl.Update(ctx, obj, opts...)
		},
	})
	stale := newStore(t, ic, "lab", key(t, 1))
	if err := stale.Save(ctx, owner, 4, savedTask, savedCP); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("the stale owner's Save: %v, want ErrStaleEpoch", err)
	}
	rec, err := s.Load(ctx, owner)
	if err != nil || rec.Epoch != 5 || rec.Checkpoint.ID != "ckpt-new-owner" {
		t.Fatalf("after the race: %+v, %v", rec, err)
	}
}

// A record in the unsigned format of an earlier release, bound to this
// Callee's id and the session's HCPSession, is refused with a LegacyError
// carrying its content (for the caller's own checks); one bound elsewhere
// is refused outright.
func TestLoadReportsLegacyRecords(t *testing.T) {
	ctx := context.Background()
	legacyCM := func() *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: Name(sid), Namespace: "ns",
				Labels: map[string]string{v1alpha1.LabelCalleeID: "lab-id"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HCPSession",
					Name: sid, UID: owner.UID}}},
			Data: map[string]string{keyTask: string(savedTask), keyID: "ckpt-1", keySequence: "4", keyResumable: "true"},
		}
	}
	c := fakeClient()
	if err := c.Create(ctx, legacyCM()); err != nil {
		t.Fatal(err)
	}
	rec, err := newStore(t, c, "lab", key(t, 1)).Load(ctx, owner)
	var le *LegacyError
	if rec != nil || !errors.Is(err, ErrUnverified) || !errors.As(err, &le) || string(le.Record.Task) != string(savedTask) ||
		le.Record.Checkpoint == nil || le.Record.Checkpoint.ID != "ckpt-1" {
		t.Fatalf("Load of a legacy record = %+v, %v", rec, err)
	}
	for name, edit := range map[string]func(*corev1.ConfigMap){
		"another callee id": func(cm *corev1.ConfigMap) { cm.Labels[v1alpha1.LabelCalleeID] = "beta-id" },
		"another owner":     func(cm *corev1.ConfigMap) { cm.OwnerReferences[0].UID = "uid-2" },
	} {
		c := fakeClient()
		cm := legacyCM()
		edit(cm)
		if err := c.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
		_, err := newStore(t, c, "lab", key(t, 1)).Load(ctx, owner)
		if !errors.Is(err, ErrUnverified) || errors.As(err, &le) {
			t.Fatalf("%s: %v, want ErrUnverified and no LegacyError", name, err)
		}
	}
	// Save over it (the new owner's first checkpoint) replaces it.
	if err := newStore(t, c, "lab", key(t, 1)).Save(ctx, owner, 0, savedTask, savedCP); err != nil {
		t.Fatalf("Save over a legacy record: %v", err)
	}
	if _, err := newStore(t, c, "lab", key(t, 1)).Load(ctx, owner); err != nil {
		t.Fatalf("Load after the new owner's Save: %v", err)
	}
}
