//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// config is the suite's environment; see README.md for the variables.
type config struct {
	// existing: HCP_E2E_USE_EXISTING_CLUSTER=1, the cluster in KUBECONFIG.
	existing bool
	root     string
	kubectl  string
	helm     string
	// stackLogs is the local stack's container log directory
	// ($HCP_STACK_LOGS); empty on other clusters (kubectl logs then).
	stackLogs string
	// managementURL is where the suite reads the broker; brokerURI and
	// amqpURL go into the chart's connection Secret (uri: the topology
	// operator's view of the management API; amqpURL: the sidecars' view of
	// AMQP, from inside their pods).
	managementURL, brokerURI, amqpURL string
	username, password                string
	// helmArgs are extra `helm template` arguments (HCP_E2E_HELM_ARGS).
	helmArgs []string
	// calleeImage and callerImage override the samples' harness images.
	calleeImage, callerImage string
	otherManagers            string // pause, fail, ignore
	keep                     bool
	// stackStarted: this run brought the local stack up (and stops it).
	stackStarted bool
	// rmqNodes are the three-node cluster's AMQP URLs as this process
	// reaches them (HCP_E2E_RABBITMQ_CLUSTER=1; rmqcluster_test.go), nil
	// on the one-node broker.
	rmqNodes []string
}

var cfg config

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	start := time.Now()
	code := 1
	if err := setup(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: setup: %v\n", err)
	} else {
		code = m.Run()
	}
	if cfg.stackStarted && !cfg.keep && os.Getenv("HCP_E2E_KEEP_STACK") != "1" {
		done := timed("local stack down")
		if err := runStreaming(context.Background(), filepath.Join(cfg.root, "hack", "local-stack.sh"), "down"); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: hack/local-stack.sh down: %v\n", err)
		}
		done()
	}
	record("total", time.Since(start))
	printTimings(os.Stdout)
	printFailures(os.Stdout)
	// go test shows a passing package's output only with -v; the summary
	// can go to a file too.
	if path := os.Getenv("HCP_E2E_TIMINGS"); path != "" {
		if f, err := os.Create(path); err == nil {
			printTimings(f)
			_ = f.Close()
		}
	}
	return code
}

func setup() error {
	root, err := testbed.RepoRoot()
	if err != nil {
		return err
	}
	cfg = config{
		existing:      os.Getenv("HCP_E2E_USE_EXISTING_CLUSTER") == "1",
		root:          root,
		otherManagers: envOr("HCP_E2E_OTHER_MANAGERS", "pause"),
		keep:          os.Getenv("HCP_E2E_KEEP") == "1",
		helmArgs:      strings.Fields(os.Getenv("HCP_E2E_HELM_ARGS")),
		calleeImage:   os.Getenv("HCP_E2E_CALLEE_IMAGE"),
		callerImage:   os.Getenv("HCP_E2E_CALLER_IMAGE"),
		username:      envOr("RABBITMQ_USERNAME", testbed.DefaultUsername),
		password:      envOr("RABBITMQ_PASSWORD", testbed.DefaultPassword),
	}
	if cfg.existing {
		if os.Getenv("KUBECONFIG") == "" {
			return errors.New("HCP_E2E_USE_EXISTING_CLUSTER=1 needs KUBECONFIG")
		}
		// Logs of the local stack, when KUBECONFIG is in fact the local
		// stack's and its environment was loaded.
		cfg.stackLogs = os.Getenv("HCP_STACK_LOGS")
	} else if err := localStack(); err != nil {
		return err
	}
	if os.Getenv("HCP_E2E_RABBITMQ_CLUSTER") == "1" {
		if err := rabbitmqCluster(); err != nil {
			return err
		}
	}
	cfg.managementURL = firstOf(os.Getenv("HCP_E2E_MANAGEMENT_URL"), os.Getenv("HCP_STACK_MANAGEMENT_URL"), os.Getenv("RABBITMQ_MANAGEMENT_URL"), testbed.DefaultManagementURL)
	cfg.brokerURI = firstOf(os.Getenv("HCP_E2E_BROKER_URI"), cfg.managementURL)
	cfg.amqpURL = firstOf(os.Getenv("HCP_E2E_BROKER_AMQP_URL"), os.Getenv("HCP_STACK_AMQP_URL"))
	if cfg.amqpURL == "" {
		return errors.New("no AMQP URL for the pods: set HCP_E2E_BROKER_AMQP_URL (amqp://HOST:PORT as pods reach the broker)")
	}
	if cfg.kubectl, err = exec.LookPath(envOr("HCP_E2E_KUBECTL", "kubectl")); err != nil {
		return fmt.Errorf("kubectl: %w (set HCP_E2E_KUBECTL)", err)
	}
	if cfg.helm, err = helmBinary(); err != nil {
		return err
	}
	return nil
}

