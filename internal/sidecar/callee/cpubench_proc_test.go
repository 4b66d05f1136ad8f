package callee

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/internal/procs"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// The environment of TestHelperCalleeSidecarProcess, set by
// spawnCalleeProcess.
const (
	cpuHelperEnv  = "HCP_CALLEE_SIDECAR_HELPER"
	cpuURLEnv     = "HCP_CALLEE_SIDECAR_HELPER_AMQP_URL"
	cpuUserEnv    = "HCP_CALLEE_SIDECAR_HELPER_USERNAME"
	cpuSessionEnv = "HCP_CALLEE_SIDECAR_HELPER_SESSION"
	cpuStateEnv   = "HCP_CALLEE_SIDECAR_HELPER_STATE_DIR"
	// cpuProfileEnv, when set, is a file the helper writes its CPU
	// profile to (at SIGTERM).
	cpuProfileEnv = "HCP_CALLEE_SIDECAR_HELPER_CPUPROFILE"
)

// benchTraceparent is the trace context of the benchmark's session: a
// task_submit usually carries one, and every event then carries it.
const benchTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// TestHelperCalleeSidecarProcess is not a test on its own: BenchmarkCalleeCPU
// runs the test binary with this test selected to get a callee sidecar in a
// process of its own, so that its CPU time is its own. It is the sidecar's
// harness API (the real handler) and its event path (the write-ahead log
// on disk, the real ConfirmPublisher on a RabbitMQ connection) with one
// RUNNING session, as admitting a task leaves it, without the Kubernetes
// side (no API server: the status writer is not run). It prints its API
// address on stdout and serves until SIGTERM.
func TestHelperCalleeSidecarProcess(t *testing.T) {
	if os.Getenv(cpuHelperEnv) != "1" {
		t.Skip("helper process of BenchmarkCalleeCPU")
	}
	procs.Set(logr.Discard(), procs.Sidecar, procs.CgroupRoot) // as hcp-sidecar runs
	if path := os.Getenv(cpuProfileEnv); path != "" {
		f, err := os.Create(path)
		must(t, err)
		must(t, pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	conn, err := transport.Dial(ctx, transport.Options{URL: os.Getenv(cpuURLEnv), ConnectionName: "callee-sidecar-process", Logger: logr.Discard()})
	must(t, err)
	pub, err := transport.NewPublisher(conn, transport.PublisherOptions{})
	must(t, err)
	log, _, err := wal.Open(os.Getenv(cpuStateEnv))
	must(t, err)
	s := &Sidecar{pub: pub, m: metrics.New(prometheus.NewRegistry()), username: os.Getenv(cpuUserEnv),
		wal: log, st: status.New(status.Options{}), clk: clock.RealClock{}, life: ctx, sessions: map[string]*sess{}}
	m, err := session.New(time.Now()).Apply(session.StateRunning, "started", time.Now())
	must(t, err)
	ss := &sess{sc: s, id: os.Getenv(cpuSessionEnv), callerID: callerID, lock: make(chan struct{}, 1),
		machine: m, seq: session.NewSequencer(0), confirmDone: make(chan struct{}), epoch: 1}
	benchTrace(ss, benchTraceparent)
	s.register(ss)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	fmt.Println("ADDR", ln.Addr().String())
	_ = server.Serve(ctx, ln, s.routes(), logr.Discard())
}

// calleeProc is a running TestHelperCalleeSidecarProcess.
type calleeProc struct {
	cmd  *exec.Cmd
	addr string
}

// spawnCalleeProcess starts the helper process for session sid on the
// broker at url (as user), its state directory a temporary one; it is
// stopped when b ends.
func spawnCalleeProcess(b *testing.B, url, user, sid string) *calleeProc {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCalleeSidecarProcess$")
	cmd.Env = append(os.Environ(), cpuHelperEnv+"=1", cpuURLEnv+"="+url, cpuUserEnv+"="+user,
		cpuSessionEnv+"="+sid, cpuStateEnv+"="+b.TempDir())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &calleeProc{cmd: cmd}
	b.Cleanup(p.stop)
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
				addr <- a
			}
		}
	}()
	select {
	case p.addr = <-addr:
	case <-time.After(30 * time.Second):
		b.Fatal("the callee sidecar process did not start within 30s")
	}
	return p
}

// stop ends the process gracefully (a CPU profile asked for is written).
func (p *calleeProc) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}
