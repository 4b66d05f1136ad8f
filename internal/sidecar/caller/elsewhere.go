package caller

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// Sessions of Callees in other namespaces. Their HCPSessions live in the
// Callee's namespace, where the operator lets this sidecar's
// ServiceAccount get HCPSessions by name, and nothing else: a Role in each
// namespace its Caller's status.sessionNamespaces lists (the namespaces
// whose CapabilityPolicies name the caller; internal/controller,
// caller_grants.go). A new pod verifies such a session there (stream seed).

// findElsewhere reads the HCPSession sid in each namespace of the Caller's
// status.sessionNamespaces but the sidecar's own, one GET by name each,
// through the uncached Reader (the cache is scoped to the sidecar's
// namespace), or Client without one. It returns the first one found; the
// caller of it checks whom it names (adopt). It returns errAbsent only when
// every namespace answered NotFound (none listed: none to look in); a
// Forbidden answer (a grant not applied yet, or revoked a moment ago), an
// API error or a Caller it cannot read say nothing, and are returned: the
// session then stays held until one of them answers.
func (s *Sidecar) findElsewhere(ctx context.Context, sid string) (*v1alpha1.HCPSession, error) {
	r := s.o.Reader
	if r == nil {
		r = s.o.Client
	}
	if r == nil {
		return nil, errAbsent
	}
	namespaces, err := s.sessionNamespaces(ctx, r)
	if err != nil {
		return nil, err
	}
	var failure error
	for _, ns := range namespaces {
		if ns == s.cfg.Namespace {
			continue
		}
		var hs v1alpha1.HCPSession
		switch err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: sid}, &hs); {
		case err == nil:
			return &hs, nil
		case apierrors.IsNotFound(err):
		default:
			failure = errors.Join(failure, fmt.Errorf("namespace %s: %w", ns, err))
		}
	}
	if failure != nil {
		return nil, failure
	}
	return nil, fmt.Errorf("%w in namespaces %v", errAbsent, namespaces)
}

// sessionNamespaces reads status.sessionNamespaces of the sidecar's Caller
// from the API server (r): a namespace granted a moment ago counts. A
// Caller the API server does not have grants nothing.
func (s *Sidecar) sessionNamespaces(ctx context.Context, r client.Reader) ([]string, error) {
	key := types.NamespacedName{Namespace: s.cfg.Namespace, Name: s.cfg.ObjectName}
	var c v1alpha1.Caller
	switch err := r.Get(ctx, key, &c); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading Caller %s: %w", key, err)
	}
	return c.Status.SessionNamespaces, nil
}
