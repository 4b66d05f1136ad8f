package controller

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/leaderelection"

	"github.com/hcp-io/hcp-operator/internal/resource"
)

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
		Options:                 Options{SidecarImage: resource.DefaultSidecarImage, CalleeSidecarClusterRole: resource.DefaultCalleeSidecarClusterRole, FirstStatusWait: DefaultFirstStatusWait},
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
