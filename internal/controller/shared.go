package controller

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Shared per-vhost objects.
//
// The exchanges hcp.commands and hcp.events (and the vhost, when a user
// asks the operator to create it) belong to a (broker, vhost) pair, which
// Callees and Callers of several namespaces may use. The topology operator
// has no retain policy for exchanges: deleting an Exchange object deletes
// the exchange on the broker with all its bindings, and it deletes it
// whatever other finalizers the object carries. So the objects must not
// live where a tenant's namespace deletion would take them:
//
//   - they live in the shared topology's home, the operator's namespace
//     (operatorNamespace), one set per vhost key, owned by no one, and
//     reach the broker through the home's own copy of a connection Secret
//     (resource.SharedConnectionSecret) or the RabbitmqCluster itself;
//   - they are reference-counted by the Callees and Callers that hold an id
//     in the pair (the hcp.io/vhost-key label plus the topology finalizer):
//     a user's finalizer deletes them only when no other user is left,
//     counted on the API server, not the cache;
//   - shared objects that an earlier version kept in tenant namespaces are
//     adopted: their topology operator finalizer is removed and they are
//     deleted without the topology operator ever seeing a deletion, so the
//     broker's exchanges and vhost stay (orphanLegacy);
//   - if a shared Exchange object is deleted anyway while the pair is in
//     use, the remaining users re-create it and make the topology operator
//     declare exchanges and bindings again (annotationRedeclare).
//
// Without a known operator namespace (out of cluster, no POD_NAMESPACE, no
// namespaced default broker) each user's namespace is its own home, as in
// earlier versions, with their hazard (docs/operations.md, "Shared
// topology").
//
// The Vhost object's deletionPolicy is retain unless every user of the
// pair that asked for the vhost asked for delete.

// annotationOrphaned marks a legacy shared object the operator deletes
// without the topology operator: its deletion is no loss.
const annotationOrphaned = "hcp.io/orphaned"

// envPodNamespace names the operator's namespace (the downward API's
// metadata.namespace); in a pod the service account's namespace file
// gives it too.
const envPodNamespace = "POD_NAMESPACE"

const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

var inClusterNamespace = sync.OnceValue(func() string {
	b, err := os.ReadFile(serviceAccountNamespaceFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// operatorNamespace is the shared topology's home: $POD_NAMESPACE, else
// the namespace of the pod's service account, else the namespace of the
// default connection Secret (--default-connection-secret=NAMESPACE/NAME:
// the chart puts it in the release namespace). Empty when none is known.
func (c *core) operatorNamespace() string {
	if ns := strings.TrimSpace(os.Getenv(envPodNamespace)); ns != "" {
		return ns
	}
	if ns := inClusterNamespace(); ns != "" {
		return ns
	}
	if d := c.opts.DefaultBroker; d != nil {
		return d.Namespace
	}
	return ""
}

// home is where v's shared objects live, and whether it is the operator's
// namespace (dedicated) or, failing one, v's own.
func (c *core) home(v view) (string, bool) {
	if ns := c.operatorNamespace(); ns != "" {
		return ns, true
	}
	return v.obj.GetNamespace(), false
}

// sharedNamespaces are the namespaces where shared objects and their users
// may be: all (""), or the watched ones plus home.
func (c *core) sharedNamespaces(home string) []string {
	if len(c.opts.WatchNamespaces) == 0 {
		return []string{""}
	}
	nss := slices.Clone(c.opts.WatchNamespaces)
	if !slices.Contains(nss, home) {
		nss = append(nss, home)
	}
	return nss
}

// readThrough reads from the API server and writes through the client: for
// a home namespace outside the manager's cache (--watch-namespaces).
type readThrough struct {
	client.Client
	r client.Reader
}

func (x readThrough) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return x.r.Get(ctx, key, obj, opts...)
}

func (x readThrough) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return x.r.List(ctx, list, opts...)
}

// in returns the core to use for objects in namespace ns: c itself when the
// cache holds ns, else one reading around the cache.
func (c *core) in(ns string) *core {
	if len(c.opts.WatchNamespaces) == 0 || slices.Contains(c.opts.WatchNamespaces, ns) {
		return c
	}
	cc := *c
	cc.Client = readThrough{Client: c.Client, r: c.apiReader}
	return &cc
}
