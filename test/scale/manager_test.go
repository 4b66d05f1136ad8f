//go:build e2e

package scale

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// manager is the hcp-operator manager as a process of its own, built from
// cmd/manager, so that its RSS is its own and its API requests are counted
// by its own client metrics.
type manager struct {
	cmd         *exec.Cmd
	metricsAddr string
	healthAddr  string
	pprofAddr   string
	logPath     string
	exited      chan struct{}
}

// buildManager builds cmd/manager with make build's flags into dir.
func buildManager(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "manager")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/manager")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/manager: %w\n%s", err, out)
	}
	return bin, nil
}

// startManager runs bin with the admin kubeconfig, watching watch, its
// shared topology in home (POD_NAMESPACE), the default broker
// home/secret, metrics over plain HTTP on a loopback port, and no leader
// election (one process; a Lease renewal would be a write every retry
// period, 2 s by default, that says nothing about the reconcilers).
func startManager(bin, logPath, home, secret string, watch []string, extra []string) (*manager, error) {
	addrs, err := testbed.FreeAddrs(3)
	if err != nil {
		return nil, err
	}
	metrics, health, pprof := addrs[0], addrs[1], addrs[2]
	m := &manager{metricsAddr: metrics, healthAddr: health, pprofAddr: pprof, logPath: logPath, exited: make(chan struct{})}
	logf, err := os.Create(m.logPath)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--default-connection-secret=" + home + "/" + secret,
		"--watch-namespaces=" + strings.Join(append(watch, home), ","),
		"--metrics-bind-address=" + metrics,
		"--metrics-secure=false",
		"--health-probe-bind-address=" + health,
		"--pprof-bind-address=" + pprof,
		"--leader-elect=false",
	}
	args = append(args, extra...)
	m.cmd = exec.Command(bin, args...)
	m.cmd.Env = append(os.Environ(), "POD_NAMESPACE="+home)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	if err := m.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() {
		_ = m.cmd.Wait()
		logf.Close()
		close(m.exited)
	}()
	return m, nil
}

// waitReady waits for /readyz and for both harness controllers' workers
// (their caches have synced once the workers run).
func (m *manager) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last error
	for {
		select {
		case <-m.exited:
			return fmt.Errorf("manager exited: %s", m.logTail())
		case <-ctx.Done():
			return fmt.Errorf("manager not ready: %v: %s", last, m.logTail())
		case <-time.After(200 * time.Millisecond):
		}
		resp, err := http.Get("http://" + m.healthAddr + "/readyz")
		if err != nil {
			last = err
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("readyz: %s", resp.Status)
			continue
		}
		s, err := m.scrape()
		if err != nil {
			last = err
			continue
		}
		if s.has("controller_runtime_active_workers", `controller="callee"`) && s.has("controller_runtime_active_workers", `controller="caller"`) {
			return nil
		}
		last = errors.New("controllers not started")
	}
}

func (m *manager) stop() {
	if m.cmd.Process == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(30 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
}

func (m *manager) logTail() string {
	b, err := os.ReadFile(m.logPath)
	if err != nil {
		return err.Error()
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// memory is the manager's resident set now and at its peak, in bytes
// (/proc/PID/status VmRSS, VmHWM), and what its Go heap holds, from its
// metrics: the spans in use (live objects and garbage not yet
// collected), free spans the runtime keeps without returning them to the
// OS, and the heap size at which the next collection starts.
type memory struct {
	rss, hwm                        int64
	heapInuse, heapRetained, nextGC int64
}

func (m *manager) memory() (memory, error) {
	s, err := m.scrape()
	if err != nil {
		return memory{}, err
	}
	out := memory{
		heapInuse:    int64(s["go_memstats_heap_inuse_bytes"]),
		heapRetained: int64(s["go_memstats_heap_idle_bytes"] - s["go_memstats_heap_released_bytes"]),
		nextGC:       int64(s["go_memstats_next_gc_bytes"]),
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", m.cmd.Process.Pid))
	if err != nil {
		return memory{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		fields := strings.Fields(rest) // "123456 kB"
		if len(fields) != 2 || fields[1] != "kB" {
			return memory{}, fmt.Errorf("%s: unexpected %q", name, rest)
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return memory{}, err
		}
		if name == "VmRSS" {
			out.rss = kb * 1024
		} else {
			out.hwm = kb * 1024
		}
	}
	return out, sc.Err()
}

// samples are the lines of one scrape in the Prometheus text format:
// "name{labels}" → value.
type samples map[string]float64

func (m *manager) scrape() (samples, error) {
	resp, err := http.Get("http://" + m.metricsAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return parseSamples(string(b))
}

func parseSamples(text string) (samples, error) {
	out := samples{}
	for line := range strings.SplitSeq(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, nil
}

// sum adds the series of metric whose labels contain every one of want
// (each `name="value"`).
func (s samples) sum(metric string, want ...string) float64 {
	var total float64
	for k, v := range s {
		if matches(k, metric, want) {
			total += v
		}
	}
	return total
}

func (s samples) has(metric string, want ...string) bool {
	for k := range s {
		if matches(k, metric, want) {
			return true
		}
	}
	return false
}

func matches(series, metric string, want []string) bool {
	name, labels, _ := strings.Cut(series, "{")
	if name != metric {
		return false
	}
	for _, w := range want {
		if !strings.Contains(labels, w) {
			return false
		}
	}
	return true
}

// writeMethods are the HTTP methods of API writes.
var writeMethods = []string{"POST", "PUT", "PATCH", "DELETE"}

// writes is the manager's API writes so far (its client's
// rest_client_requests_total by method).
func (s samples) writes() float64 {
	var n float64
	for _, m := range writeMethods {
		n += s.sum("rest_client_requests_total", `method="`+m+`"`)
	}
	return n
}

// reconciles is how often the harness controllers reconciled so far
// (controller_runtime_reconcile_total, every result).
func (s samples) reconciles() float64 {
	return s.sum("controller_runtime_reconcile_total", `controller="callee"`) + s.sum("controller_runtime_reconcile_total", `controller="caller"`)
}

// queued is what waits in the harness controllers' work queues or is
// being reconciled.
func (s samples) queued() float64 {
	return s.sum("workqueue_depth", `name="callee"`) + s.sum("workqueue_depth", `name="caller"`) +
		s.sum("controller_runtime_active_workers", `controller="callee"`) + s.sum("controller_runtime_active_workers", `controller="caller"`)
}

// heapProfile writes the manager's heap profile (after a GC) to path, for
// go tool pprof: where its memory per object goes.
func (m *manager) heapProfile(ctx context.Context, path string) error {
	return m.profile(ctx, "heap?gc=1", path)
}

// cpuProfile writes the manager's CPU profile over the next d to path.
func (m *manager) cpuProfile(ctx context.Context, d time.Duration, path string) error {
	return m.profile(ctx, fmt.Sprintf("profile?seconds=%d", int(d.Seconds())), path)
}

// profile saves /debug/pprof/<what> from the manager's pprof server.
func (m *manager) profile(ctx context.Context, what, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.pprofAddr+"/debug/pprof/"+what, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: %s", what, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
