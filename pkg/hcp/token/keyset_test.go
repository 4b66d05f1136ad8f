package token

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// RFC 8037, appendix A.3: the thumbprint of the appendix A.2 public key.
func TestKeyIDIsTheRFC7638Thumbprint(t *testing.T) {
	x, err := base64.RawURLEncoding.DecodeString("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := KeyID(ed25519.PublicKey(x)), "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"; got != want {
		t.Fatalf("KeyID = %s, want %s", got, want)
	}
}

// A token signed before a rotation keeps verifying while its key is in the
// set, whatever key is current; once rotated out it is refused by name.
func TestVerifySetAcrossRotations(t *testing.T) {
	pub1, priv1 := mustKey(t)
	pub2, priv2 := mustKey(t)
	pub3, _ := mustKey(t)
	old, err := Issue(priv1, testClaims())
	if err != nil {
		t.Fatal(err)
	}
	fresh, _ := Issue(priv2, testClaims())
	set, _ := NewKeySet(pub1)
	set, err = set.Rotate(pub2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ids := set.IDs(); len(ids) != 2 || ids[0] != KeyID(pub2) || ids[1] != KeyID(pub1) {
		t.Fatalf("ids after rotation = %v", ids)
	}
	for name, tok := range map[string]string{"old": old, "fresh": fresh} {
		if _, err := VerifySet(set, tok, expect, t0); err != nil {
			t.Errorf("%s token: %v", name, err)
		}
	}
	set, _ = set.Rotate(pub3, 1) // pub1 retired for good
	if _, err := VerifySet(set, fresh, expect, t0); err != nil {
		t.Errorf("fresh token after the second rotation: %v", err)
	}
	_, err = VerifySet(set, old, expect, t0)
	if !errors.Is(err, ErrSignature) || !strings.Contains(err.Error(), KeyID(pub1)) {
		t.Errorf("token of a retired key: %v, want ErrSignature naming %s", err, KeyID(pub1))
	}
}

// Tokens issued before key ids carry no kid: any key of the set may verify
// them, and a wrong one alone does not.
func TestVerifySetTokenWithoutKid(t *testing.T) {
	pub1, priv1 := mustKey(t)
	pub2, _ := mustKey(t)
	w := &wireClaims{Issuer: "lab-cvd", Audience: "alpha", Subject: session, Capability: "cvd.grow", Risk: "R3",
		IssuedAt: t0.Unix(), ExpiresAt: t0.Add(time.Hour).Unix()}
	legacy, err := jwt.NewWithClaims(jwt.SigningMethodEdDSA, w).SignedString(priv1)
	if err != nil {
		t.Fatal(err)
	}
	both, _ := NewKeySet(pub2, pub1)
	if _, err := VerifySet(both, legacy, expect, t0); err != nil {
		t.Fatalf("legacy token with its key in second place: %v", err)
	}
	other, _ := NewKeySet(pub2)
	if _, err := VerifySet(other, legacy, expect, t0); !errors.Is(err, ErrSignature) {
		t.Fatalf("legacy token against a foreign key: %v", err)
	}
}

func TestVerifySetRejects(t *testing.T) {
	pub, priv := mustKey(t)
	set, _ := NewKeySet(pub)
	tok, _ := Issue(priv, testClaims())
	parts := strings.Split(tok, ".")
	hdr := func(h map[string]any) string {
		b, _ := json.Marshal(h)
		return base64.RawURLEncoding.EncodeToString(b) + "." + parts[1] + "." + parts[2]
	}
	for name, c := range map[string]struct {
		set  KeySet
		tok  string
		want error
	}{
		"empty set":        {KeySet{}, tok, ErrKey},
		"kid not a string": {set, hdr(map[string]any{"alg": "EdDSA", "kid": 7}), ErrMalformed},
		"empty kid":        {set, hdr(map[string]any{"alg": "EdDSA", "kid": ""}), ErrMalformed},
		"unknown kid":      {set, hdr(map[string]any{"alg": "EdDSA", "kid": "nope"}), ErrSignature},
		// The kid names the key, but the header was changed after signing.
		"kid of the right key, altered header": {set, hdr(map[string]any{"alg": "EdDSA", "kid": KeyID(pub)}), ErrSignature},
	} {
		if _, err := VerifySet(c.set, c.tok, expect, t0); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

func TestKeySetPEM(t *testing.T) {
	pub1, _ := mustKey(t)
	pub2, _ := mustKey(t)
	set, _ := NewKeySet(pub1, pub2, pub1)
	if set.Len() != 2 {
		t.Fatalf("duplicates not collapsed: %d keys", set.Len())
	}
	data, err := MarshalKeySetPEM(set)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseKeySetPEM(data)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(back.IDs(), ",") != strings.Join(set.IDs(), ",") {
		t.Fatalf("round trip: %v, want %v", back.IDs(), set.IDs())
	}
	for name, bad := range map[string][]byte{
		"empty":          nil,
		"garbage after":  append(append([]byte{}, data...), "junk"...),
		"a private key":  []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
		"not PEM at all": []byte("hello"),
	} {
		if _, err := ParseKeySetPEM(bad); !errors.Is(err, ErrKey) {
			t.Errorf("%s: %v, want ErrKey", name, err)
		}
	}
}

func TestRotateKeepsTheNewestRetiredKeys(t *testing.T) {
	var pubs []ed25519.PublicKey
	for range 5 {
		p, _ := mustKey(t)
		pubs = append(pubs, p)
	}
	set, _ := NewKeySet(pubs[0])
	for _, p := range pubs[1:] {
		set, _ = set.Rotate(p, 2)
	}
	want := []string{KeyID(pubs[4]), KeyID(pubs[3]), KeyID(pubs[2])}
	if got := set.IDs(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("ids = %v, want %v", got, want)
	}
	// Rotating to the current key again changes nothing.
	if again, _ := set.Rotate(pubs[4], 2); strings.Join(again.IDs(), ",") != strings.Join(want, ",") {
		t.Fatalf("rotate to current: %v", again.IDs())
	}
}
