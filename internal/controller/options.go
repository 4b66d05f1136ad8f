// Package controller holds the hcp-operator's reconcilers: Callee and Caller
// (topology, credentials, harness), HCPSession housekeeping, and
// CapabilityPolicy.
//
// The desired state of every child comes from the pure builders of
// internal/resource; this package fetches inputs, applies, and reports.
package controller

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

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
	// SidecarTracing switches on the sidecars' span export
	// (--sidecar-otlp-endpoint, --sidecar-otlp-protocol).
	SidecarTracing resource.SidecarTracing
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

// The controllers, by the name they carry in logs and in the controller
// label of controller-runtime's metrics, and the kind each reconciles.
const (
	ControllerCallee           = "callee"
	ControllerCaller           = "caller"
	ControllerCapabilityPolicy = "capabilitypolicy"
	ControllerHCPSession       = "hcpsession"
)

var controllerKinds = map[string]string{
	ControllerCallee:           "Callee",
	ControllerCaller:           "Caller",
	ControllerCapabilityPolicy: "CapabilityPolicy",
	ControllerHCPSession:       "HCPSession",
}

// Defaults of the manager's flags.
const (
	DefaultLeaderElectionID  = "hcp-operator.hcp.io"
	DefaultLeaseDuration     = 15 * time.Second
	DefaultRenewDeadline     = 10 * time.Second
	DefaultRetryPeriod       = 2 * time.Second
	DefaultCacheSyncTimeout  = 2 * time.Minute
	DefaultMetricsAddr       = "0"
	DefaultHealthProbeAddr   = ":8081"
	defaultReconcileWorkers  = 1
	maxConcurrencyFlagFormat = "callee=N,caller=N,capabilitypolicy=N,hcpsession=N"
)

// ManagerConfig is the manager's command line: the reconcilers' Options
// plus how the manager talks to the API server, elects a leader, runs its
// controllers and serves metrics and probes. cmd/manager binds it to flags
// (BindFlags), checks it (Validate) and builds the manager from it
// (RESTConfig, ManagerOptions); the envtest suite builds its manager the
// same way.
type ManagerConfig struct {
	Options

	// MetricsAddr is where metrics are served; "0" disables them.
	MetricsAddr string
	// SecureMetrics serves them over HTTPS, authenticating (TokenReview)
	// and authorizing (SubjectAccessReview) every scrape.
	SecureMetrics bool
	// EnableHTTP2 allows HTTP/2 on the metrics (and webhook) server.
	EnableHTTP2 bool
	// HealthProbeAddr serves /healthz and /readyz; "0" disables them.
	HealthProbeAddr string
	// PprofAddr serves Go's /debug/pprof/ profiles (heap, CPU,
	// goroutines); empty or "0" (the default) disables them. Bind it to
	// loopback: the profiles are not authenticated.
	PprofAddr string

	// LeaderElect makes the replicas elect a leader through a Lease.
	LeaderElect bool
	// LeaderElectionID is the Lease's name; LeaderElectionNamespace its
	// namespace (empty: the pod's).
	LeaderElectionID, LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod tune the election as in
	// client-go's leaderelection.LeaderElectionConfig.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// QPS and Burst limit the manager's requests to the API server; 0 QPS
	// leaves them unlimited on the client side (as controller-runtime does)
	// and to the API server's Priority and Fairness.
	QPS   float64
	Burst int

	// MaxConcurrentReconciles is how many objects each controller (keyed by
	// its name: ControllerCallee, ...) reconciles at once.
	MaxConcurrentReconciles map[string]int
	// CacheSyncTimeout bounds how long a controller waits at start for its
	// caches to fill; past it the manager exits.
	CacheSyncTimeout time.Duration
}

