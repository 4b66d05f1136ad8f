package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// apiSource reads Secrets, ConfigMaps and Services from the API server with
// the node's credentials: the Node authorizer lets a node read exactly the
// Secrets and ConfigMaps its pods refer to.
type apiSource struct {
	cs kubernetes.Interface
}

func (s apiSource) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	return s.cs.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (s apiSource) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	return s.cs.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (s apiSource) Services(namespace string, serviceLinks bool) ([]*corev1.Service, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*corev1.Service
	if serviceLinks {
		list, err := s.cs.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			out = append(out, &list.Items[i])
		}
	}
	if namespace != metav1.NamespaceDefault || !serviceLinks {
		k, err := s.cs.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
		if err == nil {
			out = append(out, k)
		}
	}
	return out, nil
}

// tokenCache requests pod-bound service-account tokens through the
// TokenRequest API and renews them as the kubelet does: when 80% of their
// lifetime has passed, or after 24 hours.
type tokenCache struct {
	cs kubernetes.Interface
	mu sync.Mutex
	m  map[string]cachedToken
}

type cachedToken struct {
	token             string
	issued, expiresAt time.Time
}

func newTokenCache(cs kubernetes.Interface) *tokenCache {
	return &tokenCache{cs: cs, m: map[string]cachedToken{}}
}

func (c *tokenCache) Token(ctx context.Context, pod *corev1.Pod, audience string, expirationSeconds int64) (string, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	key := fmt.Sprintf("%s/%s/%s/%s/%d", pod.Namespace, pod.UID, sa, audience, expirationSeconds)
	now := time.Now()
	c.mu.Lock()
	t, ok := c.m[key]
	c.mu.Unlock()
	if ok && now.Before(t.issued.Add(t.expiresAt.Sub(t.issued)*8/10)) && now.Sub(t.issued) < 24*time.Hour {
		return t.token, nil
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &expirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if audience != "" {
		req.Spec.Audiences = []string{audience}
	}
	resp, err := c.cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenRequest for service account %s/%s: %w", pod.Namespace, sa, err)
	}
	c.mu.Lock()
	c.m[key] = cachedToken{token: resp.Status.Token, issued: now, expiresAt: resp.Status.ExpirationTimestamp.Time}
	c.mu.Unlock()
	return resp.Status.Token, nil
}

func (c *tokenCache) forget(uid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.m {
		if strings.Contains(k, "/"+uid+"/") {
			delete(c.m, k)
		}
	}
}
