package callee

import (
	"crypto/ed25519"
	"fmt"

	"github.com/go-logr/logr"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/secretfile"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// tokenKeys are the callee's session-token keys: the one it signs with
// and the ones it accepts on abort tokens. Both follow the mounted token
// Secret, so a rotation (docs/security.md) takes effect without a restart:
// new tokens carry the new key's kid, and tokens of running sessions,
// signed with a retired key still in the set, keep verifying.
type tokenKeys struct {
	signing *secretfile.File[ed25519.PrivateKey]
	// verify is nil when only the signing key is accepted.
	verify *secretfile.File[token.KeySet]
}

// loadTokenKeys builds the keys from Options: SigningKey (tests), the key
// file (pods) or the PEM in the environment (local runs).
func loadTokenKeys(o Options, log logr.Logger) (tokenKeys, error) {
	if o.SigningKey != nil {
		return tokenKeys{signing: secretfile.Static(o.SigningKey)}, nil
	}
	c := o.Config
	if c.TokenKeyFile == "" {
		k, err := token.ParsePrivateKeyPEM([]byte(c.TokenKeyPEM))
		if err != nil {
			return tokenKeys{}, fmt.Errorf("%s: %w", config.EnvTokenKey, err)
		}
		return tokenKeys{signing: secretfile.Static(k)}, nil
	}
	onError := func(err error) {
		log.Error(err, "The rotated token key file is unusable; keeping the previous keys")
	}
	var k tokenKeys
	var err error
	k.signing, err = secretfile.Load(c.TokenKeyFile, token.ParsePrivateKeyPEM, secretfile.Options[ed25519.PrivateKey]{
		OnError: onError,
		OnChange: func(p ed25519.PrivateKey) {
			log.Info("The session-token signing key changed; new tokens are signed with it", "kid", token.KeyID(p.Public().(ed25519.PublicKey)))
		},
	})
	if err != nil {
		return tokenKeys{}, fmt.Errorf("%s: %w", config.EnvTokenKeyFile, err)
	}
	if c.TokenVerifyKeysFile != "" {
		k.verify, err = secretfile.Load(c.TokenVerifyKeysFile, token.ParseKeySetPEM, secretfile.Options[token.KeySet]{
			OnError: onError,
			OnChange: func(s token.KeySet) {
				log.Info("The accepted session-token keys changed", "kids", s.IDs())
			},
		})
		if err != nil {
			return tokenKeys{}, fmt.Errorf("%s: %w", config.EnvTokenVerifyKeysFile, err)
		}
	}
	return k, nil
}

// signer is the key new tokens are signed with.
func (k tokenKeys) signer() ed25519.PrivateKey { return k.signing.Get() }

// verifiers are the keys accepted on a token: the signing key's and, when
// configured, the key set (the current key and the retired ones kept).
// Both files hold only parsed, well-sized keys, so the set is never empty.
func (k tokenKeys) verifiers() token.KeySet {
	pubs := []ed25519.PublicKey{k.signing.Get().Public().(ed25519.PublicKey)}
	if k.verify != nil {
		pubs = append(pubs, k.verify.Get().Keys()...)
	}
	set, _ := token.NewKeySet(pubs...)
	return set
}
