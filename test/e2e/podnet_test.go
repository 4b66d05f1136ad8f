//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// Pod access. The caller sidecar's local API listens on the pod's
// 127.0.0.1:9090 only (as it must: it is the app's, not the network's), and
// the sample caller app serves GET /received on the pod's port 8080. The
// suite reaches both the way a user would reach a pod's loopback:
//
//   - netns: on the local stack every Pod has a network namespace of its
//     own, `ip netns` name hcp-<pod UID> (hack/podrunner). The suite dials
//     from inside it (setns on a locked OS thread, only for the connect):
//     what `ip netns exec hcp-<uid> curl http://127.0.0.1:9090/...` does,
//     without a curl per request.
//   - port-forward: on any other cluster, `kubectl port-forward` to the pod
//     (the pod runner does not implement port-forward, real kubelets do).
//
// HCP_E2E_POD_ACCESS=netns|port-forward forces one; auto (the default)
// takes netns when the pod's namespace exists on this machine.

const netnsDir = "/var/run/netns"

// podHTTP returns an HTTP client whose connections to 127.0.0.1:PORT (any
// of ports) reach the pod's own loopback.
func (s *suite) podHTTP(t testing.TB, pod *corev1.Pod, ports ...int) *http.Client {
	t.Helper()
	mode := s.cfg.podAccess
	netns := netnsDir + "/hcp-" + string(pod.UID)
	if mode == "auto" {
		mode = "port-forward"
		if _, err := os.Stat(netns); err == nil {
			mode = "netns"
		}
	}
	var dial func(ctx context.Context, network, addr string) (net.Conn, error)
	switch mode {
	case "netns":
		if _, err := os.Stat(netns); err != nil {
			t.Fatalf("pod %s/%s: no network namespace %s (is this the local stack's pod runner? HCP_E2E_POD_ACCESS=port-forward otherwise): %v",
				pod.Namespace, pod.Name, netns, err)
		}
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialInNetns(ctx, netns, network, addr)
		}
	case "port-forward":
		local := s.portForward(t, pod, ports)
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			lp, ok := local[port]
			if !ok || (host != "127.0.0.1" && host != "localhost") {
				return nil, fmt.Errorf("no port-forward to %s in pod %s/%s", addr, pod.Namespace, pod.Name)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, "127.0.0.1:"+lp)
		}
	default:
		t.Fatalf("HCP_E2E_POD_ACCESS=%q: want auto, netns or port-forward", mode)
	}
	t.Logf("pod %s/%s: reaching its 127.0.0.1 through %s", pod.Namespace, pod.Name, mode)
	tr := &http.Transport{DialContext: dial, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// dialInNetns connects from inside the network namespace at path. The
// socket is created in that namespace and stays there; the thread is moved
// back before it is released, or, when that fails, never reused (a locked
// thread whose goroutine exits is terminated).
func dialInNetns(ctx context.Context, path, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer func() { _ = orig.Close() }()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer func() { _ = target.Close() }()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("setns %s: %w", path, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if rerr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); rerr != nil {
			// Leave the thread locked: it dies with this goroutine.
			if c != nil {
				_ = c.Close()
			}
			ch <- result{err: fmt.Errorf("setns back to the host network: %w", rerr)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

var forwardLine = regexp.MustCompile(`^Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)`)

// portForward runs `kubectl port-forward` to the pod's ports until the test
// ends and returns the local port of each.
func (s *suite) portForward(t testing.TB, pod *corev1.Pod, ports []int) map[string]string {
	t.Helper()
	args := make([]string, 0, 6+len(ports))
	args = append(args, "port-forward", "-n", pod.Namespace, "pod/"+pod.Name, "--address", "127.0.0.1")
	for _, p := range ports {
		args = append(args, fmt.Sprintf(":%d", p))
	}
	cmd := exec.Command(s.cfg.kubectl, args...)
	cmd.Env = os.Environ()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("kubectl port-forward: %v", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	local := map[string]string{}
	found, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited) // stdout closed: kubectl ended
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := forwardLine.FindStringSubmatch(sc.Text()); m != nil && len(local) < len(ports) {
				local[m[2]] = m[1]
				if len(local) == len(ports) {
					close(found)
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case <-found:
		return local
	case <-exited:
		stop()
		t.Fatalf("kubectl %s: %s", strings.Join(args, " "), stderr.String())
		return nil
	case <-time.After(30 * time.Second):
		stop()
		t.Fatalf("kubectl %s: no forwarding within 30s: %s", strings.Join(args, " "), stderr.String())
		return nil
	}
}
