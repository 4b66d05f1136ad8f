package checkpoint

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// ErrUnverified: the object under a session's record name is not a record
// this Callee saved for this session (forged, altered, bound to another
// session or Callee, signed by an unknown key, or written by a sidecar of
// a release before records were signed). Nothing in it may be used.
var ErrUnverified = errors.New("the checkpoint failed verification")

// LegacyError is returned (matching ErrUnverified) for a record in the
// format of a release before records were signed: no signature, decision
// or epoch, but labelled for this Callee's id and owned by the session's
// HCPSession. Record is its content, unverified: the caller may accept it
// only after checks of its own (the callee sidecar verifies the session
// token in the task, and only for sessions created before signing).
type LegacyError struct{ Record *Record }

func (e *LegacyError) Error() string {
	return ErrUnverified.Error() + ": it is unsigned (saved by a sidecar of an earlier release)"
}

func (e *LegacyError) Unwrap() error { return ErrUnverified }

// legacy reports whether cm has the format of an unsigned record.
func legacy(cm *corev1.ConfigMap) bool {
	for _, k := range []string{keySignature, keyKeyID, keyDecision, keyEpoch} {
		if _, ok := cm.Data[k]; ok {
			return false
		}
	}
	_, labelled := cm.Labels[v1alpha1.LabelCallee]
	return !labelled
}

// Decision is what the L3 gate admitted a session with, as its HCPSession
// records it (spec) and as the harness task carries it.
type Decision struct {
	CallerID   string `json:"caller_id"`
	Capability string `json:"capability"`
	Risk       string `json:"risk_level"`
	DataClass  string `json:"data_classification"`
	// MaxDuration is ISO 8601, as task.FormatDuration writes it.
	MaxDuration string `json:"max_duration"`
}

func (d Decision) encode() (string, error) {
	b, err := json.Marshal(d)
	return string(b), err
}

func decodeDecision(s string) (Decision, error) {
	var d Decision
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return Decision{}, fmt.Errorf("bad decision record: %w", err)
	}
	return d, nil
}

// signDomain separates these signatures from every other use of the key
// (session tokens are JWS over a different input).
const signDomain = "hcp.io/session-checkpoint/v1"

// message is what the signature covers: the binding (namespace, session
// name and UID, Callee id and name) as the verifier expects it, and every
// stored field, each length-prefixed, hashed with SHA-256 (the state is up
// to MaxState bytes).
func (s *Store) message(cm *corev1.ConfigMap, session string, uid types.UID) []byte {
	h := sha256.New()
	field := func(h hash.Hash, v []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(v)))
		h.Write(n[:])
		h.Write(v)
	}
	field(h, []byte(signDomain))
	for _, v := range []string{s.Namespace, session, string(uid), s.CalleeID, s.CalleeName, cm.Data[keyKeyID],
		cm.Data[keyEpoch], cm.Data[keyDecision], cm.Data[keyTask],
		cm.Data[keyID], cm.Data[keyDesc], cm.Data[keyResumable], cm.Data[keySequence], cm.Data[keyCreatedAt]} {
		field(h, []byte(v))
	}
	field(h, cm.BinaryData[keyState])
	return h.Sum(nil)
}

// sign is the base64 Ed25519 signature of msg.
func sign(k ed25519.PrivateKey, msg []byte) string {
	return base64.StdEncoding.EncodeToString(ed25519.Sign(k, msg))
}

// verify checks that cm is a record of this Callee for session o, signed
// with one of the accepted keys, and decodes it.
func (s *Store) verify(cm *corev1.ConfigMap, o Owner) (*Record, error) {
	if legacy(cm) && cm.Labels[v1alpha1.LabelCalleeID] == s.CalleeID && len(cm.OwnerReferences) == 1 &&
		cm.OwnerReferences[0].Kind == kindHCPSession && cm.OwnerReferences[0].UID == o.UID {
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[keyEpoch], cm.Data[keyDecision] = "0", "{}"
		rec, err := decode(cm)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnverified, err)
		}
		return nil, &LegacyError{Record: rec}
	}
	if c, id := cm.Labels[v1alpha1.LabelCallee], cm.Labels[v1alpha1.LabelCalleeID]; c != s.CalleeName || id != s.CalleeID {
		return nil, fmt.Errorf("%w: it is labelled for Callee %q (id %q), not %q (id %q)", ErrUnverified, c, id, s.CalleeName, s.CalleeID)
	}
	if refs := cm.OwnerReferences; len(refs) != 1 || refs[0].Kind != kindHCPSession || refs[0].Name != o.Name || refs[0].UID != o.UID ||
		!strings.HasPrefix(refs[0].APIVersion, v1alpha1.GroupVersion.Group+"/") {
		return nil, fmt.Errorf("%w: its owner references %s are not exactly HCPSession %s (uid %s)", ErrUnverified, ownersOf(cm), o.Name, o.UID)
	}
	kid := cm.Data[keyKeyID]
	var pub ed25519.PublicKey
	set := s.Verifiers()
	for _, k := range set.Keys() {
		if token.KeyID(k) == kid {
			pub = k
		}
	}
	if pub == nil {
		return nil, fmt.Errorf("%w: it is not signed with an accepted key of Callee %s (key id %q; accepted: %s)",
			ErrUnverified, s.CalleeName, kid, strings.Join(set.IDs(), ", "))
	}
	sig, err := base64.StdEncoding.DecodeString(cm.Data[keySignature])
	if err != nil || !ed25519.Verify(pub, s.message(cm, o.Name, o.UID), sig) {
		return nil, fmt.Errorf("%w: its signature does not match its content and binding", ErrUnverified)
	}
	rec, err := decode(cm)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnverified, err)
	}
	if rec.Decision != o.Decision {
		return nil, fmt.Errorf("%w: it was saved for a gate decision %+v, but the HCPSession records %+v", ErrUnverified, rec.Decision, o.Decision)
	}
	return rec, nil
}

func ownersOf(cm *corev1.ConfigMap) string {
	out := make([]string, 0, len(cm.OwnerReferences))
	for _, r := range cm.OwnerReferences {
		out = append(out, fmt.Sprintf("%s/%s %s (uid %s)", r.APIVersion, r.Kind, r.Name, r.UID))
	}
	if len(out) == 0 {
		return "(none)"
	}
	return "[" + strings.Join(out, ", ") + "]"
}
