package controller

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// randomPassword is 192 random bits, URL-safe.
func randomPassword() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// ensureCredentials applies the credentials Secret, with a callee's token
// keys (resource.WithTokenKeys). The password is generated once and kept;
// username, vhost and uri follow the spec and the broker (the uri's host
// may change with the connection Secret). Token keys: see nextTokenKeys.
func (c *core) ensureCredentials(ctx context.Context, v view, b resource.Broker) (*corev1.Secret, error) {
	name := v.sub.CredentialsSecretName()
	existing := &corev1.Secret{}
	found := true
	switch err := c.Get(ctx, client.ObjectKey{Namespace: v.obj.GetNamespace(), Name: name}, existing); {
	case err == nil:
	case !apierrors.IsNotFound(err):
		return nil, err
	case v.sub.Role == topology.RoleCallee:
		// Not in the cache. The cache sees only labelled Secrets: make
		// sure the token key of an unlabelled one (labels removed by
		// hand) is not replaced; sessions in flight carry tokens signed
		// with it.
		if err := c.apiReader.Get(ctx, client.ObjectKey{Namespace: v.obj.GetNamespace(), Name: name}, existing); err != nil {
			if !apierrors.IsNotFound(err) {
				return nil, err
			}
			found = false
		}
	default:
		found = false
	}
	password := string(existing.Data[resource.CredentialsPasswordKey])
	if password == "" {
		var err error
		if password, err = randomPassword(); err != nil {
			return nil, err
		}
	}
	desired, err := resource.CredentialsSecret(v.sub, b, password)
	if err != nil {
		return nil, fmt.Errorf("credentials Secret: %w", err)
	}
	var have, keys resource.TokenKeys
	if v.sub.Role == topology.RoleCallee {
		if !found {
			existing = nil
		}
		if have, keys, err = c.nextTokenKeys(ctx, v, existing); err != nil {
			return nil, fmt.Errorf("credentials Secret %s: token keys: %w", name, err)
		}
		resource.WithTokenKeys(desired, keys)
	}
	live, err := c.apply(ctx, v.obj, desired)
	if err != nil {
		return nil, err
	}
	if len(have.PrivatePEM) > 0 && keys.Rotation != have.Rotation {
		c.recorder.Eventf(v.obj, live, corev1.EventTypeNormal, reasonTokenKeyRotated, "Rotate",
			"Rotated the session-token signing key in Secret %s (%s %s); tokens signed with the retired key verify until they expire",
			name, hcpv1alpha1.AnnotationRotateTokenKey, keys.Rotation)
	}
	return live.(*corev1.Secret), nil
}

// nextTokenKeys decides a callee's token keys (resource.NextTokenKeys: a
// key is generated only when there is none or the Callee asks for a
// rotation with hcpv1alpha1.AnnotationRotateTokenKey) from what its
// credentials Secret creds holds (nil: none yet) or, when that holds none,
// what the Secret of an earlier version holds (adoptLegacyTokenKeys). It
// returns what was there and what is to be.
func (c *core) nextTokenKeys(ctx context.Context, v view, creds *corev1.Secret) (have, next resource.TokenKeys, err error) {
	have = resource.TokenKeysOf(creds)
	if len(have.PrivatePEM) == 0 {
		if have, err = c.adoptLegacyTokenKeys(ctx, v); err != nil {
			return have, next, err
		}
	}
	next, err = resource.NextTokenKeys(have, v.obj.GetAnnotations()[hcpv1alpha1.AnnotationRotateTokenKey], func() (ed25519.PrivateKey, error) {
		_, sk, err := token.GenerateKey()
		return sk, err
	})
	return have, next, err
}

// reasonTokenKeyRotated is the Event a callee's token key rotation records.
const reasonTokenKeyRotated = "TokenKeyRotated"
