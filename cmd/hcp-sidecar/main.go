// Command hcp-sidecar is the HCP protocol sidecar injected next to a callee
// harness or a caller app. It speaks AMQP 0-9-1 to RabbitMQ and a small
// local HTTP API to its harness (docs/harness-api.md), and records sessions
// as HCPSession objects. Its configuration is the environment contract of
// internal/sidecar/config; --mode overrides HCP_MODE.
//
// Ports: HCP_API_ADDR serves the local harness API; HCP_PROBE_ADDR serves
// /healthz, /readyz and /metrics.
//
// On SIGTERM it stops consuming, finishes the deliveries in hand, lets
// running sessions end (callee mode: up to 20 s, then fails the rest),
// flushes HCPSession status and closes the broker connection.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/callee"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/events"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/sidecar/secretfile"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/transport"
)

func main() {
	mode := flag.String("mode", "", "callee or caller (overrides "+config.EnvMode+")")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()

	cfg, err := config.FromEnv(func(k string) (string, bool) {
		if k == config.EnvMode && *mode != "" {
			return *mode, true
		}
		return os.LookupEnv(k)
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "hcp-sidecar: invalid configuration:\n%v\n", err)
		os.Exit(2)
	}
	if zapOpts.Level == nil {
		zapOpts.Level = logLevel(cfg.LogLevel)
	}
	log := zap.New(zap.UseFlagOptions(&zapOpts)).WithName("hcp-sidecar").WithValues("mode", cfg.Mode, "id", cfg.ID)
	// controller-runtime's and client-go's own logs (cache, client
	// warnings) go to the same logger; without this they are dropped and
	// controller-runtime prints a stack trace about it.
	ctrllog.SetLogger(log)
	klog.SetLogger(log.WithName("client-go"))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error(err, "Sidecar failed")
		os.Exit(1)
	}
	log.Info("Stopped")
}

func logLevel(l string) zapcore.Level {
	switch l {
	case "debug":
		return zapcore.DebugLevel
	case "error":
		return zapcore.ErrorLevel
	}
	return zapcore.InfoLevel
}

// runner is what both modes provide.
type runner interface {
	Run(ctx context.Context) error
	Ready() error
}

