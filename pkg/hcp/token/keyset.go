package token

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"strings"
)

// KeyID is the key id (the JWS "kid" header) of an Ed25519 public key: its
// RFC 7638 JWK thumbprint, the base64url SHA-256 of
// {"crv":"Ed25519","kty":"OKP","x":"<key>"}. Anyone holding the public key
// computes the same id, so a verifier needs nothing but the keys.
func KeyID(pub ed25519.PublicKey) string {
	jwk := `{"crv":"Ed25519","kty":"OKP","x":"` + base64.RawURLEncoding.EncodeToString(pub) + `"}`
	sum := sha256.Sum256([]byte(jwk))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// KeySet is the set of public keys a verifier accepts: the current signing
// key's and the keys retired by rotations whose tokens may still be in
// flight. The zero value accepts nothing.
type KeySet struct {
	ids  []string // in the order given: current first
	keys map[string]ed25519.PublicKey
}

// NewKeySet returns the set of pubs (duplicates collapse).
func NewKeySet(pubs ...ed25519.PublicKey) (KeySet, error) {
	s := KeySet{keys: make(map[string]ed25519.PublicKey, len(pubs))}
	for i, p := range pubs {
		if len(p) != ed25519.PublicKeySize {
			return KeySet{}, fmt.Errorf("%w: key %d is %d bytes, want %d", ErrKey, i+1, len(p), ed25519.PublicKeySize)
		}
		id := KeyID(p)
		if _, dup := s.keys[id]; dup {
			continue
		}
		s.ids = append(s.ids, id)
		s.keys[id] = p
	}
	return s, nil
}

// IDs are the key ids, current first.
func (s KeySet) IDs() []string { return append([]string(nil), s.ids...) }

// Len is the number of keys.
func (s KeySet) Len() int { return len(s.ids) }

// Keys are the public keys, current first.
func (s KeySet) Keys() []ed25519.PublicKey {
	out := make([]ed25519.PublicKey, len(s.ids))
	for i, id := range s.ids {
		out[i] = s.keys[id]
	}
	return out
}

// lookup returns the key with id kid, or, for a token without kid (issued
// before key ids), every key.
func (s KeySet) lookup(kid string) ([]ed25519.PublicKey, error) {
	if kid == "" {
		return s.Keys(), nil
	}
	if k, ok := s.keys[kid]; ok {
		return []ed25519.PublicKey{k}, nil
	}
	return nil, fmt.Errorf("%w: signed with key %q, which is not among the %d accepted keys (%s)", ErrSignature, kid, len(s.ids), strings.Join(s.ids, ", "))
}

// MarshalKeySetPEM encodes the keys as consecutive "PUBLIC KEY" PEM blocks,
// current first.
func MarshalKeySetPEM(s KeySet) ([]byte, error) {
	var b bytes.Buffer
	for _, k := range s.Keys() {
		p, err := MarshalPublicKeyPEM(k)
		if err != nil {
			return nil, err
		}
		b.Write(p)
	}
	return b.Bytes(), nil
}

// ParseKeySetPEM decodes one or more consecutive "PUBLIC KEY" PEM blocks
// holding Ed25519 keys, the first being the current key.
func ParseKeySetPEM(data []byte) (KeySet, error) {
	var pubs []ed25519.PublicKey
	rest := bytes.TrimSpace(data)
	for len(rest) > 0 {
		b, r := pem.Decode(rest)
		if b == nil {
			return KeySet{}, fmt.Errorf("%w: key set: data that is not a PEM block after key %d", ErrKey, len(pubs))
		}
		p, err := ParsePublicKeyPEM(pem.EncodeToMemory(b))
		if err != nil {
			return KeySet{}, fmt.Errorf("key set, key %d: %w", len(pubs)+1, err)
		}
		pubs = append(pubs, p)
		rest = bytes.TrimSpace(r)
	}
	if len(pubs) == 0 {
		return KeySet{}, fmt.Errorf("%w: key set: no PEM block", ErrKey)
	}
	return NewKeySet(pubs...)
}

// Rotate returns the key set after a rotation to next: next first, then
// the keys of s, keeping at most keep retired keys (the newest ones).
func (s KeySet) Rotate(next ed25519.PublicKey, keep int) (KeySet, error) {
	pubs := []ed25519.PublicKey{next}
	for _, k := range s.Keys() {
		if len(pubs) > keep {
			break
		}
		if !k.Equal(next) {
			pubs = append(pubs, k)
		}
	}
	return NewKeySet(pubs...)
}
