package testbed

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

var mtoBinary once[string]

// BuildTopologyOperator returns the path of the messaging-topology-operator
// binary, building it from its Go module when missing (hack/testbed-mto.sh:
// a few minutes cold, instant afterwards).
func BuildTopologyOperator(ctx context.Context) (string, error) {
	return mtoBinary.do(func() (string, error) {
		// Not ctx: the result is shared by the whole process.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Minute)
		defer cancel()
		bin, _, err := runScript(ctx, "testbed-mto.sh", "build")
		return bin, err
	})
}

// TopologyOperator is a messaging-topology-operator running as a subprocess.
type TopologyOperator struct {
	Binary    string
	Namespace string
	// LogPath is the file that receives the operator's stdout and stderr.
	LogPath string
	// ProbeAddr serves /healthz and /readyz.
	ProbeAddr string

	cmd      *exec.Cmd
	done     chan struct{} // closed when the process has exited
	exitErr  error
	stopOnce sync.Once
	dumped   bool
}

// StartTopologyOperator runs the topology operator against kubeconfig, with
// OPERATOR_NAMESPACE=namespace and webhooks off, until the test ends. It
// watches all namespaces; leader election and metrics are off and the probes
// take a free port, so several can run at once (against different API
// servers: two on one API server would both reconcile). It returns once the
// operator's readiness probe answers. Its log is kept under t.TempDir() and
// printed when the test fails.
func StartTopologyOperator(t testing.TB, kubeconfig, namespace string) *TopologyOperator {
	t.Helper()
	start := time.Now()
	logPath := filepath.Join(t.TempDir(), "messaging-topology-operator.log")
	o, err := RunTopologyOperator(t.Context(), kubeconfig, namespace, logPath)
	if err != nil {
		t.Fatalf("testbed: %v", err)
	}
	t.Cleanup(func() {
		if err := o.Stop(); err != nil {
			t.Errorf("testbed: stop topology operator: %v", err)
		}
		if t.Failed() {
			o.dump(t)
		}
	})
	t.Logf("testbed: topology operator ready in %s (log %s)", time.Since(start).Round(time.Millisecond), o.LogPath)
	return o
}

// RunTopologyOperator is StartTopologyOperator for TestMain: the caller
// stops it, and its log goes to logPath.
func RunTopologyOperator(ctx context.Context, kubeconfig, namespace, logPath string) (*TopologyOperator, error) {
	bin, err := BuildTopologyOperator(ctx)
	if err != nil {
		return nil, fmt.Errorf("build the topology operator: %w", err)
	}
	probe, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	o := &TopologyOperator{
		Binary:    bin,
		Namespace: namespace,
		LogPath:   logPath,
		ProbeAddr: probe,
		done:      make(chan struct{}),
	}
	logFile, err := os.Create(o.LogPath)
	if err != nil {
		return nil, err
	}
	// Same flags and environment as `hack/testbed-mto.sh run`.
	o.cmd = exec.Command(bin,
		"--kubeconfig="+kubeconfig,
		"--health-probe-bind-address="+o.ProbeAddr,
		"--metrics-bind-address=0",
		"--leader-elect=false",
	)
	o.cmd.Env = append(os.Environ(),
		"KUBECONFIG="+kubeconfig,
		"ENABLE_WEBHOOKS=false",         // webhooks need certificates and a Service
		"OPERATOR_NAMESPACE="+namespace, // replaces the in-cluster service-account namespace file
	)
	o.cmd.Stdout, o.cmd.Stderr = logFile, logFile
	// Own process group: a Ctrl-C on go test must not race our SIGTERM.
	o.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := o.cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		o.exitErr = o.cmd.Wait()
		_, _ = fmt.Fprintf(logFile, "testbed: process exited: %v\n", o.exitErr)
		_ = logFile.Close()
		close(o.done)
	}()
	if err := o.waitReady(ctx, 60*time.Second); err != nil {
		_ = o.Stop()
		return nil, fmt.Errorf("topology operator: %w", err)
	}
	return o, nil
}

func (o *TopologyOperator) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	url := "http://" + o.ProbeAddr + "/readyz"
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-o.done:
			return fmt.Errorf("exited before it was ready: %v\n%s", o.exitErr, o.Logs())
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer within %s\n%s", url, timeout, o.Logs())
		case <-tick.C:
		}
	}
}

// Exited reports whether the process has ended (crashed, or stopped).
func (o *TopologyOperator) Exited() bool {
	select {
	case <-o.done:
		return true
	default:
		return false
	}
}

// Stop stops the operator: SIGTERM, then SIGKILL after 10s. Idempotent.
func (o *TopologyOperator) Stop() error {
	var err error
	o.stopOnce.Do(func() {
		if o.Exited() {
			return
		}
		_ = o.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-o.done:
		case <-time.After(10 * time.Second):
			_ = o.cmd.Process.Kill()
			<-o.done
			err = errors.New("did not stop within 10s of SIGTERM; killed")
		}
	})
	return err
}

// Logs returns the operator's log so far (its last 256 KiB).
func (o *TopologyOperator) Logs() string {
	b, err := os.ReadFile(o.LogPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", o.LogPath, err)
	}
	return tail(string(b), 256<<10)
}

func (o *TopologyOperator) dump(t testing.TB) {
	if o.dumped {
		return
	}
	o.dumped = true
	t.Logf("testbed: messaging-topology-operator log (%s):\n%s", o.LogPath, o.Logs())
}
