package callee

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestBinaries runs the real cmd/hcp-sidecar (callee mode) and
// cmd/sample-callee as processes, configured only through the environment
// contract, against the API server and the broker: a task completes, the
// probes answer, and SIGTERM stops the sidecar cleanly.
func TestBinaries(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true})
	bin := buildCmds(t, "hcp-sidecar", "sample-callee")
	a := freeAddrs(t, 3)
	apiAddr, probeAddr, harnessAddr := a[0], a[1], a[2]
	keyPEM, err := token.MarshalPrivateKeyPEM(b.key)
	must(t, err)

	harness := exec.Command(filepath.Join(bin, "sample-callee"), "--listen", harnessAddr, "--sidecar", "http://"+apiAddr)
	harness.Stdout, harness.Stderr = testWriter{t, "sample-callee"}, testWriter{t, "sample-callee"}
	must(t, harness.Start())
	t.Cleanup(func() { _ = harness.Process.Kill(); _ = harness.Wait() })

	// The broker URL and the token key as a pod gets them: files of
	// mounted Secrets, not environment variables.
	credsDir, tokenDir := t.TempDir(), t.TempDir()
	testbed.WriteSecretVolume(t, credsDir, map[string][]byte{resource.CredentialsURIKey: []byte(b.broker.AMQPURI(b.calleeU, password, b.vhost))})
	testbed.WriteSecretVolume(t, tokenDir, map[string][]byte{resource.TokenPrivateKeyKey: keyPEM})
	sc := exec.Command(filepath.Join(bin, "hcp-sidecar"), "--mode=callee")
	sc.Env = append(os.Environ(),
		"KUBECONFIG="+b.env.Kubeconfig,
		config.EnvID+"="+calleeID,
		config.EnvObjectName+"="+calleeID,
		config.EnvNamespace+"="+b.ns,
		config.EnvPodName+"="+b.pod,
		config.EnvVhost+"="+b.vhost,
		config.EnvAMQPURLFile+"="+filepath.Join(credsDir, resource.CredentialsURIKey),
		config.EnvUsername+"="+b.calleeU,
		config.EnvTokenKeyFile+"="+filepath.Join(tokenDir, resource.TokenPrivateKeyKey),
		config.EnvHarnessURL+"=http://"+harnessAddr,
		config.EnvAPIAddr+"="+apiAddr,
		config.EnvProbeAddr+"="+probeAddr,
	)
	sc.Stdout, sc.Stderr = testWriter{t, "hcp-sidecar"}, testWriter{t, "hcp-sidecar"}
	must(t, sc.Start())
	exited := make(chan error, 1)
	go func() { exited <- sc.Wait() }()
	t.Cleanup(func() {
		_ = sc.Process.Kill()
		select {
		case err := <-exited:
			t.Logf("hcp-sidecar exited: %v", err)
		case <-time.After(5 * time.Second):
		}
	})

	testbed.Eventually(t, 60*time.Second, "/readyz", func(ctx context.Context) error {
		select {
		case err := <-exited:
			return fmt.Errorf("the sidecar exited: %v", err)
		default:
		}
		code, body := httpGet(ctx, "http://"+probeAddr+"/readyz")
		if code != 200 {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})

	_, sid, _ := b.submit(newSubmit(nil))
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v", closed)
	}
	b.waitState(sid, v1alpha1.SessionCompleted, 10*time.Second)
	if code, body := httpGet(t.Context(), "http://"+probeAddr+"/metrics"); code != 200 ||
		!strings.Contains(body, `hcp_sidecar_messages_in_total{type="task_submit"} 1`) ||
		!strings.Contains(body, `hcp_sidecar_amqp_connected{connection="publish"} 1`) ||
		!strings.Contains(body, `hcp_sidecar_amqp_connected{connection="consume"} 1`) {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	// Publishing and consuming on separate connections: flow control on the
	// publishing one (connection.blocked) never stops the consumer.
	testbed.Eventually(t, 30*time.Second, "one publish and one consume connection", func(context.Context) error {
		conns, err := b.broker.API.ListConnections()
		if err != nil {
			return err
		}
		var names []string
		byName := map[string]string{} // the broker's connection name → connection_name
		for _, c := range conns {
			if c.User == b.calleeU {
				n, _ := c.ClientProperties["connection_name"].(string)
				names = append(names, n)
				byName[c.Name] = n
			}
		}
		slices.Sort(names)
		if len(names) != 2 || !strings.HasSuffix(names[0], " consume") || !strings.HasSuffix(names[1], " publish") {
			return fmt.Errorf("the sidecar's connections: %q", names)
		}
		cons, err := b.broker.API.ListConsumersIn(b.vhost)
		if err != nil {
			return err
		}
		found := false
		for _, c := range cons {
			if c.Queue.Name == topology.CommandQueue(calleeID) {
				if on := byName[c.ChannelDetails.ConnectionName]; !strings.HasSuffix(on, " consume") {
					return fmt.Errorf("the command queue is consumed on connection %q", on)
				}
				found = true
			}
		}
		if !found {
			return errors.New("no consumer on the command queue yet")
		}
		return nil
	})
	if code, _ := httpGet(t.Context(), "http://"+probeAddr+"/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	// Nothing secret in /proc/PID/environ.
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", sc.Process.Pid))
	must(t, err)
	if bytes.Contains(environ, []byte(password)) || bytes.Contains(environ, []byte("PRIVATE KEY")) {
		t.Fatal("the password or the token key is in the sidecar's environment")
	}
	// A password rotation: the broker user gets a new password, the
	// kubelet updates the file, the broker drops the connections; the
	// sidecar logs in again with the new password, without a restart.
	must(t, testbed.Answered(b.broker.API.PutUser(b.calleeU, rabbithole.UserSettings{Password: "rotated-pw", Tags: rabbithole.UserTags{}})))
	testbed.WriteSecretVolume(t, credsDir, map[string][]byte{resource.CredentialsURIKey: []byte(b.broker.AMQPURI(b.calleeU, "rotated-pw", b.vhost))})
	time.Sleep(1100 * time.Millisecond) // the sidecar looks at the file at most once a second
	must(t, b.broker.CloseConnectionsOf(b.calleeU))
	_, sid2, _ := b.submit(newSubmit(nil))
	if closed := closedOf(t, b, sid2); closed.FinalState != session.StateCompleted {
		t.Fatalf("after the rotation: session_closed = %+v", closed)
	}
	if code, body := httpGet(t.Context(), "http://"+probeAddr+"/metrics"); code != 200 ||
		!strings.Contains(body, `hcp_sidecar_amqp_reconnects_total{connection="consume"} 1`) {
		t.Fatalf("/metrics after the rotation: %d\n%s", code, body)
	}

	must(t, sc.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the sidecar exited with %v after SIGTERM", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("the sidecar did not stop within 40s of SIGTERM")
	}
}

// freeAddrs returns n distinct loopback addresses no one listens on.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	a, err := testbed.FreeAddrs(n)
	must(t, err)
	return a
}

