// Command manager is the hcp-operator: it reconciles Callees, Callers,
// CapabilityPolicies and HCPSessions.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/memlimit"
)

func main() {
	cfg := controller.DefaultManagerConfig()
	cfg.BindFlags(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "manager: invalid flags:\n%v\n", err)
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	memlimit.Set(ctrl.Log.WithName("setup"), memlimit.FromCgroup)
	memlimit.SetGCPercent(ctrl.Log.WithName("setup"), memlimit.ManagerGCPercent)
	if err := run(ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie(), cfg); err != nil {
		ctrl.Log.WithName("setup").Error(err, "Manager failed")
		os.Exit(1)
	}
}

// run builds the manager from cfg and runs it until ctx ends.
func run(ctx context.Context, restConfig *rest.Config, cfg controller.ManagerConfig) error {
	scheme := runtime.NewScheme()
	if err := controller.AddToScheme(scheme); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg.RESTConfig(restConfig), cfg.ManagerOptions(scheme))
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := controller.Setup(ctx, mgr, cfg.Options); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("Starting manager", "sidecarImage", cfg.SidecarImage, "sidecarOTLPEndpoint", cfg.SidecarTracing.OTLPEndpoint,
		"defaultConnectionSecret", cfg.DefaultBroker, "watchNamespaces", cfg.WatchNamespaces,
		"maxConcurrentReconciles", cfg.MaxConcurrentReconciles, "kubeAPIQPS", cfg.QPS, "kubeAPIBurst", cfg.Burst,
		"leaderElect", cfg.LeaderElect, "leaderElectionID", cfg.LeaderElectionID)
	return mgr.Start(ctx)
}
