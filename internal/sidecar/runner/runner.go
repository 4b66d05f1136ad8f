// Package runner is the hcp-sidecar process: from its flags and the
// environment contract of internal/sidecar/config it builds the logger,
// the Kubernetes clients and object cache, the two AMQP connections, the
// HCPSession status writer, the callee or caller mode and the two HTTP
// servers, runs them until SIGTERM or SIGINT, and takes them down in order.
// cmd/hcp-sidecar only parses the flags and calls Main.
//
// Ports: HCP_API_ADDR serves the local harness API; HCP_PROBE_ADDR serves
// /healthz, /readyz, /metrics and /drain.
//
// On SIGTERM it stops consuming, finishes the deliveries in hand, lets
// running sessions end (callee mode: up to 20 s, then fails the rest),
// flushes HCPSession status and closes the broker connections.
package runner

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/hcp-io/hcp-operator/internal/memlimit"
	"github.com/hcp-io/hcp-operator/internal/procs"
	"github.com/hcp-io/hcp-operator/internal/sidecar/callee"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/events"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/sidecar/tracing"
)

// Exit codes of Main.
const (
	// ExitStopped: stopped by a signal after a clean shutdown.
	ExitStopped = 0
	// ExitFailed: the sidecar failed while starting or running.
	ExitFailed = 1
	// ExitInvalidConfig: the environment contract (or --mode) is invalid.
	ExitInvalidConfig = 2
)

// Flags are the command line of hcp-sidecar; everything else comes from
// the environment.
type Flags struct {
	// Mode, when set, overrides HCP_MODE.
	Mode string
	// Zap are controller-runtime's logging flags (--zap-log-level, …).
	Zap zap.Options
}

// Bind registers the flags on fs.
func (f *Flags) Bind(fs *flag.FlagSet) {
	fs.StringVar(&f.Mode, "mode", "", "callee or caller (overrides "+config.EnvMode+")")
	f.Zap.BindFlags(fs)
}

// Main reads the configuration, sets up logging, runs the sidecar until
// SIGTERM or SIGINT and returns the process's exit code.
func Main(f Flags) int {
	cfg, err := config.FromEnv(func(k string) (string, bool) {
		if k == config.EnvMode && f.Mode != "" {
			return f.Mode, true
		}
		return os.LookupEnv(k)
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "hcp-sidecar: invalid configuration:\n%v\n", err)
		return ExitInvalidConfig
	}
	log := newLogger(cfg, f.Zap)
	memlimit.Set(log, memlimit.FromCgroup)
	procs.Set(log, procs.Sidecar, procs.CgroupRoot)
	defer tracing.Start(log.WithName("tracing"))()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := Run(ctx, cfg, log); err != nil {
		log.Error(err, "Sidecar failed")
		return ExitFailed
	}
	log.Info("Stopped")
	return ExitStopped
}