func httpGet(ctx context.Context, url string) (int, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// testWriter sends a process's output to the test log.
type testWriter struct {
	t    *testing.T
	name string
}

func (w testWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Logf("%s: %s", w.name, l)
	}
	return len(p), nil
}

// buildCmds builds the named commands of cmd/ into a temporary directory
// and returns it.
func buildCmds(t *testing.T, cmds ...string) string {
	t.Helper()
	root, err := testbed.RepoRoot()
	must(t, err)
	bin := t.TempDir()
	for _, cmd := range cmds {
		build := exec.CommandContext(t.Context(), "go", "build", "-o", filepath.Join(bin, cmd), "./cmd/"+cmd)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/%s: %v\n%s", cmd, err, out)
		}
	}
	return bin
}

// sidecarProc is the hcp-sidecar binary (callee mode) running as the
// sidecar of one pod of the bed's Callee. A restart in the same pod is a
// new process with the same pod name, state directory and addresses.
type sidecarProc struct {
	cmd    *exec.Cmd
	exited chan error
}

// podAddrs are what a pod's sidecar process is started with.
type podAddrs struct {
	pod, stateDir, api, probe, harnessURL string
}

// startSidecarProc starts the sidecar binary in bin and waits until it is
// ready; the test's cleanup stops it (SIGTERM).
func (b *bed) startSidecarProc(bin string, p podAddrs) *sidecarProc {
	t := b.t
	t.Helper()
	keyPEM, err := token.MarshalPrivateKeyPEM(b.key)
	must(t, err)
	sc := exec.Command(filepath.Join(bin, "hcp-sidecar"), "--mode=callee")
	sc.Env = append(os.Environ(),
		"KUBECONFIG="+b.env.Kubeconfig,
		config.EnvID+"="+calleeID, config.EnvObjectName+"="+calleeID, config.EnvNamespace+"="+b.ns,
		config.EnvPodName+"="+p.pod, config.EnvVhost+"="+b.vhost,
		config.EnvAMQPURL+"="+b.broker.AMQPURI(b.calleeU, password, b.vhost), config.EnvUsername+"="+b.calleeU,
		config.EnvTokenKey+"="+string(keyPEM), config.EnvHarnessURL+"="+p.harnessURL,
		config.EnvAPIAddr+"="+p.api, config.EnvProbeAddr+"="+p.probe, config.EnvStateDir+"="+p.stateDir,
	)
	sc.Stdout, sc.Stderr = testWriter{t, "hcp-sidecar " + p.pod}, testWriter{t, "hcp-sidecar " + p.pod}
	must(t, sc.Start())
	proc := &sidecarProc{cmd: sc, exited: make(chan error, 1)}
	go func() { proc.exited <- sc.Wait() }()
	t.Cleanup(proc.stop)
	testbed.Eventually(t, 60*time.Second, "/readyz", func(ctx context.Context) error {
		select {
		case err := <-proc.exited:
			proc.exited <- err
			return fmt.Errorf("the sidecar exited: %v", err)
		default:
		}
		if code, body := httpGet(ctx, "http://"+p.probe+"/readyz"); code != 200 {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	return proc
}

// kill SIGKILLs the sidecar and waits for it to be gone.
func (p *sidecarProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	err := <-p.exited
	p.exited <- err
}

// stop SIGTERMs the sidecar (SIGKILL after 30 s).
func (p *sidecarProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.exited <- err
	case <-time.After(30 * time.Second):
		p.kill()
	}
}
