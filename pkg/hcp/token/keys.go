package token

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
)

// PEM block types.
const (
	pemPrivateKey = "PRIVATE KEY" // PKCS #8
	pemPublicKey  = "PUBLIC KEY"  // PKIX SubjectPublicKeyInfo
)

// GenerateKey returns a new Ed25519 key pair from crypto/rand.
func GenerateKey() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate Ed25519 key: %w", err)
	}
	return pub, priv, nil
}

// MarshalPrivateKeyPEM encodes priv as a PKCS #8 "PRIVATE KEY" PEM block.
func MarshalPrivateKeyPEM(priv ed25519.PrivateKey) ([]byte, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%w: private key is %d bytes, want %d", ErrKey, len(priv), ed25519.PrivateKeySize)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// ParsePrivateKeyPEM decodes a PKCS #8 "PRIVATE KEY" PEM block holding an
// Ed25519 key. Other key types and trailing data are rejected.
func ParsePrivateKeyPEM(data []byte) (ed25519.PrivateKey, error) {
	der, err := decodePEM(data, pemPrivateKey)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKey, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%w: PEM holds a %T, want Ed25519", ErrKey, k)
	}
	return priv, nil
}

// MarshalPublicKeyPEM encodes pub as a PKIX "PUBLIC KEY" PEM block.
func MarshalPublicKeyPEM(pub ed25519.PublicKey) ([]byte, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: public key is %d bytes, want %d", ErrKey, len(pub), ed25519.PublicKeySize)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("marshal public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPublicKey, Bytes: der}), nil
}

// ParsePublicKeyPEM decodes a PKIX "PUBLIC KEY" PEM block holding an
// Ed25519 key. Other key types and trailing data are rejected.
func ParsePublicKeyPEM(data []byte) (ed25519.PublicKey, error) {
	der, err := decodePEM(data, pemPublicKey)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKey, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%w: PEM holds a %T, want Ed25519", ErrKey, k)
	}
	return pub, nil
}

func decodePEM(data []byte, typ string) ([]byte, error) {
	b, rest := pem.Decode(data)
	if b == nil {
		return nil, fmt.Errorf("%w: no PEM block", ErrKey)
	}
	if b.Type != typ {
		return nil, fmt.Errorf("%w: PEM block is %q, want %q", ErrKey, b.Type, typ)
	}
	if len(b.Headers) > 0 {
		return nil, fmt.Errorf("%w: encrypted or annotated PEM blocks are not supported", ErrKey)
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, fmt.Errorf("%w: data after the PEM block", ErrKey)
	}
	return b.Bytes, nil
}