// DefaultManagerConfig is the manager with every flag at its default.
func DefaultManagerConfig() ManagerConfig {
	c := ManagerConfig{
		Options:                 Options{SidecarImage: resource.DefaultSidecarImage},
		MetricsAddr:             DefaultMetricsAddr,
		SecureMetrics:           true,
		HealthProbeAddr:         DefaultHealthProbeAddr,
		LeaderElectionID:        DefaultLeaderElectionID,
		LeaseDuration:           DefaultLeaseDuration,
		RenewDeadline:           DefaultRenewDeadline,
		RetryPeriod:             DefaultRetryPeriod,
		CacheSyncTimeout:        DefaultCacheSyncTimeout,
		MaxConcurrentReconciles: map[string]int{},
	}
	for name := range controllerKinds {
		c.MaxConcurrentReconciles[name] = defaultReconcileWorkers
	}
	return c
}

// BindFlags registers the manager's flags on fs, writing into c (whose
// current values are the defaults shown).
func (c *ManagerConfig) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.MetricsAddr, "metrics-bind-address", c.MetricsAddr, "Address of the metrics endpoint (:8443 for HTTPS, :8080 for HTTP); 0 disables it.")
	fs.BoolVar(&c.SecureMetrics, "metrics-secure", c.SecureMetrics, "Serve metrics over HTTPS with authentication and authorization.")
	fs.BoolVar(&c.EnableHTTP2, "enable-http2", c.EnableHTTP2, "Enable HTTP/2 for the metrics server (off: CVE-2023-44487, CVE-2023-39325).")
	fs.StringVar(&c.HealthProbeAddr, "health-probe-bind-address", c.HealthProbeAddr, "Address of /healthz and /readyz.")
	fs.StringVar(&c.PprofAddr, "pprof-bind-address", c.PprofAddr, "Address of Go's /debug/pprof/ profiles (heap, CPU, goroutines), unauthenticated: bind it to loopback (127.0.0.1:6060) and reach it with kubectl port-forward; empty or 0 disables them.")

	fs.BoolVar(&c.LeaderElect, "leader-elect", c.LeaderElect, "Elect a leader, so that only one replica reconciles.")
	fs.StringVar(&c.LeaderElectionID, "leader-election-id", c.LeaderElectionID, "Name of the leader election Lease.")
	fs.StringVar(&c.LeaderElectionNamespace, "leader-election-namespace", c.LeaderElectionNamespace, "Namespace of the leader election Lease (default: the pod's).")
	fs.DurationVar(&c.LeaseDuration, "leader-election-lease-duration", c.LeaseDuration,
		"How long the other replicas wait, after the leader stopped renewing, before one takes over.")
	fs.DurationVar(&c.RenewDeadline, "leader-election-renew-deadline", c.RenewDeadline,
		"How long the leader keeps retrying to renew its Lease before it gives up leadership (and the manager exits). Shorter than the lease duration.")
	fs.DurationVar(&c.RetryPeriod, "leader-election-retry-period", c.RetryPeriod,
		"How often the replicas try to acquire or renew the Lease. Renew deadline > 1.2 × retry period.")

	fs.Float64Var(&c.QPS, "kube-api-qps", c.QPS,
		"Requests per second the manager may send to the API server, per resource type; 0 sets no client-side limit (the API server's Priority and Fairness applies).")
	fs.IntVar(&c.Burst, "kube-api-burst", c.Burst, "Requests the manager may send in a burst above --kube-api-qps; 0 means twice the QPS. Needs --kube-api-qps.")
	fs.Var((*concurrencyFlag)(&c.MaxConcurrentReconciles), "max-concurrent-reconciles",
		"Objects each controller reconciles at once, as "+maxConcurrencyFlagFormat+"; controllers not named keep their value.")
	fs.DurationVar(&c.CacheSyncTimeout, "cache-sync-timeout", c.CacheSyncTimeout, "How long the controllers wait at start for their caches to fill before the manager gives up and exits.")

	fs.Func("default-connection-secret",
		"Broker for Callees and Callers that name none: a topology-operator connection Secret as NAMESPACE/NAME, "+
			"or NAME to look it up in each object's own namespace. A Secret in another namespace must carry the annotation "+
			"rabbitmq.com/topology-allowed-namespaces listing the namespaces that use it (or *).",
		func(s string) error {
			d, err := resource.ParseDefaultBroker(s)
			if err != nil {
				return err
			}
			c.DefaultBroker = d
			return nil
		})
	fs.StringVar(&c.SidecarImage, "sidecar-image", c.SidecarImage, "Image of the injected hcp-sidecar container.")
	fs.StringVar(&c.SidecarTracing.OTLPEndpoint, "sidecar-otlp-endpoint", c.SidecarTracing.OTLPEndpoint,
		"OTLP collector the sidecars export their spans to (e.g. http://otel-collector.observability:4317); empty: no spans (trace context is still passed on).")
	fs.StringVar(&c.SidecarTracing.Protocol, "sidecar-otlp-protocol", c.SidecarTracing.Protocol, "OTLP protocol of --sidecar-otlp-endpoint: grpc (default) or http/protobuf.")
	fs.Func("watch-namespaces", "Comma-separated namespaces to watch; empty watches all.", func(s string) error {
		nss, err := parseNamespaces(s)
		if err != nil {
			return err
		}
		c.WatchNamespaces = nss
		return nil
	})
}

