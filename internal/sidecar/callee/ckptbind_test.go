package callee

import (
	"crypto/ed25519"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// orphanTask is the harness task of a session b.orphan created, as the
// sidecar that admitted it would have stored it.
func orphanTask(t *testing.T, sid, inputs string) []byte {
	t.Helper()
	body, err := json.Marshal(harnessTask{SessionID: sid, CallerID: callerID, CalleeID: calleeID, Capability: "analyze",
		RiskLevel: task.R1, DataClassification: task.T1, MaxDuration: task.Duration(time.Hour), Inputs: json.RawMessage(inputs)})
	must(t, err)
	return body
}

// saveCheckpoint stores a session's record as a sidecar of the bed's
// Callee does (signed with the bed's key, at the session's owner epoch).
func (b *bed) saveCheckpoint(sid string, body []byte, cp checkpoint.Checkpoint) {
	b.t.Helper()
	hs := b.hcpSession(sid)
	store := &checkpoint.Store{C: b.env.Client, R: b.env.Client, Namespace: b.ns, CalleeID: calleeID, CalleeName: calleeID,
		Signer: func() ed25519.PrivateKey { return b.key },
		Verifiers: func() token.KeySet {
			s, _ := token.NewKeySet(b.key.Public().(ed25519.PublicKey))
			return s
		}}
	must(b.t, store.Save(b.t.Context(), ckptOwner(hs), hs.Status.OwnerEpoch, body, cp))
}

// TestForgedCheckpointRunsNothingOnTakeover: the replica running a session
// is gone, and someone who may write ConfigMaps of the namespace (here an
// administrator, whom no admission policy stops) put a checkpoint record
// under the session's name: bound to the right HCPSession, labelled for
// the right Callee, but with a task the gate never admitted. The replica
// that takes the session over refuses it: the session ends FAILED
// (checkpoint_rejected) and no harness gets anything.
func TestForgedCheckpointRunsNothingOnTakeover(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true})
	sid := b.orphan("vanished-pod", v1alpha1.SessionRunning, 7)
	hs := b.hcpSession(sid)
	forged, err := json.Marshal(harnessTask{SessionID: sid, CallerID: callerID, CalleeID: calleeID, Capability: "synthesize",
		RiskLevel: task.R4, MaxDuration: task.Duration(time.Hour), Inputs: json.RawMessage(`{"steps":3,"step_ms":10}`)})
	must(t, err)
	must(t, b.env.Client.Create(t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: checkpoint.Name(sid), Namespace: b.ns,
			Labels:          map[string]string{v1alpha1.LabelCalleeID: calleeID, v1alpha1.LabelCallee: calleeID, v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HCPSession", Name: sid, UID: hs.UID}},
		},
		Data: map[string]string{"task.json": string(forged), "checkpoint-id": "ckpt-1", "sequence": "7", "resumable": "true",
			"owner-epoch": "1", "signature-kid": token.KeyID(b.key.Public().(ed25519.PublicKey)), "signature": "AAAA"},
		BinaryData: map[string][]byte{"state": []byte(`{"step":1}`)},
	}))

	b.start()
	closed := closedOf(t, b, sid)
	if closed.FinalState != session.StateFailed {
		t.Fatalf("session_closed = %+v, want FAILED", closed)
	}
	got := b.waitState(sid, v1alpha1.SessionFailed, 10*time.Second)
	if got.Status.Error == nil || got.Status.Error.Code != codeCheckpointRejected {
		t.Fatalf("status.error = %+v, want code %s", got.Status.Error, codeCheckpointRejected)
	}
	b.waitEventOn("HCPSession", sid, EventCheckpointRejected, "failed verification")
	if n, _ := b.harness.Starts(sid); n != 0 {
		t.Fatalf("the harness was handed the forged task %d times", n)
	}
}

// TestSignedCheckpointResumesOnTakeover: the same takeover with the record
// a sidecar of this Callee saved resumes the session.
func TestSignedCheckpointResumesOnTakeover(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true})
	sid := b.orphan("vanished-pod", v1alpha1.SessionRunning, 7)
	b.saveCheckpoint(sid, orphanTask(t, sid, `{"steps":4,"step_ms":10,"checkpoint_every":1}`),
		checkpoint.Checkpoint{ID: "ckpt-002", Resumable: true, Sequence: 7, State: []byte(`{"step":2}`)})
	b.start()
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v, want COMPLETED", closed)
	}
	if n, _ := b.harness.Starts(sid); n != 1 {
		t.Fatalf("the harness started the session %d times, want 1", n)
	}
}

// TestLegacyCheckpointAcrossTheUpgrade: a session admitted by a release
// before signed records (no hcp.io/signed-checkpoints annotation) whose
// replica, still of that release, left an unsigned record: the record is
// accepted when its task carries the session token this Callee issued
// for the session, and refused (nothing runs) when it does not.
func TestLegacyCheckpointAcrossTheUpgrade(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true})
	legacyRecord := func(sid string, body []byte) {
		hs := b.hcpSession(sid)
		must(t, b.env.Client.Create(t.Context(), &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: checkpoint.Name(sid), Namespace: b.ns,
				Labels:          map[string]string{v1alpha1.LabelCalleeID: calleeID, v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HCPSession", Name: sid, UID: hs.UID}},
			},
			Data:       map[string]string{"task.json": string(body), "checkpoint-id": "ckpt-002", "sequence": "7", "resumable": "true"},
			BinaryData: map[string][]byte{"state": []byte(`{"step":2}`)},
		}))
	}
	withToken := func(sid string, inputs string) []byte {
		hs := b.hcpSession(sid)
		claims, err := sessionClaims(calleeID, hs)
		must(t, err)
		tok, err := token.Issue(b.key, claims)
		must(t, err)
		var ht harnessTask
		must(t, json.Unmarshal(orphanTask(t, sid, inputs), &ht))
		ht.SessionToken = tok
		body, err := json.Marshal(ht)
		must(t, err)
		return body
	}
	good := b.orphan("vanished-pod", v1alpha1.SessionRunning, 7)
	legacyRecord(good, withToken(good, `{"steps":4,"step_ms":10,"checkpoint_every":1}`))
	tokenless := b.orphan("vanished-pod", v1alpha1.SessionRunning, 7)
	legacyRecord(tokenless, orphanTask(t, tokenless, `{"steps":4,"step_ms":10}`))
	b.start()
	if closed := closedOf(t, b, good); closed.FinalState != session.StateCompleted {
		t.Fatalf("legacy record with its token: session_closed = %+v, want COMPLETED", closed)
	}
	if closed := closedOf(t, b, tokenless); closed.FinalState != session.StateFailed {
		t.Fatalf("legacy record without a token: session_closed = %+v, want FAILED", closed)
	}
	if n, _ := b.harness.Starts(tokenless); n != 0 {
		t.Fatalf("the harness was handed the unverified task %d times", n)
	}
}
