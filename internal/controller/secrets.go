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
)

// randomPassword is 192 random bits, URL-safe.
func randomPassword() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// ensureCredentials applies the credentials Secret. The password is
// generated once and kept; username, vhost and uri follow the spec and the
// broker (the uri's host may change with the connection Secret).
func (c *core) ensureCredentials(ctx context.Context, v view, b resource.Broker) (*corev1.Secret, error) {
	name := v.sub.CredentialsSecretName()
	existing := &corev1.Secret{}
	password := ""
	switch err := c.Get(ctx, client.ObjectKey{Namespace: v.obj.GetNamespace(), Name: name}, existing); {
	case err == nil:
		password = string(existing.Data[resource.CredentialsPasswordKey])
	case !apierrors.IsNotFound(err):
		return nil, err
	}
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
	live, err := c.apply(ctx, v.obj, desired)
	if err != nil {
		return nil, err
	}
	return live.(*corev1.Secret), nil
}

// ensureTokenKey applies a callee's token Secret (resource.NextTokenKeys:
// a key is generated only when there is none or the Callee asks for a
// rotation with resource.AnnotationRotateTokenKey).
func (c *core) ensureTokenKey(ctx context.Context, v view) (*corev1.Secret, error) {
	name := v.sub.TokenSecretName()
	existing := &corev1.Secret{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: v.obj.GetNamespace(), Name: name}, existing); {
	case err == nil:
	case !apierrors.IsNotFound(err):
		return nil, err
	default:
		// Not in the cache. The cache sees only labelled Secrets: make
		// sure an unlabelled one (labels removed by hand) is not replaced.
		if err := c.apiReader.Get(ctx, client.ObjectKey{Namespace: v.obj.GetNamespace(), Name: name}, existing); err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	have := resource.TokenKeys{ // all empty when there is no Secret yet
		PrivatePEM: existing.Data[resource.TokenPrivateKeyKey],
		PublicPEM:  existing.Data[resource.TokenPublicKeyKey],
		VerifyPEM:  existing.Data[resource.TokenVerifyKeysKey],
		Rotation:   existing.Annotations[hcpv1alpha1.AnnotationTokenKeyRotation],
	}
	keys, err := resource.NextTokenKeys(have, v.obj.GetAnnotations()[hcpv1alpha1.AnnotationRotateTokenKey], func() (ed25519.PrivateKey, error) {
		_, sk, err := token.GenerateKey()
		return sk, err
	})
	if err != nil {
		return nil, fmt.Errorf("token Secret %s: %w", name, err)
	}
	live, err := c.apply(ctx, v.obj, resource.TokenSecret(v.sub, keys))
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

// reasonTokenKeyRotated is the Event a callee's token key rotation records.
const reasonTokenKeyRotated = "TokenKeyRotated"