func parseNamespaces(s string) ([]string, error) {
	var nss []string
	for ns := range strings.SplitSeq(s, ",") {
		ns = strings.TrimSpace(ns)
		if ns == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
		}
		if !slices.Contains(nss, ns) {
			nss = append(nss, ns)
		}
	}
	return nss, nil
}

// concurrencyFlag is --max-concurrent-reconciles: NAME=N pairs merged into
// the map (names case-insensitive, so the chart's capabilityPolicy works).
type concurrencyFlag map[string]int

func (f *concurrencyFlag) String() string {
	if f == nil || *f == nil {
		return ""
	}
	parts := make([]string, 0, len(*f))
	for _, name := range slices.Sorted(maps.Keys(*f)) {
		parts = append(parts, fmt.Sprintf("%s=%d", name, (*f)[name]))
	}
	return strings.Join(parts, ",")
}

func (f *concurrencyFlag) Set(s string) error {
	if *f == nil {
		*f = map[string]int{}
	}
	for pair := range strings.SplitSeq(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		name, value, ok := strings.Cut(pair, "=")
		name = strings.ToLower(strings.TrimSpace(name))
		if !ok {
			return fmt.Errorf("%q: want %s", pair, maxConcurrencyFlagFormat)
		}
		if _, known := controllerKinds[name]; !known {
			return fmt.Errorf("unknown controller %q: want one of %s", name, strings.Join(slices.Sorted(maps.Keys(controllerKinds)), ", "))
		}
		n, err := strconv.Atoi(strings.TrimSpace(value))
		if err != nil || n < 1 {
			return fmt.Errorf("%s=%s: want a whole number of at least 1", name, value)
		}
		(*f)[name] = n
	}
	return nil
}

// Validate reports every inconsistent setting at once, each naming its flag.
func (c *ManagerConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.SidecarImage == "" {
		bad("--sidecar-image: must not be empty")
	}
	if err := resource.ParseOTLPProtocol(c.SidecarTracing.Protocol); err != nil {
		bad("--sidecar-otlp-protocol=%w", err)
	}
	switch {
	case c.QPS < 0 || math.IsNaN(c.QPS) || math.IsInf(c.QPS, 0):
		bad("--kube-api-qps=%v: want 0 (no client-side limit) or a positive number", c.QPS)
	case c.Burst < 0:
		bad("--kube-api-burst=%d: want 0 (twice the QPS) or a positive number", c.Burst)
	case c.Burst > 0 && c.QPS == 0:
		bad("--kube-api-burst=%d needs --kube-api-qps: without a QPS limit there is no burst to bound", c.Burst)
	}
	for name, n := range c.MaxConcurrentReconciles {
		if _, known := controllerKinds[name]; !known {
			bad("--max-concurrent-reconciles: unknown controller %q", name)
		} else if n < 1 {
			bad("--max-concurrent-reconciles: %s=%d: want at least 1", name, n)
		}
	}
	if errs := validation.IsDNS1123Subdomain(c.LeaderElectionID); len(errs) > 0 {
		bad("--leader-election-id=%q: not a valid Lease name: %s", c.LeaderElectionID, strings.Join(errs, "; "))
	}
	if ns := c.LeaderElectionNamespace; ns != "" {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			bad("--leader-election-namespace=%q: %s", ns, strings.Join(errs, "; "))
		}
	}
	// client-go's leader elector refuses these at start; say so up front,
	// with the flags' names.
	switch {
	case c.LeaseDuration <= 0 || c.RenewDeadline <= 0 || c.RetryPeriod <= 0:
		bad("--leader-election-lease-duration=%v, --leader-election-renew-deadline=%v, --leader-election-retry-period=%v: all must be positive",
			c.LeaseDuration, c.RenewDeadline, c.RetryPeriod)
	case c.RenewDeadline >= c.LeaseDuration:
		bad("--leader-election-renew-deadline=%v must be shorter than --leader-election-lease-duration=%v: "+
			"otherwise another replica may take the Lease while the leader still thinks it holds it", c.RenewDeadline, c.LeaseDuration)
	case float64(c.RenewDeadline) <= leaderelection.JitterFactor*float64(c.RetryPeriod):
		bad("--leader-election-renew-deadline=%v must be longer than %v × --leader-election-retry-period=%v",
			c.RenewDeadline, leaderelection.JitterFactor, c.RetryPeriod)
	}
	if c.CacheSyncTimeout <= 0 {
		bad("--cache-sync-timeout=%v: must be positive", c.CacheSyncTimeout)
	}
	return errors.Join(errs...)
}

