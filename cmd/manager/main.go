// Command manager is the hcp-operator: it reconciles Callees, Callers,
// CapabilityPolicies and HCPSessions.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

func main() {
	var (
		metricsAddr, probeAddr      string
		secureMetrics, enableHTTP2  bool
		leaderElect                 bool
		leaderElectionNamespace     string
		defaultSecret, sidecarImage string
		watchNamespaces             string
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "Address of the metrics endpoint (:8443 for HTTPS, :8080 for HTTP); 0 disables it.")
	flag.BoolVar(&secureMetrics, "metrics-secure", true, "Serve metrics over HTTPS with authentication and authorization.")
	flag.BoolVar(&enableHTTP2, "enable-http2", false, "Enable HTTP/2 for the metrics server (off: CVE-2023-44487, CVE-2023-39325).")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz.")
	flag.BoolVar(&leaderElect, "leader-elect", false, "Elect a leader, so that only one replica reconciles.")
	flag.StringVar(&leaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease (default: the pod's).")
	flag.StringVar(&defaultSecret, "default-connection-secret", "",
		"Broker for Callees and Callers that name none: a topology-operator connection Secret as NAMESPACE/NAME, "+
			"or NAME to look it up in each object's own namespace. A Secret in another namespace must carry the annotation "+
			"rabbitmq.com/topology-allowed-namespaces listing the namespaces that use it (or *).")
	flag.StringVar(&sidecarImage, "sidecar-image", resource.DefaultSidecarImage, "Image of the injected hcp-sidecar container.")
	flag.StringVar(&watchNamespaces, "watch-namespaces", "", "Comma-separated namespaces to watch; empty watches all.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	if err := run(runConfig{
		metricsAddr: metricsAddr, probeAddr: probeAddr, secureMetrics: secureMetrics, enableHTTP2: enableHTTP2,
		leaderElect: leaderElect, leaderElectionNamespace: leaderElectionNamespace,
		defaultSecret: defaultSecret, sidecarImage: sidecarImage, watchNamespaces: watchNamespaces,
	}); err != nil {
		log.Error(err, "Manager failed")
		os.Exit(1)
	}
}

type runConfig struct {
	metricsAddr, probeAddr                       string
	secureMetrics, enableHTTP2, leaderElect      bool
	leaderElectionNamespace                      string
	defaultSecret, sidecarImage, watchNamespaces string
}

func run(c runConfig) error {
	def, err := resource.ParseDefaultBroker(c.defaultSecret)
	if err != nil {
		return fmt.Errorf("--default-connection-secret: %w", err)
	}
	opts := controller.Options{DefaultBroker: def, SidecarImage: c.sidecarImage}
	for ns := range strings.SplitSeq(c.watchNamespaces, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			opts.WatchNamespaces = append(opts.WatchNamespaces, ns)
		}
	}

	scheme := runtime.NewScheme()
	if err := controller.AddToScheme(scheme); err != nil {
		return err
	}
	var tlsOpts []func(*tls.Config)
	if !c.enableHTTP2 {
		tlsOpts = append(tlsOpts, func(cfg *tls.Config) { cfg.NextProtos = []string{"http/1.1"} })
	}
	metrics := metricsserver.Options{BindAddress: c.metricsAddr, SecureServing: c.secureMetrics, TLSOpts: tlsOpts}
	if c.secureMetrics {
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metrics,
		WebhookServer:           webhook.NewServer(webhook.Options{TLSOpts: tlsOpts}),
		HealthProbeBindAddress:  c.probeAddr,
		LeaderElection:          c.leaderElect,
		LeaderElectionID:        "hcp-operator.hcp.io",
		LeaderElectionNamespace: c.leaderElectionNamespace,
		// The manager exits right after losing the lease; releasing it on
		// shutdown lets the next leader start at once.
		LeaderElectionReleaseOnCancel: true,
		Cache:                         controller.CacheOptions(opts),
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	if err := controller.Setup(ctx, mgr, opts); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("Starting manager", "sidecarImage", opts.SidecarImage,
		"defaultConnectionSecret", c.defaultSecret, "watchNamespaces", opts.WatchNamespaces)
	return mgr.Start(ctx)
}
