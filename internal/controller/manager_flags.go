package controller

import (
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hcp-io/hcp-operator/internal/resource"
)

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
	fs.StringVar(&c.CalleeSidecarClusterRole, "callee-sidecar-cluster-role", c.CalleeSidecarClusterRole,
		"ClusterRole granted to each callee sidecar in its namespace, as the install names it (config/rbac, the chart).")
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
