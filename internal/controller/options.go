// Package controller holds the hcp-operator's reconcilers: Callee and Caller
// (topology, credentials, harness), HCPSession housekeeping, and
// CapabilityPolicy.
//
// The desired state of every child comes from the pure builders of
// internal/resource; this package fetches inputs, applies, and reports.
package controller

import (
	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// Options configure the Callee and Caller reconcilers.
type Options struct {
	// DefaultBroker is used when a Callee or Caller names no broker
	// (--default-connection-secret); nil means none.
	DefaultBroker *resource.DefaultBroker
	// SidecarImage is the hcp-sidecar image (--sidecar-image).
	SidecarImage string
	// WatchNamespaces restricts the manager to these namespaces; empty
	// means all.
	WatchNamespaces []string
}

// AddToScheme registers every type the manager uses: core Kubernetes, the
// hcp.io API and the topology operator's v1beta1.
func AddToScheme(s *runtime.Scheme) error {
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, hcpv1alpha1.AddToScheme, topologyv1beta1.AddToScheme} {
		if err := add(s); err != nil {
			return err
		}
	}
	return nil
}

// CacheOptions restrict what the manager caches to what it needs:
//
//   - Secrets: only those labelled rabbitmq.com/topology-operator=true (the
//     label every broker connection and imported-credentials Secret already
//     needs; the operator's own Secrets carry it too). Caching every Secret
//     of a cluster would cost memory and widen what the process holds.
//   - Deployments, PodDisruptionBudgets, ServiceAccounts, Roles,
//     RoleBindings, the topology operator's objects and the harness pods
//     (their metadata): only those the operator manages
//     (app.kubernetes.io/managed-by=hcp-operator).
//
// With WatchNamespaces set, only those namespaces are cached, plus the
// namespace of the default connection Secret.
func CacheOptions(o Options) cache.Options {
	managed := labels.SelectorFromSet(labels.Set{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue})
	secrets := labels.SelectorFromSet(labels.Set{resource.LabelTopologyOperator: resource.TopologyOperatorLabelValue})
	// ByObject is keyed by pointer: the Secret entry is replaced below
	// through this key, never added a second time (controller-runtime
	// would keep either entry, at random).
	secretKey := &corev1.Secret{}
	opts := cache.Options{ByObject: map[client.Object]cache.ByObject{
		secretKey:                       {Label: secrets},
		&appsv1.Deployment{}:            {Label: managed},
		&policyv1.PodDisruptionBudget{}: {Label: managed},
		// Harness pods carry the Deployment's labels; the Callee
		// controller watches their metadata only.
		&corev1.Pod{}:                 {Label: managed},
		&corev1.ServiceAccount{}:      {Label: managed},
		&rbacv1.Role{}:                {Label: managed},
		&rbacv1.RoleBinding{}:         {Label: managed},
		&topologyv1beta1.Queue{}:      {Label: managed},
		&topologyv1beta1.Binding{}:    {Label: managed},
		&topologyv1beta1.User{}:       {Label: managed},
		&topologyv1beta1.Permission{}: {Label: managed},
		&topologyv1beta1.Exchange{}:   {Label: managed},
		&topologyv1beta1.Vhost{}:      {Label: managed},
	}}
	if len(o.WatchNamespaces) > 0 {
		opts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range o.WatchNamespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
		if d := o.DefaultBroker; d != nil && d.Namespace != "" {
			if _, ok := opts.DefaultNamespaces[d.Namespace]; !ok {
				nss := map[string]cache.Config{d.Namespace: {}}
				for ns := range opts.DefaultNamespaces {
					nss[ns] = cache.Config{}
				}
				opts.ByObject[secretKey] = cache.ByObject{Label: secrets, Namespaces: nss}
			}
		}
	}
	return opts
}
