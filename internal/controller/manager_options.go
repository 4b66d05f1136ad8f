package controller

import (
	"crypto/tls"
	"math"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

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