// newLogger builds the sidecar's logger (the level from HCP_LOG_LEVEL
// unless a zap flag set one) and makes it controller-runtime's and
// client-go's too: without that their own logs (cache, client warnings)
// are dropped and controller-runtime prints a stack trace about it.
func newLogger(cfg *config.Config, o zap.Options) logr.Logger {
	if o.Level == nil {
		o.Level = logLevel(cfg.LogLevel)
	}
	log := zap.New(zap.UseFlagOptions(&o)).WithName("hcp-sidecar").WithValues("mode", cfg.Mode, "id", cfg.ID)
	ctrllog.SetLogger(log)
	klog.SetLogger(log.WithName("client-go"))
	return log
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

// mode is what both modes provide.
type mode interface {
	Run(ctx context.Context) error
	Ready() error
	Handler() http.Handler
}

// Run builds the sidecar for cfg and runs it until ctx ends, then shuts it
// down: the local API stops last but one, after the mode's Run returned
// and the last status was written, so that a callee harness can report
// the end of its sessions during the drain. Everything started is stopped
// when Run returns, in the reverse order of its start.
func Run(ctx context.Context, cfg *config.Config, log logr.Logger) error {
	if cfg.PodName == "" {
		cfg.PodName, _ = os.Hostname()
	}
	// Both ports are bound before anything starts: a sidecar whose harness
	// cannot reach it must not consume a command.
	probeLn, apiLn, err := listen(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = probeLn.Close(); _ = apiLn.Close() }()

	kube, err := newKube(cfg)
	if err != nil {
		return err
	}
	defer kube.stopEvents()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	// Probes first, so liveness answers while everything else starts. The
	// probe server and the cache run until Run returns; wg waits for both.
	ready := &server.Readiness{}
	var cacheSynced server.Flag
	ready.Add("kubernetes-cache", cacheSynced.Err)
	var (
		wg      sync.WaitGroup
		drainer drainTarget
	)
	probeCtx, stopProbes := context.WithCancel(context.WithoutCancel(ctx))
	defer func() { stopProbes(); wg.Wait() }()
	probes := server.ProbeHandler(ready, reg)
	probes.Handle("/drain", drainHandler(cfg, kube.reader, &drainer, log.WithName("drain")))
	wg.Go(func() {
		if err := server.Serve(probeCtx, probeLn, probes, log.WithName("probes")); err != nil {
			log.Error(err, "Probe server failed")
		}
	})

	cacheCtx, stopCache := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCache()
	wg.Go(func() {
		if err := kube.cache.Start(cacheCtx); err != nil {
			log.Error(err, "Object cache failed")
		}
	})
	if err := kube.waitForCache(ctx); err != nil {
		return err
	}
	cacheSynced.Set(nil)

	b, err := dialBroker(ctx, cfg, m, log, func() {
		kube.recorder.Eventf(harnessRef(cfg), corev1.EventTypeNormal, ReasonBrokerCredentialsChanged,
			"Pod %s read new broker credentials from its Secret; its next connection uses them", cfg.PodName)
	})
	if err != nil {
		return err
	}
	defer b.close(log)
	ready.Add("amqp", b.ready)
	if err := b.start(ctx); err != nil {
		return err
	}

	clk := clock.RealClock{}
	sw := status.New(status.Options{Client: kube.client, Namespace: cfg.Namespace, Clock: clk, Metrics: m, Log: log.WithName("status")})
	// Stopped after the mode's Run returned, so the last status is flushed.
	defer runUntilStopped(ctx, func(ctx context.Context) {
		if err := sw.Run(ctx); err != nil {
			log.Error(err, "Failed to write the last HCPSession status")
		}
	})()

	others := &otherWriters{ctx: ctx, log: log.WithName("status"),
		opts: status.Options{Client: kube.client, Clock: clk, Metrics: m, Log: log.WithName("status")}}
	defer others.stop()

	sidecar, err := newMode(ctx, cfg, kube, b, sw, others, m, clk, log)
	if err != nil {
		return err
	}
	ready.Add(string(cfg.Mode), sidecar.Ready)
	drainer.set(sidecar)

	// The local API outlives the mode's Run: a callee harness reports the
	// end of its sessions during the shutdown drain.
	defer runUntilStopped(ctx, func(ctx context.Context) {
		if err := server.Serve(ctx, apiLn, sidecar.Handler(), log.WithName("api")); err != nil {
			log.Error(err, "Local API server failed")
		}
	})()

	log.Info("Started", "pod", cfg.PodName, "namespace", cfg.Namespace, "vhost", cfg.Vhost, "api", cfg.APIAddr, "probes", cfg.ProbeAddr)
	return sidecar.Run(ctx)
}

// listen binds the probe address, then the local API's.
func listen(cfg *config.Config) (probes, api net.Listener, err error) {
	if probes, err = net.Listen("tcp", cfg.ProbeAddr); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", config.EnvProbeAddr, err)
	}
	if api, err = net.Listen("tcp", cfg.APIAddr); err != nil {
		_ = probes.Close()
		return nil, nil, fmt.Errorf("%s: %w", config.EnvAPIAddr, err)
	}
	return probes, api, nil
}

// newMode builds the callee or the caller of cfg.Mode; in callee mode it
// first takes the pod's owner Lease and keeps it until ctx ends.
func newMode(ctx context.Context, cfg *config.Config, kube *kube, b *broker, sw *status.Writer, others *otherWriters, m *metrics.Metrics, clk clock.WithTickerAndDelayedExecution, log logr.Logger) (mode, error) {
	switch cfg.Mode {
	case config.ModeCallee:
		keeper, err := podLease(ctx, cfg, kube.reader, log)
		if err != nil {
			return nil, err
		}
		go keeper.Run(ctx)
		return callee.New(callee.Options{
			Config: cfg, Client: kube.client, Reader: kube.reader, Cache: kube.cache, Conn: b.consume,
			Publisher: b.publisher, Consumer: b.consume, Status: sw, Metrics: m, Log: log, Clock: clk, Lease: keeper, Recorder: kube.recorder,
		})
	case config.ModeCaller:
		return caller.New(caller.Options{
			Config: cfg, Client: kube.client, Reader: kube.reader, Publisher: b.publisher, Consumer: b.consume, Status: sw, StatusIn: others.in,
			Metrics: m, Log: log, Clock: clk,
			Recorder: kube.recorder,
		})
	}
	return nil, fmt.Errorf("%s: unknown mode %q", config.EnvMode, cfg.Mode)
}

// runUntilStopped runs f in a goroutine with a context that keeps ctx's
// values but not its end, and returns what stops it: cancel that context
// and wait for f to return.
func runUntilStopped(ctx context.Context, f func(context.Context)) (stop func()) {
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(fctx)
	}()
	return func() { cancel(); <-done }
}

// Compile-time checks that both modes are what Run drives.
var (
	_ mode = (*callee.Sidecar)(nil)
	_ mode = (*caller.Sidecar)(nil)
)

// ReasonBrokerCredentialsChanged is the Event a sidecar records on its
// Callee or Caller when the mounted broker credentials change (a rotation).
const ReasonBrokerCredentialsChanged = "BrokerCredentialsChanged"

// harnessRef is the sidecar's Callee or Caller.
func harnessRef(cfg *config.Config) *corev1.ObjectReference {
	kind := "Callee"
	if cfg.Mode == config.ModeCaller {
		kind = "Caller"
	}
	return events.Ref(kind, cfg.Namespace, cfg.ObjectName, "")
}
