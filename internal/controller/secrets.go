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

// ensureTokenKey applies a callee's token Secret. The key is generated only
// when the Secret has none: an existing key is never replaced (sessions in
// flight carry tokens signed with it).
func (c *core) ensureTokenKey(ctx context.Context, v view) (*corev1.Secret, error) {
	name := v.sub.TokenSecretName()
	existing := &corev1.Secret{}
	var priv, pub []byte
	switch err := c.Get(ctx, client.ObjectKey{Namespace: v.obj.GetNamespace(), Name: name}, existing); {
	case err == nil:
		priv, pub = existing.Data[resource.TokenPrivateKeyKey], existing.Data[resource.TokenPublicKeyKey]
	case !apierrors.IsNotFound(err):
		return nil, err
	default:
		// Not in the cache. The cache sees only labelled Secrets: make
		// sure an unlabelled one (labels removed by hand) is not replaced.
		if err := c.apiReader.Get(ctx, client.ObjectKey{Namespace: v.obj.GetNamespace(), Name: name}, existing); err == nil {
			priv, pub = existing.Data[resource.TokenPrivateKeyKey], existing.Data[resource.TokenPublicKeyKey]
		} else if !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	if len(priv) == 0 {
		pk, sk, err := token.GenerateKey()
		if err != nil {
			return nil, err
		}
		if priv, err = token.MarshalPrivateKeyPEM(sk); err != nil {
			return nil, err
		}
		if pub, err = token.MarshalPublicKeyPEM(pk); err != nil {
			return nil, err
		}
	} else if len(pub) == 0 {
		sk, err := token.ParsePrivateKeyPEM(priv)
		if err != nil {
			return nil, fmt.Errorf("token Secret %s: %w", name, err)
		}
		if pub, err = token.MarshalPublicKeyPEM(sk.Public().(ed25519.PublicKey)); err != nil {
			return nil, err
		}
	}
	live, err := c.apply(ctx, v.obj, resource.TokenSecret(v.sub, priv, pub))
	if err != nil {
		return nil, err
	}
	return live.(*corev1.Secret), nil
}
