package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probe runs a container's startup, liveness and readiness probes for one
// run of its process, from the node (as the kubelet does: HTTP and TCP
// probes reach the pod's address through the bridge).
func (w *podWorker) probe(ctx context.Context, c *ctr, p *proc) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.done:
		case <-ctx.Done():
		}
		cancel()
	}()
	spec := c.spec
	started := make(chan struct{})
	if spec.StartupProbe != nil {
		go func() {
			if w.runProbe(ctx, c, p, "Startup", spec.StartupProbe, true) {
				w.mu.Lock()
				c.started = true
				w.mu.Unlock()
				w.markStarted(c)
				w.changed()
				close(started)
			}
		}()
	} else {
		close(started)
	}
	if spec.LivenessProbe != nil {
		go func() {
			select {
			case <-started:
				w.runProbe(ctx, c, p, "Liveness", spec.LivenessProbe, false)
			case <-ctx.Done():
			}
		}()
	}
	select {
	case <-started:
	case <-ctx.Done():
		return
	}
	if spec.ReadinessProbe == nil {
		// Ready as soon as it runs (and has started).
		w.mu.Lock()
		c.ready = c.proc == p
		w.mu.Unlock()
		w.changed()
		<-ctx.Done()
		return
	}
	w.runProbe(ctx, c, p, "Readiness", spec.ReadinessProbe, false)
}

// runProbe probes until ctx ends; for Startup it returns true at the first
// success. Startup and liveness failures past the threshold restart the
// container; readiness results set the ready flag.
func (w *podWorker) runProbe(ctx context.Context, c *ctr, p *proc, kind string, pr *corev1.Probe, untilSuccess bool) bool {
	period := secondsOr(pr.PeriodSeconds, 10)
	timeout := secondsOr(pr.TimeoutSeconds, 1)
	successThreshold := int(max(pr.SuccessThreshold, 1))
	failureThreshold := 3
	if pr.FailureThreshold > 0 {
		failureThreshold = int(pr.FailureThreshold)
	}
	if !sleepCtx(ctx, time.Duration(pr.InitialDelaySeconds)*time.Second) {
		return false
	}
	successes, failures := 0, 0
	for {
		err := w.probeOnce(ctx, c, p, pr, timeout)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			successes, failures = successes+1, 0
		} else {
			successes, failures = 0, failures+1
			w.event(corev1.EventTypeWarning, "Unhealthy", "%s probe failed: %v", kind, err)
		}
		switch kind {
		case "Startup":
			if successes >= 1 {
				return true
			}
			if failures >= failureThreshold {
				w.killForRestart(c, p, w.probeGrace(pr), "failed startup probe")
				return false
			}
		case "Liveness":
			if failures >= failureThreshold {
				w.killForRestart(c, p, w.probeGrace(pr), "failed liveness probe")
				return false
			}
		case "Readiness":
			ready := -1
			if successes >= successThreshold {
				ready = 1
			} else if failures >= failureThreshold {
				ready = 0
			}
			if ready >= 0 {
				w.mu.Lock()
				was := c.ready
				c.ready = ready == 1 && c.proc == p
				now := c.ready
				w.mu.Unlock()
				if was != now {
					w.changed()
				}
			}
		}
		if untilSuccess && successes > 0 {
			return true
		}
		if !sleepCtx(ctx, period) {
			return false
		}
	}
}

func (w *podWorker) probeGrace(pr *corev1.Probe) time.Duration {
	if pr.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pr.TerminationGracePeriodSeconds) * time.Second
	}
	pod := w.current()
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

func secondsOr(v int32, def int) time.Duration {
	if v <= 0 {
		return time.Duration(def) * time.Second
	}
	return time.Duration(v) * time.Second
}

func (w *podWorker) probeOnce(ctx context.Context, c *ctr, p *proc, pr *corev1.Probe, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	w.mu.Lock()
	ip := w.ip
	w.mu.Unlock()
	switch {
	case pr.HTTPGet != nil:
		h := pr.HTTPGet
		port, err := resolvePort(h.Port, &c.spec)
		if err != nil {
			return err
		}
		host := h.Host
		if host == "" {
			host = ip
		}
		scheme := strings.ToLower(string(h.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		path := h.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Header.Set("User-Agent", "kube-probe/"+strings.TrimPrefix(w.r.o.kubernetesVersion, "v"))
		req.Header.Set("Accept", "*/*")
		for _, hd := range h.HTTPHeaders {
			req.Header.Add(hd.Name, hd.Value)
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}} //nolint:gosec // probes do not verify, like the kubelet's
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("GET %s: %w", url, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
		}
		return nil
	case pr.TCPSocket != nil:
		port, err := resolvePort(pr.TCPSocket.Port, &c.spec)
		if err != nil {
			return err
		}
		host := pr.TCPSocket.Host
		if host == "" {
			host = ip
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case pr.Exec != nil:
		return w.execProbe(ctx, c, p, pr.Exec.Command)
	case pr.GRPC != nil:
		return errors.New("gRPC probes are not supported by the local pod runner")
	}
	return errors.New("probe has no handler")
}

// execProbe runs the command inside the container's namespaces, as its
// user, with nsenter. The program is looked up in the image table, like the
// container's own.
func (w *podWorker) execProbe(ctx context.Context, c *ctr, p *proc, command []string) error {
	if len(command) == 0 {
		return errors.New("exec probe without a command")
	}
	images, err := loadImages(w.r.o.imagesFile)
	if err != nil {
		return err
	}
	img, ok := images.lookup(c.spec.Image)
	if !ok {
		return fmt.Errorf("image %q is not in the image table", c.spec.Image)
	}
	bin, err := img.resolve(command[0], nil)
	if err != nil {
		return err
	}
	raw, _ := readProcEnv(p.pid)
	// The container's user and group as numbers: nsenter's "follow"
	// needs util-linux 2.39 (Debian 12 has 2.38).
	uid, gid, err := procIDs(p.pid)
	if err != nil {
		return err
	}
	args := append([]string{"-t", strconv.Itoa(p.pid), "-n", "-m", "-u", "-S", uid, "-G", gid, "--", bin}, command[1:]...)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Env = raw
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("command %q failed: %v: %s", strings.Join(command, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// procIDs reads a process's real user and group ids.
func procIDs(pid int) (uid, gid string, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", "", err
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 1 && f[0] == "Uid:":
			uid = f[1]
		case len(f) > 1 && f[0] == "Gid:":
			gid = f[1]
		}
	}
	if uid == "" || gid == "" {
		return "", "", fmt.Errorf("no Uid or Gid in /proc/%d/status", pid)
	}
	return uid, gid, nil
}

func readProcEnv(pid int) ([]string, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return nil, err
	}
	var out []string
	for kv := range strings.SplitSeq(string(raw), "\x00") {
		if kv != "" {
			out = append(out, kv)
		}
	}
	return out, nil
}

// resolvePort turns a probe's port (a number or a container port name)
// into a number.
func resolvePort(p intstr.IntOrString, c *corev1.Container) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("no port named %q in container %s", p.StrVal, c.Name)
}