// RESTConfig returns a copy of cfg with the client-side rate limits set.
func (c *ManagerConfig) RESTConfig(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	if c.QPS > 0 {
		out.QPS = float32(c.QPS)
		out.Burst = c.Burst
		if out.Burst == 0 {
			out.Burst = int(math.Ceil(2 * c.QPS))
		}
	}
	// QPS 0 leaves cfg's own: controller-runtime's GetConfig sets -1, no
	// client-side limit.
	return out
}

// ControllerConfig is the controllers' shared configuration: the
// concurrency of each (by the kind it reconciles, which the builder
// matches against For()) and the cache sync timeout.
func (c *ManagerConfig) ControllerConfig() config.Controller {
	gk := map[string]int{}
	for name, n := range c.MaxConcurrentReconciles {
		if kind, ok := controllerKinds[name]; ok {
			gk[schema.GroupKind{Group: hcpv1alpha1.GroupVersion.Group, Kind: kind}.String()] = n
		}
	}
	return config.Controller{GroupKindConcurrency: gk, CacheSyncTimeout: c.CacheSyncTimeout}
}

// ManagerOptions are the options of ctrl.NewManager; scheme must hold
// AddToScheme's types.
func (c *ManagerConfig) ManagerOptions(scheme *runtime.Scheme) ctrl.Options {
	var tlsOpts []func(*tls.Config)
	if !c.EnableHTTP2 {
		tlsOpts = append(tlsOpts, func(cfg *tls.Config) { cfg.NextProtos = []string{"http/1.1"} })
	}
	metrics := metricsserver.Options{BindAddress: c.MetricsAddr, SecureServing: c.SecureMetrics, TLSOpts: tlsOpts}
	if c.SecureMetrics {
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	leaseDuration, renewDeadline, retryPeriod := c.LeaseDuration, c.RenewDeadline, c.RetryPeriod
	return ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metrics,
		WebhookServer:           webhook.NewServer(webhook.Options{TLSOpts: tlsOpts}),
		HealthProbeBindAddress:  c.HealthProbeAddr,
		PprofBindAddress:        c.PprofAddr,
		LeaderElection:          c.LeaderElect,
		LeaderElectionID:        c.LeaderElectionID,
		LeaderElectionNamespace: c.LeaderElectionNamespace,
		LeaseDuration:           &leaseDuration,
		RenewDeadline:           &renewDeadline,
		RetryPeriod:             &retryPeriod,
		// The manager exits right after losing the lease; releasing it on
		// shutdown lets the next leader start at once.
		LeaderElectionReleaseOnCancel: true,
		Cache:                         CacheOptions(c.Options),
		Controller:                    c.ControllerConfig(),
	}
}

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
