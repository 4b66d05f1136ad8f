package kubectlhcp

import (
	"context"
	"fmt"
	"slices"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// Scheme holds the types the plugin reads: core Kubernetes, CRDs, the
// topology operator's and hcp.io's.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, topologyv1beta1.AddToScheme, hcpv1alpha1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// sessionStates are the valid values of --state.
var sessionStates = []hcpv1alpha1.SessionState{
	hcpv1alpha1.SessionPending, hcpv1alpha1.SessionRunning, hcpv1alpha1.SessionPaused, hcpv1alpha1.SessionAborting,
	hcpv1alpha1.SessionAborted, hcpv1alpha1.SessionCompleted, hcpv1alpha1.SessionFailed, hcpv1alpha1.SessionRejected,
}

// parseStates parses --state: comma-separated L2 states, any case.
func parseStates(s string) ([]hcpv1alpha1.SessionState, error) {
	if s == "" {
		return nil, nil
	}
	var out []hcpv1alpha1.SessionState
	for _, p := range strings.Split(s, ",") {
		st := hcpv1alpha1.SessionState(strings.ToUpper(strings.TrimSpace(p)))
		if !slices.Contains(sessionStates, st) {
			names := make([]string, len(sessionStates))
			for i, x := range sessionStates {
				names[i] = string(x)
			}
			return nil, fmt.Errorf("--state %q: not a session state (want one or more of %s, comma-separated)", p, strings.Join(names, ", "))
		}
		out = append(out, st)
	}
	return out, nil
}

// stateOf is the session's decided state; a session without one is PENDING
// (an undecided claim).
func stateOf(hs *hcpv1alpha1.HCPSession) hcpv1alpha1.SessionState {
	if st := hs.DecidedState(); st != "" {
		return st
	}
	return hcpv1alpha1.SessionPending
}

// getSession reads the session named name in ns; a name that is not a
// session's is taken as the prefix of one (session names are UUIDs), as
// long as it is unambiguous.
func getSession(ctx context.Context, c client.Reader, ns, name string) (*hcpv1alpha1.HCPSession, error) {
	if name == "" {
		return nil, fmt.Errorf("no session named: give an HCPSession name (kubectl hcp sessions lists them)")
	}
	hs := &hcpv1alpha1.HCPSession{}
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, hs)
	if err == nil {
		return hs, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, apiError("reading HCPSession "+name, err)
	}
	var list hcpv1alpha1.HCPSessionList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, apiError("listing HCPSessions", err)
	}
	var matches []*hcpv1alpha1.HCPSession
	for i := range list.Items {
		if strings.HasPrefix(list.Items[i].Name, name) {
			matches = append(matches, &list.Items[i])
		}
	}
	switch len(matches) {
	case 1:
		return matches[0], nil
	case 0:
		return nil, fmt.Errorf("HCPSession %q not found in namespace %s (kubectl hcp sessions -n %s lists them; -n selects another namespace)", name, ns, ns)
	default:
		names := make([]string, 0, len(matches))
		for _, m := range matches {
			names = append(names, m.Name)
		}
		return nil, fmt.Errorf("%q is the prefix of %d HCPSessions in namespace %s: %s; give more of the name", name, len(matches), ns, strings.Join(names, ", "))
	}
}

// apiError wraps an API error with what was being done, and a hint for the
// usual causes.
func apiError(doing string, err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %w (your user lacks the RBAC permission; see docs/rbac.md)", doing, err)
	case isNoKind(err):
		return fmt.Errorf("%s: %w (are the hcp-operator CRDs installed? kubectl hcp doctor checks)", doing, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

func isNoKind(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "no matches for kind") || strings.Contains(err.Error(), "the server could not find the requested resource"))
}
