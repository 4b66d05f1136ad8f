// Command podrunner is the node agent of the local stack (hack/local-stack.sh):
// a minimal kubelet for a machine without a container runtime. It registers a
// Node, keeps its Lease fresh, and runs the Pods the scheduler binds to it as
// local processes, each from the binary its image maps to (an image table,
// see images.go), with the environment, arguments, volumes and security
// context of its spec:
//
//   - one network namespace per Pod (veth pair to a bridge holding the node's
//     address), so two Pods can both listen on 127.0.0.1:9090;
//   - one mount and UTS namespace per container: Secret, ConfigMap,
//     projected (service-account token through the TokenRequest API),
//     downward-API, emptyDir and hostPath volumes bind-mounted at their
//     mountPath, the kubelet-style /etc/hosts, the hostname, a read-only root
//     filesystem when asked;
//   - the container's user (runAsUser/runAsGroup, else the image's USER),
//     no_new_privs when privilege escalation is off;
//   - restarts with the kubelet's back-off, startup/liveness/readiness probes
//     (HTTP, TCP, exec), graceful termination, and a Pod status computed from
//     what really runs;
//   - logs in LOG_DIR/<namespace>_<pod>_<container>.log, also served to
//     `kubectl logs` through a kubelet-compatible /containerLogs endpoint.
//
// It talks to the API server as system:node:<name>, so the Node authorizer
// and NodeRestriction limit what it (and so each Pod) can read, as they
// limit a kubelet. It must run as root (namespaces, mounts, setuid).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	if len(os.Args) > 1 && os.Args[1] == initCommand {
		containerInit()
		return
	}
	var (
		o        options
		forwards stringList
		extraIPs stringList
	)
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig with the node's credentials (CN=system:node:NAME, O=system:nodes)")
	flag.StringVar(&o.nodeName, "node-name", "hcp-local", "name of the Node to register")
	flag.StringVar(&o.stateDir, "state-dir", "", "directory for per-pod state (volumes, pid files)")
	flag.StringVar(&o.logDir, "log-dir", "", "directory for container logs")
	flag.StringVar(&o.imagesFile, "images", "", "image table (YAML): which local binaries stand for which images")
	flag.StringVar(&o.bridge, "bridge", "hcp0", "bridge the pods' veths attach to")
	flag.StringVar(&o.podCIDR, "pod-cidr", "10.250.0.0/16", "pod addresses; the first is the bridge's (the node's InternalIP)")
	flag.Var(&extraIPs, "bridge-address", "extra address to hold on the bridge, e.g. the kubernetes Service's ClusterIP (repeatable)")
	flag.Var(&forwards, "forward", "LISTEN=TARGET TCP relay, e.g. 10.251.0.1:443=127.0.0.1:16443 (repeatable)")
	flag.IntVar(&o.kubeletPort, "kubelet-port", 10350, "port of the kubelet API (logs) on the node's address")
	flag.StringVar(&o.tlsCert, "tls-cert-file", "", "serving certificate of the kubelet API")
	flag.StringVar(&o.tlsKey, "tls-private-key-file", "", "serving key of the kubelet API")
	flag.StringVar(&o.clientCA, "client-ca-file", "", "CA of the API server's kubelet client certificate")
	flag.StringVar(&o.kubernetesVersion, "kubernetes-version", "v0.0.0", "version the Node reports as its kubelet's")
	cpu := flag.String("cpu", fmt.Sprint(runtime.NumCPU()), "CPU capacity the Node advertises (not enforced)")
	mem := flag.String("memory", "", "memory capacity the Node advertises (default: the machine's; not enforced)")
	flag.IntVar(&o.maxPods, "max-pods", 110, "pod capacity of the Node")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	fail := func(err error) {
		log.Error("Pod runner failed", "err", err)
		os.Exit(1)
	}
	if os.Geteuid() != 0 {
		fail(fmt.Errorf("must run as root (network and mount namespaces, setuid)"))
	}
	for _, req := range []struct{ v, flag string }{{o.kubeconfig, "kubeconfig"}, {o.stateDir, "state-dir"}, {o.logDir, "log-dir"}, {o.imagesFile, "images"}} {
		if req.v == "" {
			fail(fmt.Errorf("--%s is required", req.flag))
		}
	}
	for _, f := range forwards {
		fw, err := parseForward(f)
		if err != nil {
			fail(err)
		}
		o.forwards = append(o.forwards, fw)
	}
	var extra []netip.Addr
	for _, s := range extraIPs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			fail(fmt.Errorf("--bridge-address %q: %w", s, err))
		}
		extra = append(extra, a)
	}
	var err error
	if o.cpu, err = resource.ParseQuantity(*cpu); err != nil {
		fail(fmt.Errorf("--cpu: %w", err))
	}
	if *mem == "" {
		*mem = machineMemory()
	}
	if o.memory, err = resource.ParseQuantity(*mem); err != nil {
		fail(fmt.Errorf("--memory: %w", err))
	}
	if o.net, err = newNetwork(o.bridge, o.podCIDR, extra); err != nil {
		fail(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		fail(err)
	}
	cfg.UserAgent = "hcp-podrunner/" + o.nodeName
	cfg.QPS, cfg.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	r := newRunner(o, cs, log)
	if err := r.run(ctx); err != nil {
		fail(err)
	}
	log.Info("Pod runner stopped")
}

// machineMemory is MemTotal from /proc/meminfo, as a quantity.
func machineMemory() string {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "8Gi"
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				return f[0] + "Ki"
			}
		}
	}
	return "8Gi"
}
