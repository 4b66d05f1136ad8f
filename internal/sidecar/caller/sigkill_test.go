package caller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/hcp-io/hcp-operator/internal/procs"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/transport"
)

// helperEnv makes the test binary run TestHelperCallerSidecarProcess as a
// caller sidecar process (configured through the real HCP_* environment
// contract) until it is killed.
const helperEnv = "HCP_CALLER_SIDECAR_HELPER"

// lingerEnv sets the helper process's Options.CommitLinger (a duration).
const lingerEnv = "HCP_CALLER_SIDECAR_HELPER_LINGER"

// profileEnv names a file for the helper process's CPU profile, written
// when it stops on SIGTERM.
const profileEnv = "HCP_CALLER_SIDECAR_HELPER_CPUPROFILE"

// memProfileEnv names a file for the helper process's allocation profile
// (go tool pprof -sample_index=alloc_space), written when it stops on
// SIGTERM: what each event allocates, in the process that does it.
const memProfileEnv = "HCP_CALLER_SIDECAR_HELPER_MEMPROFILE"

// TestHelperCallerSidecarProcess is not a test on its own: the SIGKILL test
// runs the test binary again with it, as the sidecar process to kill.
func TestHelperCallerSidecarProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process of TestStreamContinuitySIGKILL")
	}
	procs.Set(logr.Discard(), procs.Sidecar, procs.CgroupRoot) // as hcp-sidecar runs
	cfg, err := config.FromOSEnv()
	if err != nil {
		t.Fatal(err)
	}
	if path := os.Getenv(profileEnv); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if path := os.Getenv(memProfileEnv); path != "" {
		defer writeHeapProfile(t, path)
	}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{LogTimestamp: true})
	conn, err := transport.Dial(context.Background(), transport.Options{URL: cfg.AMQPURL, ConnectionName: "caller-sidecar-process",
		Logger: log, BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second, DrainWithoutCancel: true})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := transport.NewPublisher(conn, transport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var linger time.Duration
	if v := os.Getenv(lingerEnv); v != "" {
		if linger, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	sc, err := New(Options{Config: cfg, Publisher: pub, Consumer: conn, Log: log, GapTimeout: time.Second,
		AppBackoff: Backoff{Min: 20 * time.Millisecond, Max: 300 * time.Millisecond}, CommitLinger: linger})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", cfg.APIAddr)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = http.Serve(ln, sc.Handler()) }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := sc.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// writeHeapProfile writes the process's allocation profile to path.
func writeHeapProfile(t *testing.T, path string) {
	f, err := os.Create(path)
	if err != nil {
		t.Error(err)
		return
	}
	defer func() { _ = f.Close() }()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		t.Error(err)
	}
}

// process is a caller sidecar running as its own OS process.
type process struct {
	cmd *exec.Cmd
	api string
	log string
}

func (b *bed) spawn(t testing.TB, n int) *process {
	t.Helper()
	return b.spawnWith(t, n, b.amqpURL(b.caller))
}

// spawnWith is spawn with the broker at amqpURL (a proxy's) and extra
// environment variables.
func (b *bed) spawnWith(t testing.TB, n int, amqpURL string, env ...string) *process {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	logPath := filepath.Join(t.TempDir(), fmt.Sprintf("sidecar-%d.log", n))
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCallerSidecarProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1",
		config.EnvMode+"=caller", config.EnvID+"="+b.callerID, config.EnvNamespace+"=default",
		config.EnvVhost+"="+b.vhost, config.EnvAMQPURL+"="+amqpURL, config.EnvUsername+"="+b.caller.name,
		config.EnvHarnessURL+"="+b.appSrv.URL, config.EnvAPIAddr+"="+addr, config.EnvStateDir+"="+b.stateDir,
		config.EnvPrefetch+"=10")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, api: "http://" + addr, log: logPath}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		_ = logFile.Close()
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			t.Logf("log of sidecar process %d:\n%s", n, tailBytes(data, 6000))
		}
	})
	eventually(t, 20*time.Second, "the sidecar process API", func() error {
		resp, err := http.Get(p.api + "/hcp/v1/tasks")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	return p
}

func tailBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (p *process) submit(t testing.TB, req SubmitRequest) TaskView {
	t.Helper()
	js, _ := json.Marshal(req)
	resp, err := http.Post(p.api+"/hcp/v1/tasks", "application/json", bytes.NewReader(js))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v TaskView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit: HTTP %d %v", resp.StatusCode, err)
	}
	return v
}

// TestStreamContinuitySIGKILL kills a caller sidecar process with SIGKILL
// three times mid-stream and restarts it on the same state directory. No
// event may be lost or reordered. A process death can fall between the
// app's 2xx and the sidecar's fsync of that sequence; the event is then
// delivered again, and it must carry redelivered=true (the app's cue to
// deduplicate). The figures say how often that happened.
func TestStreamContinuitySIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns sidecar processes")
	}
	b := newBed(t, "lab")
	b.app.SetDelay(5 * time.Millisecond)
	p := b.spawn(t, 0)
	const sessions, events = 5, 300
	st := &streams{b: b, done: make(chan struct{})}
	for range sessions {
		v := p.submit(t, taskReq("lab"))
		st.scripts = append(st.scripts, newScript(t, "lab", v.MessageID, events))
	}
	var wg sync.WaitGroup
	for _, s := range st.scripts {
		c := b.callee("lab")
		st.callees = append(st.callees, c)
		wg.Go(func() {
			for _, m := range s.msgs {
				c.publish(m)
				time.Sleep(time.Millisecond)
			}
		})
	}
	go func() { wg.Wait(); close(st.done) }()
	total := st.total()
	for i, frac := range []float64{0.2, 0.45, 0.7} {
		st.waitReceived(t, int(frac*float64(total)))
		before := b.app.Snapshot().Total
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_, _ = p.cmd.Process.Wait()
		t.Logf("SIGKILL %d: sidecar process killed after the app received %d of %d messages", i+1, before, total)
		p = b.spawn(t, i+1)
	}
	f := st.finish(t, events)
	t.Logf("caller sidecar process SIGKILLed 3 times mid-stream: %s", f)
	// Each kill can catch each session between the app's 2xx and the fsync
	// that covers it: the events answered during one group commit per
	// session, all of them unacked deliveries, so at most the prefetch
	// window (10) per kill.
	const prefetch = 10
	if f.received != f.sent || f.lost != 0 || f.problems != 0 || f.duplicates != 0 || f.dedupedByApp > prefetch*3 {
		t.Errorf("stream continuity broken by SIGKILL: %s", f)
	}
}
