package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Pod termination, as the kubelet does it with native sidecars
// (pkg/kubelet/kuberuntime: killContainer and terminationOrdering):
//
//  1. Every running container's preStop hook starts at once, the regular
//     containers' and the sidecars' alike, each bounded by what is left of
//     the grace period.
//  2. A regular container gets SIGTERM when its hook returned.
//  3. A sidecar (an init container with restartPolicy Always) gets SIGTERM
//     when its hook returned, every regular container has exited and every
//     later sidecar has exited: the sidecars go in reverse order.
//  4. After SIGTERM a container has what is left of the grace period, but
//     at least minStopGrace, then it gets SIGKILL.
//
// The grace period is the pod's deletionGracePeriodSeconds (else its
// terminationGracePeriodSeconds, else 30), counted from the moment the
// runner sees the deletion.

// minStopGrace is the kubelet's minimumGracePeriodInSeconds: the least time
// a container gets between SIGTERM and SIGKILL.
const minStopGrace = 2 * time.Second

// sidecarRun is a running sidecar's supervisor: cancel stops it, done is
// closed once its process is gone.
type sidecarRun struct {
	c      *ctr
	cancel context.CancelFunc
	done   chan struct{}
}

// stopSidecars stops the sidecars in reverse order, each once the one
// after it has exited; the regular containers are gone by now.
func (w *podWorker) stopSidecars(sidecars []sidecarRun) {
	if len(sidecars) > 0 {
		w.ensureDeadline()
	}
	for i := len(sidecars) - 1; i >= 0; i-- {
		sidecars[i].cancel()
		<-sidecars[i].done
	}
}

// ensureDeadline starts the grace period of a pod whose regular containers
// finished on their own (restartPolicy Never or OnFailure): its sidecars
// get the pod's terminationGracePeriodSeconds.
func (w *podWorker) ensureDeadline() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.terminating || !w.deadline.IsZero() {
		return
	}
	grace := int64(30)
	if g := w.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	w.deadline = time.Now().Add(time.Duration(grace) * time.Second)
}

// startSidecarHooks starts the running sidecars' preStop hooks when the
// pod's deletion begins, before their turn to stop comes (step 1).
func (w *podWorker) startSidecarHooks() {
	deadline := w.stopDeadline()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.ctrs {
		if c.kind != kindSidecar || c.proc == nil || preStopOf(c) == nil {
			continue
		}
		p, done := c.proc, make(chan struct{})
		c.hookDone = done
		go func() {
			defer close(done)
			w.runPreStop(c, p, deadline)
		}()
	}
}

// preStopDone runs the container's preStop hook, or for a sidecar whose
// hook started with the deletion waits for it, until deadline at most.
func (w *podWorker) preStopDone(c *ctr, p *proc, deadline time.Time) {
	w.mu.Lock()
	done := c.hookDone
	c.hookDone = nil
	w.mu.Unlock()
	if done == nil {
		w.runPreStop(c, p, deadline)
		return
	}
	t := time.NewTimer(max(time.Until(deadline), 0))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

func preStopOf(c *ctr) *corev1.LifecycleHandler {
	if c.spec.Lifecycle == nil {
		return nil
	}
	return c.spec.Lifecycle.PreStop
}

// runPreStop runs the container's preStop hook until it returns or the
// deadline passes (then it is abandoned, as the kubelet abandons it). A
// failed hook is reported with an Event; the container is stopped anyway.
func (w *podWorker) runPreStop(c *ctr, p *proc, deadline time.Time) {
	h := preStopOf(c)
	if h == nil || time.Until(deadline) <= 0 {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	// The hook runs in the background so that one ignoring its context (an
	// exec that does not die) cannot hold the stop past the deadline.
	errc := make(chan error, 1)
	go func() { errc <- w.runHook(ctx, c, p, h) }()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		err = fmt.Errorf("not done within the grace period: %w", ctx.Err())
	}
	attrs := append(w.logAttrs(), "container", c.spec.Name, "took", time.Since(start).Round(time.Millisecond))
	if err != nil {
		w.event(corev1.EventTypeWarning, "FailedPreStopHook", "PreStopHook failed for container %s: %v", c.spec.Name, err)
		w.r.log.Error("PreStop hook failed", append(attrs, "err", err)...)
		return
	}
	w.r.log.Info("PreStop hook done", attrs...)
}

// runHook runs one lifecycle handler: HTTP GET against the pod's address
// (a named port is one of the hook's own container, as for the kubelet;
// any HTTP response counts as done), exec inside the container, or sleep.
func (w *podWorker) runHook(ctx context.Context, c *ctr, p *proc, h *corev1.LifecycleHandler) error {
	switch {
	case h.HTTPGet != nil:
		g := h.HTTPGet
		port, err := resolvePort(g.Port, &c.spec)
		if err != nil {
			return err
		}
		host := g.Host
		if host == "" {
			w.mu.Lock()
			host = w.ip
			w.mu.Unlock()
		}
		scheme := strings.ToLower(string(g.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		path := g.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Header.Set("User-Agent", "kube-lifecycle/"+strings.TrimPrefix(w.r.o.kubernetesVersion, "v"))
		for _, hd := range g.HTTPHeaders {
			req.Header.Add(hd.Name, hd.Value)
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}} //nolint:gosec // hooks do not verify, like the kubelet's
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("GET %s: %w", url, err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
		_ = resp.Body.Close()
		w.r.log.Info("PreStop hook answered", append(w.logAttrs(), "container", c.spec.Name, "url", url, "status", resp.StatusCode)...)
		return nil
	case h.Exec != nil:
		return w.execProbe(ctx, c, p, h.Exec.Command)
	case h.Sleep != nil:
		if !sleepCtx(ctx, time.Duration(h.Sleep.Seconds)*time.Second) {
			return errors.New("container terminated before sleep hook finished")
		}
		return nil
	}
	return fmt.Errorf("invalid handler: %+v", h)
}
