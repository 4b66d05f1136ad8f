package controller

import (
	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// CacheOptions restrict what the manager caches to what it needs:
//
//   - Secrets: only those labelled rabbitmq.com/topology-operator=true (the
//     label every broker connection and imported-credentials Secret already
//     needs; the operator's own Secrets carry it too). Caching every Secret
//     of a cluster would cost memory and widen what the process holds.
//     Unlabelled Secrets are read around the cache, only to say that they
//     lack the label.
//   - Deployments, PodDisruptionBudgets, ServiceAccounts, Roles,
//     RoleBindings, the topology operator's objects and the harness pods
//     (their metadata): only those the operator manages
//     (app.kubernetes.io/managed-by=hcp-operator).
//
// With WatchNamespaces set, only those namespaces are cached, plus the
// namespace of the default connection Secret.
//
// Cached objects are trimmed (cacheTransforms): managed fields everywhere,
// and on objects the operator never writes back whole, what it never reads.
func CacheOptions(o Options) cache.Options {
	managed := labels.SelectorFromSet(labels.Set{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue})
	secrets := labels.SelectorFromSet(labels.Set{resource.LabelTopologyOperator: resource.TopologyOperatorLabelValue})
	// ByObject is keyed by pointer: the Secret entry is replaced below
	// through this key, never added a second time (controller-runtime
	// would keep either entry, at random).
	secretKey := &corev1.Secret{}
	opts := cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			secretKey:                       {Label: secrets, Transform: trimSecret},
			&appsv1.Deployment{}:            {Label: managed, Transform: trimDeployment},
			&policyv1.PodDisruptionBudget{}: {Label: managed},
			// Harness pods carry the Deployment's labels; the Callee
			// controller watches their metadata only.
			&corev1.Pod{}:                   {Label: managed},
			&corev1.ServiceAccount{}:        {Label: managed},
			&rbacv1.Role{}:                  {Label: managed, Transform: trimRole},
			&rbacv1.RoleBinding{}:           {Label: managed},
			&topologyv1beta1.Queue{}:        {Label: managed},
			&topologyv1beta1.Binding{}:      {Label: managed},
			&topologyv1beta1.User{}:         {Label: managed},
			&topologyv1beta1.Permission{}:   {Label: managed},
			&topologyv1beta1.Exchange{}:     {Label: managed},
			&topologyv1beta1.Vhost{}:        {Label: managed},
			&topologyv1beta1.Policy{}:       {Label: managed},
			&hcpv1alpha1.Callee{}:           {Transform: trimUserObject},
			&hcpv1alpha1.Caller{}:           {Transform: trimUserObject},
			&hcpv1alpha1.CapabilityPolicy{}: {Transform: trimUserObject},
			&hcpv1alpha1.HCPSession{}:       {Transform: trimSession},
		},
	}
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
				opts.ByObject[secretKey] = cache.ByObject{Label: secrets, Namespaces: nss, Transform: trimSecret}
			}
		}
	}
	return opts
}

// The cache transforms. A ByObject transform replaces the default one, so
// each strips managed fields itself.
//
// What they drop must never reach the API server from a cached copy: the
// operator writes Callees, Callers, CapabilityPolicies and HCPSessions only
// by merge patches computed between two copies of the same cached object
// (claim, removeFinalizer, the status patches) and by Delete, so a field
// missing from both copies is left alone on the server. Its children are
// written by server-side apply of what the builders make (the cache is only
// compared with it: a Deployment also loses its pod spec, which no
// comparison reads), the shared objects and limit Policies by
// CreateOrUpdate (a whole-object Update from the cached copy): for those
// only managed fields go, which an Update with none leaves unchanged on
// the server (an empty managedFields is ignored; only [{}] resets them).
var (
	stripManagedFields = cache.TransformStripManagedFields()

	// trimUserObject drops kubectl's last-applied-configuration: a second
	// copy of the whole spec (a Callee's pod template, its capabilities'
	// input schemas) that no reconciler reads.
	trimUserObject toolscache.TransformFunc = func(in any) (any, error) {
		if o, ok := in.(client.Object); ok {
			dropLastApplied(o)
		}
		return stripManagedFields(in)
	}

	// trimSecret drops last-applied-configuration from Secrets the operator
	// does not manage (connection and TLS Secrets): kubectl apply leaves
	// the whole Secret, data included, in that annotation. The operator's
	// own Secrets, which it updates, never carry it and are left alone.
	trimSecret toolscache.TransformFunc = func(in any) (any, error) {
		if o, ok := in.(client.Object); ok && o.GetLabels()[hcpv1alpha1.LabelManagedBy] != hcpv1alpha1.ManagedByValue {
			dropLastApplied(o)
		}
		return stripManagedFields(in)
	}

	// trimDeployment drops a harness Deployment's pod spec, the largest
	// part of it (both containers, their environment, probes, volumes):
	// the operator writes a Deployment only by server-side apply of what
	// the builder makes, decides whether one is up to date from its
	// replicas, metadata and the pod template's hash annotations
	// (deploymentUpToDate), and reads its status and selector. The one
	// reader of the whole template, a held sidecar update (keepSidecar),
	// reads the Deployment from the API server.
	trimDeployment toolscache.TransformFunc = func(in any) (any, error) {
		if d, ok := in.(*appsv1.Deployment); ok {
			d.Spec.Template.Spec = corev1.PodSpec{}
		}
		return stripManagedFields(in)
	}

	// trimRole keeps a digest of a Role's rules in place of the rules,
	// most of a Role: the operator writes Roles only by server-side apply
	// of what the builder makes, and decides whether one is up to date
	// from its metadata and that digest (roleUpToDate).
	trimRole toolscache.TransformFunc = func(in any) (any, error) {
		if r, ok := in.(*rbacv1.Role); ok {
			if r.Annotations == nil {
				r.Annotations = map[string]string{}
			}
			r.Annotations[cachedRulesDigest] = rulesDigest(r.Rules)
			r.Rules = nil
		}
		return stripManagedFields(in)
	}

	// trimSession drops what the harness reports about its work (result,
	// artifacts, progress, checkpoint, error): the operator only deletes
	// finished sessions and counts live ones, by state, times, pod and
	// callee. Read a session with the APIReader for the rest.
	trimSession toolscache.TransformFunc = func(in any) (any, error) {
		if s, ok := in.(*hcpv1alpha1.HCPSession); ok {
			dropLastApplied(s)
			s.Status.Result, s.Status.Progress, s.Status.LastCheckpoint, s.Status.Error = nil, nil, nil, nil
		}
		return stripManagedFields(in)
	}
)

func dropLastApplied(o client.Object) {
	if a := o.GetAnnotations(); a != nil {
		if _, ok := a[corev1.LastAppliedConfigAnnotation]; ok {
			delete(a, corev1.LastAppliedConfigAnnotation)
			o.SetAnnotations(a)
		}
	}
}
