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
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Pod access. The caller sidecar's local API listens on the pod's
// 127.0.0.1:9090 only (as it must: it is the app's, not the network's), and
// the sample caller app serves GET /received on the pod's port 8080. The
// suite reaches both the way a user reaches a pod's loopback: `kubectl
// port-forward`, served by the node's kubelet and containerd.

// podHTTP returns an HTTP client whose connections to 127.0.0.1:PORT (any
// of ports) reach the pod's own loopback, until the test ends.
func (s *suite) podHTTP(t testing.TB, pod *corev1.Pod, ports ...int) *http.Client {
	t.Helper()
	hc, stop, err := s.openPodHTTP(pod, ports...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	t.Logf("pod %s/%s: reaching its 127.0.0.1 through kubectl port-forward", pod.Namespace, pod.Name)
	return hc
}

// openPodHTTP is podHTTP for a caller that outlives no test, or that must
// open a new port-forward when one ends (kubectl port-forward exits when
// the pod's connection breaks): call stop when done.
func (s *suite) openPodHTTP(pod *corev1.Pod, ports ...int) (*http.Client, func(), error) {
	local, stopForward, err := s.startPortForward(pod, ports)
	if err != nil {
		return nil, nil, err
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
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
	tr := &http.Transport{DialContext: dial, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}
	stop := func() {
		tr.CloseIdleConnections()
		stopForward()
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, stop, nil
}

var forwardLine = regexp.MustCompile(`^Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)`)

// startPortForward runs `kubectl port-forward` to the pod's ports and
// returns the local port of each, and how to stop it.
func (s *suite) startPortForward(pod *corev1.Pod, ports []int) (map[string]string, func(), error) {
	args := make([]string, 0, 6+len(ports))
	args = append(args, "port-forward", "-n", pod.Namespace, "pod/"+pod.Name, "--address", "127.0.0.1")
	for _, p := range ports {
		args = append(args, fmt.Sprintf(":%d", p))
	}
	cmd := exec.Command(s.cfg.kubectl, args...)
	cmd.Env = os.Environ()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("kubectl port-forward: %w", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
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
		return local, stop, nil
	case <-exited:
		stop()
		return nil, nil, fmt.Errorf("kubectl %s: %s", strings.Join(args, " "), stderr.String())
	case <-time.After(30 * time.Second):
		stop()
		return nil, nil, fmt.Errorf("kubectl %s: no forwarding within 30s: %s", strings.Join(args, " "), stderr.String())
	}
}
