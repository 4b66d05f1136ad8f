package token

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"reflect"
	"testing"
)

// realPEMs are the PEM files the operator writes (the signing key, the
// verify key set after two rotations) and their neighbours a mistake could
// mount instead: another key type, a private key where a public one
// belongs, an encrypted-style block, a key set with a torn last block.
func realPEMs(tb testing.TB) (sets, singles [][]byte) {
	tb.Helper()
	var pubs []ed25519.PublicKey
	var privPEM []byte
	for i := byte(1); i <= 3; i++ {
		priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{i}, ed25519.SeedSize))
		pubs = append(pubs, priv.Public().(ed25519.PublicKey))
		if i == 1 {
			var err error
			if privPEM, err = MarshalPrivateKeyPEM(priv); err != nil {
				tb.Fatal(err)
			}
		}
	}
	set, err := NewKeySet(pubs...)
	if err != nil {
		tb.Fatal(err)
	}
	setPEM, err := MarshalKeySetPEM(set)
	if err != nil {
		tb.Fatal(err)
	}
	onePEM, err := MarshalPublicKeyPEM(pubs[0])
	if err != nil {
		tb.Fatal(err)
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), bytes.NewReader(bytes.Repeat([]byte{7}, 256)))
	if err != nil {
		tb.Fatal(err)
	}
	ecDER, err := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	if err != nil {
		tb.Fatal(err)
	}
	ecPEM := pem.EncodeToMemory(&pem.Block{Type: pemPublicKey, Bytes: ecDER})
	headered := pem.EncodeToMemory(&pem.Block{Type: pemPublicKey, Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: ecDER})
	sets = [][]byte{setPEM, onePEM, append(bytes.Clone(onePEM), onePEM...), append(bytes.Clone(setPEM), ecPEM...),
		append(bytes.Clone(setPEM), privPEM...), setPEM[:len(setPEM)-20], append([]byte("\n\n"), headered...)}
	singles = [][]byte{privPEM, onePEM, ecPEM, headered, append(bytes.Clone(onePEM), "trailing"...)}
	return sets, singles
}

// FuzzParseKeySetPEM: the verify-keys file (the Secret the callee sidecar
// follows). Any content parses without a panic; a refusal is ErrKey; an
// accepted set holds at least one 32-byte key under its RFC 7638 id, and
// marshals to a file that parses to the same set and marshals identically.
func FuzzParseKeySetPEM(f *testing.F) {
	sets, singles := realPEMs(f)
	for _, b := range append(sets, singles...) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ks, err := ParseKeySetPEM(data)
		if err != nil {
			if !errors.Is(err, ErrKey) {
				t.Fatalf("refusal is not ErrKey: %v", err)
			}
			return
		}
		if ks.Len() < 1 {
			t.Fatal("accepted an empty key set")
		}
		for i, k := range ks.Keys() {
			if len(k) != ed25519.PublicKeySize || ks.IDs()[i] != KeyID(k) {
				t.Fatalf("key %d: %d bytes, id %q", i, len(k), ks.IDs()[i])
			}
		}
		out, err := MarshalKeySetPEM(ks)
		if err != nil {
			t.Fatalf("marshal an accepted set: %v", err)
		}
		back, err := ParseKeySetPEM(out)
		if err != nil || !reflect.DeepEqual(back.IDs(), ks.IDs()) || !reflect.DeepEqual(back.Keys(), ks.Keys()) {
			t.Fatalf("round trip: %v", err)
		}
		if again, _ := MarshalKeySetPEM(back); !bytes.Equal(again, out) {
			t.Fatal("marshalling is not stable")
		}
	})
}

// FuzzParseKeyPEM: the signing key file and a single public key. Any
// content parses without a panic; a refusal is ErrKey; an accepted key
// round-trips through its marshaller, and an accepted
// private key's public half parses as the public key it marshals to.
func FuzzParseKeyPEM(f *testing.F) {
	sets, singles := realPEMs(f)
	for _, b := range append(singles, sets...) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if priv, err := ParsePrivateKeyPEM(data); err != nil {
			if !errors.Is(err, ErrKey) {
				t.Fatalf("private key refusal is not ErrKey: %v", err)
			}
		} else {
			out, err := MarshalPrivateKeyPEM(priv)
			if err != nil {
				t.Fatalf("marshal an accepted private key: %v", err)
			}
			back, err := ParsePrivateKeyPEM(out)
			if err != nil || !back.Equal(priv) {
				t.Fatalf("private key round trip: %v", err)
			}
			pubPEM, err := MarshalPublicKeyPEM(priv.Public().(ed25519.PublicKey))
			if err != nil {
				t.Fatal(err)
			}
			if pub, err := ParsePublicKeyPEM(pubPEM); err != nil || !pub.Equal(priv.Public()) {
				t.Fatalf("public half: %v", err)
			}
		}
		if pub, err := ParsePublicKeyPEM(data); err != nil {
			if !errors.Is(err, ErrKey) {
				t.Fatalf("public key refusal is not ErrKey: %v", err)
			}
		} else {
			out, err := MarshalPublicKeyPEM(pub)
			if err != nil {
				t.Fatalf("marshal an accepted public key: %v", err)
			}
			if back, err := ParsePublicKeyPEM(out); err != nil || !back.Equal(pub) {
				t.Fatalf("public key round trip: %v", err)
			}
		}
	})
}