// localStack reuses the local stack when it runs (with this tree's images)
// and brings it up otherwise, then loads its environment (KUBECONFIG, PATH
// with kubectl, HCP_STACK_*) into this process.
func localStack() error {
	script := filepath.Join(cfg.root, "hack", "local-stack.sh")
	ctx := context.Background()
	done := timed("local stack")
	defer done()
	_, envErr := output(ctx, script, "env")
	if envErr == nil {
		// Its state exists: are its processes all running? (status finds
		// kubectl through hack/testbed-k8s.sh, which is instant once built.)
		if _, err := output(ctx, script, "status"); err == nil {
			fmt.Fprintln(os.Stderr, "e2e: reusing the running local stack")
			if err := loadStackEnv(script); err != nil {
				return err
			}
			// `up` builds and imports the images; a running stack may hold
			// an older build.
			return buildImages()
		}
	} else if addr := "127.0.0.1:" + envOr("HCP_APISERVER_PORT", "16443"); listening(addr) {
		// No stack in our state directory, but its API server port is taken.
		return fmt.Errorf("no local stack state in this HCP_STACK_DIR, but %s is in use: another local stack probably runs with another "+
			"HCP_STACK_DIR or XDG_CACHE_HOME; set them to reuse it, or stop it first (only one stack can run at a time)", addr)
	}
	if os.Geteuid() != 0 {
		return errors.New("the local stack needs root (network namespaces, mounts); run as root, or set HCP_E2E_USE_EXISTING_CLUSTER=1")
	}
	fmt.Fprintln(os.Stderr, "e2e: bringing the local stack up (hack/local-stack.sh up)")
	if err := runStreaming(ctx, script, "up"); err != nil {
		return fmt.Errorf("hack/local-stack.sh up: %w", err)
	}
	cfg.stackStarted = true
	return loadStackEnv(script)
}

// loadStackEnv applies `hack/local-stack.sh env` (lines `export K=V`, where
// V may refer to variables already set, as PATH does).
func loadStackEnv(script string) error {
	out, err := output(context.Background(), script, "env")
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if err := os.Setenv(k, os.ExpandEnv(strings.Trim(v, `"'`))); err != nil {
			return err
		}
	}
	cfg.stackLogs = os.Getenv("HCP_STACK_LOGS")
	if os.Getenv("KUBECONFIG") == "" {
		return fmt.Errorf("hack/local-stack.sh env gave no KUBECONFIG:\n%s", out)
	}
	return nil
}

// buildImages builds the project's images from the working tree (`make
// images`: OCI archives, offline) and imports them into the local stack's
// node (hack/local-stack.sh images), so the pods the suite creates run this
// build. An unchanged image imports as the same digest.
func buildImages() error {
	defer timed("build and import images")()
	if err := runStreaming(context.Background(), filepath.Join(cfg.root, "hack", "local-stack.sh"), "images"); err != nil {
		return fmt.Errorf("hack/local-stack.sh images: %w", err)
	}
	return nil
}

// helmBinary: $HELM, else the Makefile's pinned helm (`make helm` installs
// it into bin/ on first use).
func helmBinary() (string, error) {
	if h := os.Getenv("HELM"); h != "" {
		return h, nil
	}
	mk, err := os.ReadFile(filepath.Join(cfg.root, "Makefile"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^HELM_VERSION \?= *(\S+)`).FindSubmatch(mk)
	if m == nil {
		return "", errors.New("no HELM_VERSION in the Makefile")
	}
	h := filepath.Join(cfg.root, "bin", "helm-"+string(m[1]))
	if _, err := os.Stat(h); err != nil {
		cmd := exec.Command("make", "-s", "--no-print-directory", "helm")
		cmd.Dir = cfg.root
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("make helm: %w\n%s", err, out)
		}
	}
	return h, nil
}

// output runs a command and returns its stdout; the error quotes stderr.
func output(ctx context.Context, name string, args ...string) (string, error) {
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = cfg.root
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

// runStreaming runs a command with its output on this process's stderr
// (progress of long steps; go test shows it with -v or on failure).
func runStreaming(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = cfg.root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// Timings of the suite's phases, printed at the end.
var (
	timingsMu sync.Mutex
	timings   []timing
)

type timing struct {
	name string
	d    time.Duration
}

func record(name string, d time.Duration) {
	timingsMu.Lock()
	defer timingsMu.Unlock()
	timings = append(timings, timing{name, d})
}

// timed starts timing a phase; call the result when it ends.
func timed(name string) func() {
	start := time.Now()
	return func() { record(name, time.Since(start)) }
}

func printTimings(w io.Writer) {
	timingsMu.Lock()
	defer timingsMu.Unlock()
	var b strings.Builder
	b.WriteString("e2e timings:\n")
	for _, t := range timings {
		fmt.Fprintf(&b, "  %-40s %8.1fs\n", t.name, t.d.Seconds())
	}
	_, _ = io.WriteString(w, b.String())
}