func run(ctx context.Context, cfg *config.Config, log logr.Logger) error {
	if cfg.PodName == "" {
		cfg.PodName, _ = os.Hostname()
	}

	// Kubernetes: a cache scoped to the namespace and to the objects this
	// mode reads, plus an uncached reader for reads that must not be stale.
	restCfg, err := ctrlconfig.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := hcpv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	byObject, watched := cacheScope(cfg)
	objCache, err := cache.New(restCfg, cache.Options{
		Scheme:            scheme,
		DefaultNamespaces: map[string]cache.Config{cfg.Namespace: {}},
		ByObject:          byObject,
	})
	if err != nil {
		return fmt.Errorf("creating the object cache: %w", err)
	}
	kc, err := client.New(restCfg, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: objCache}})
	if err != nil {
		return err
	}
	apiReader, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	recorder, stopEvents, err := events.NewRecorder(restCfg, scheme, cfg.Namespace, cfg.PodName)
	if err != nil {
		return err
	}
	defer stopEvents()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	// Probes first, so liveness answers while everything else starts.
	ready := &server.Readiness{}
	var cacheSynced server.Flag
	ready.Add("kubernetes-cache", cacheSynced.Err)
	var wg sync.WaitGroup
	probeCtx, stopProbes := context.WithCancel(context.WithoutCancel(ctx))
	defer func() { stopProbes(); wg.Wait() }()
	probes := server.ProbeHandler(ready, reg)
	var drainer drainTarget
	probes.Handle("/drain", drainHandler(cfg, apiReader, &drainer, log.WithName("drain")))
	wg.Go(func() {
		if err := server.ListenAndServe(probeCtx, cfg.ProbeAddr, probes, log.WithName("probes")); err != nil {
			log.Error(err, "Probe server failed")
		}
	})

	cacheCtx, stopCache := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCache()
	wg.Go(func() {
		if err := objCache.Start(cacheCtx); err != nil {
			log.Error(err, "Object cache failed")
		}
	})
	for _, o := range watched {
		if _, err := objCache.GetInformer(ctx, o); err != nil {
			return fmt.Errorf("watching %T: %w", o, err)
		}
	}
	syncCtx, cancelSync := context.WithTimeout(ctx, 2*time.Minute)
	synced := objCache.WaitForCacheSync(syncCtx)
	cancelSync()
	if !synced {
		return errors.New("the object cache did not sync within 2 minutes (RBAC of the sidecar's ServiceAccount?)")
	}
	cacheSynced.Set(nil)

	// AMQP.
	amqpURL, err := amqpURLSource(cfg, log)
	if err != nil {
		return err
	}
	topts := transport.Options{
		URL:            amqpURL(),
		URLSource:      amqpURL,
		Heartbeat:      cfg.Heartbeat,
		ConnectionName: fmt.Sprintf("hcp-sidecar %s %s %s", cfg.Mode, cfg.ID, cfg.PodName),
		Logger:         log.WithName("amqp"),
		Metrics:        m,
		// Caller mode: on shutdown, close the channel without basic.cancel so
		// the broker puts unacked events back at the head of the quorum queue
		// in order (a cancel sends in-transit ones to the back). See
		// internal/sidecar/caller/doc.go.
		DrainWithoutCancel: cfg.Mode == config.ModeCaller,
	}
	if cfg.TLSCAFile != "" || cfg.TLSCertFile != "" {
		if topts.TLS, err = transport.TLSConfig(cfg.TLSCAFile, cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
			return err
		}
	}
	// Two connections: RabbitMQ's flow control (connection.blocked on a
	// resource alarm, credit flow) throttles connections that publish, and
	// a consumer sharing one would stop receiving and acknowledging too.
	// The consume connection also carries the passive topology checks.
	conns, err := dialBoth(ctx, topts)
	if err != nil {
		return err
	}
	pubConn, conn := conns[0], conns[1]
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		for _, c := range []*transport.Conn{conn, pubConn} { // stop consuming first
			if err := c.Close(cctx); err != nil {
				log.Error(err, "Failed to close an AMQP connection cleanly")
			}
		}
	}()
	if conn.Username() != cfg.Username {
		return fmt.Errorf("%s user %q differs from %s %q: every publish carries user_id %q, which the broker refuses unless it is the connection's user",
			config.EnvAMQPURL, conn.Username(), config.EnvUsername, cfg.Username, cfg.Username)
	}
	ready.Add("amqp", func() error {
		for _, c := range conns {
			if !c.Ready() {
				if err := c.LastError(); err != nil {
					return fmt.Errorf("%s connection not connected: %w", c.Role(), err)
				}
				return fmt.Errorf("%s connection not connected", c.Role())
			}
		}
		return nil
	})
	pub, err := transport.NewPublisher(pubConn, transport.PublisherOptions{})
	if err != nil {
		return err
	}
	for _, c := range conns {
		if err := c.WaitReady(ctx); err != nil {
			return err
		}
	}

	clk := clock.RealClock{}
	sw := status.New(status.Options{Client: kc, Namespace: cfg.Namespace, Clock: clk, Metrics: m, Log: log.WithName("status")})
	statusCtx, stopStatus := context.WithCancel(context.WithoutCancel(ctx))
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		if err := sw.Run(statusCtx); err != nil {
			log.Error(err, "Failed to write the last HCPSession status")
		}
	}()
	// Runs after the mode's Run returned: the last status is flushed.
	defer func() { stopStatus(); <-statusDone }()

	var (
		sidecar runner
		handler interface{ Handler() http.Handler }
	)
	switch cfg.Mode {
	case config.ModeCallee:
		keeper, err := podLease(ctx, cfg, apiReader, log)
		if err != nil {
			return err
		}
		go keeper.Run(ctx)
		s, err := callee.New(callee.Options{
			Config: cfg, Client: kc, Reader: apiReader, Cache: objCache, Conn: conn,
			Publisher: pub, Consumer: conn, Status: sw, Metrics: m, Log: log, Clock: clk, Lease: keeper, Recorder: recorder,
		})
		if err != nil {
			return err
		}
		sidecar, handler = s, s
	case config.ModeCaller:
		s, err := caller.New(caller.Options{
			Config: cfg, Client: kc, Reader: apiReader, Publisher: pub, Consumer: conn, Status: sw, Metrics: m, Log: log, Clock: clk,
		})
		if err != nil {
			return err
		}
		sidecar, handler = s, s
	}
	ready.Add(string(cfg.Mode), sidecar.Ready)
	drainer.set(sidecar)

	// The local API outlives the mode's Run: a callee harness reports the
	// end of its sessions during the shutdown drain.
	apiCtx, stopAPI := context.WithCancel(context.WithoutCancel(ctx))
	apiDone := make(chan struct{})
	go func() {
		defer close(apiDone)
		if err := server.ListenAndServe(apiCtx, cfg.APIAddr, handler.Handler(), log.WithName("api")); err != nil {
			log.Error(err, "Local API server failed")
		}
	}()
	defer func() { stopAPI(); <-apiDone }()

	log.Info("Started", "pod", cfg.PodName, "namespace", cfg.Namespace, "vhost", cfg.Vhost, "api", cfg.APIAddr, "probes", cfg.ProbeAddr)
	return sidecar.Run(ctx)
}

