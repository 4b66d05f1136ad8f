package callee

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// The token key is rotated while sessions run, the way the operator does
// it (resource.NextTokenKeys) and the kubelet delivers it (an atomic
// update of the mounted Secret): new sessions get tokens of the new key,
// a session accepted before the rotation can still be aborted with its
// token, and once its key is retired for good (two more rotations) that
// token is refused.
func TestTokenKeyRotationMidSession(t *testing.T) {
	dir := t.TempDir()
	gen := func() (ed25519.PrivateKey, error) { _, k, err := token.GenerateKey(); return k, err }
	var keys resource.TokenKeys
	rotate := func(to string) string {
		t.Helper()
		var err error
		keys, err = resource.NextTokenKeys(keys, to, gen)
		must(t, err)
		testbed.WriteSecretVolume(t, dir, map[string][]byte{
			resource.TokenPrivateKeyKey: keys.PrivatePEM, resource.TokenPublicKeyKey: keys.PublicPEM, resource.TokenVerifyKeysKey: keys.VerifyPEM,
		})
		pub, err := token.ParsePublicKeyPEM(keys.PublicPEM)
		must(t, err)
		return token.KeyID(pub)
	}
	kid0 := rotate("")
	b := newBed(t, bedOptions{keyDir: dir, sessions: v1alpha1.SessionsSpec{AbortTimeout: "PT2S"}})
	long := newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":300,"step_ms":100}`) })
	accept := func(what string) (string, task.TaskAccepted) {
		t.Helper()
		ts := *long
		_, sid, _ := b.submit(&ts)
		return sid, acceptedOf(t, b.waitMessage(sid, 20*time.Second, what, isType(envelope.TypeTaskAccepted)))
	}
	sidA, accA := accept("task_accepted before the rotation")
	sidB, accB := accept("a second one before the rotation")
	if got := kidOfToken(t, accA.SessionToken); got != kid0 {
		t.Fatalf("token kid %s, want the first key's %s", got, kid0)
	}

	kid1 := rotate("r1")
	time.Sleep(1200 * time.Millisecond) // the sidecar looks at its files at most once a second
	sidC, accC := accept("task_accepted after the rotation")
	if got := kidOfToken(t, accC.SessionToken); got != kid1 {
		t.Fatalf("a session accepted after the rotation has kid %s, want the new key's %s", got, kid1)
	}
	// The session accepted before the rotation is aborted with its token.
	b.abort(sidA, accA.SessionToken, "after rotation")
	if closed := closedOf(t, b, sidA); closed.FinalState != session.StateAborted {
		t.Fatalf("abort with a token of the retired key: session_closed %+v", closed)
	}

	// Two more rotations retire the first key for good.
	rotate("r2")
	rotate("r3")
	time.Sleep(1200 * time.Millisecond)
	b.abort(sidB, accB.SessionToken, "too late")
	time.Sleep(time.Second)
	if hs := b.hcpSession(sidB); hs.Spec.AbortRequested || hs.Status.State != v1alpha1.SessionRunning {
		t.Fatalf("a token of a key retired for good took effect: %+v", hs.Status)
	}
	// A kid kept by the set (r1) still works.
	b.abort(sidC, accC.SessionToken, "")
	if closed := closedOf(t, b, sidC); closed.FinalState != session.StateAborted {
		t.Fatalf("abort with a token of a retired key still kept: %+v", closed)
	}
	// Kubernetes can still abort it.
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"abortRequested":true}}`))
	must(t, b.env.Client.Patch(t.Context(), b.hcpSession(sidB), patch))
	closedOf(t, b, sidB)
}

func kidOfToken(t *testing.T, tok string) string {
	t.Helper()
	hdr, err := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[0])
	must(t, err)
	var h struct {
		Kid string `json:"kid"`
	}
	must(t, json.Unmarshal(hdr, &h))
	return h.Kid
}