// cacheScope limits the cache to what the mode reads, matching the RBAC
// the operator grants (internal/resource.RoleRules): the own Callee or
// Caller by name, and only the HCPSessions of this callee or caller.
func cacheScope(cfg *config.Config) (map[client.Object]cache.ByObject, []client.Object) {
	own := fields.OneTermEqualSelector("metadata.name", cfg.ObjectName)
	if cfg.Mode == config.ModeCallee {
		return map[client.Object]cache.ByObject{
				&hcpv1alpha1.Callee{}:     {Field: own},
				&hcpv1alpha1.HCPSession{}: {Label: labels.SelectorFromSet(labels.Set{hcpv1alpha1.LabelCalleeID: cfg.ID})},
			}, []client.Object{
				&hcpv1alpha1.Callee{}, &hcpv1alpha1.HCPSession{}, &hcpv1alpha1.CapabilityPolicy{}, &hcpv1alpha1.Caller{},
			}
	}
	return map[client.Object]cache.ByObject{
			&hcpv1alpha1.Caller{}:     {Field: own},
			&hcpv1alpha1.HCPSession{}: {Label: labels.SelectorFromSet(labels.Set{hcpv1alpha1.LabelCallerID: cfg.ID})},
		}, []client.Object{
			&hcpv1alpha1.Caller{}, &hcpv1alpha1.HCPSession{},
		}
}

// amqpURLSource gives the broker URL: as set in the environment, or from
// the mounted credentials Secret (pods), reread at each dial so that a
// rotated password needs no restart and no secret sits in the environment.
func amqpURLSource(cfg *config.Config, log logr.Logger) (func() string, error) {
	if cfg.AMQPURLFile == "" {
		return func() string { return cfg.AMQPURL }, nil
	}
	f, err := secretfile.Load(cfg.AMQPURLFile, func(b []byte) (string, error) {
		u := strings.TrimSpace(string(b))
		return u, config.CheckAMQPURL(u)
	}, secretfile.Options[string]{
		OnChange: func(string) { log.Info("The broker credentials changed; the next connection uses them") },
		OnError: func(err error) {
			log.Error(err, "The rotated broker URL is unusable; keeping the previous one")
		},
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", config.EnvAMQPURLFile, err)
	}
	return f.Get, nil
}

// dialBoth dials the publish and the consume connection (named and
// labelled apart in the metrics).
func dialBoth(ctx context.Context, o transport.Options) ([]*transport.Conn, error) {
	conns := make([]*transport.Conn, 0, 2)
	for _, role := range []string{"publish", "consume"} {
		ro := o
		ro.Role, ro.ConnectionName = role, o.ConnectionName+" "+role
		c, err := transport.Dial(ctx, ro)
		if err != nil {
			for _, d := range conns {
				_ = d.Close(ctx)
			}
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}
