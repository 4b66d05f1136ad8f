//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// TestKubectlPlugin runs the real kubectl-hcp binary against the samples
// on the cluster, as a user would after `make demo`: doctor, topology,
// submit through the Caller's sidecar, watch under a pseudo-terminal
// (progress bars) until it exits 0 with COMPLETED, submit --watch, sessions
// and describe, sessions -o json parsed (and piped to jq when installed),
// logs -f following a session across a drain of its pod, a rejection
// (exit 4) and an abort (exit 3).
//
// Submit reaches the Caller sidecar (its API listens on the caller pod's
// 127.0.0.1:9090 only) through kubectl-hcp's default port-forward, served
// by the node's kubelet.
func TestKubectlPlugin(t *testing.T) {
	s := newSuite(t)
	t.Logf("run %s: namespace %s, vhost %s", s.id, s.ns, s.vhost)
	s.install(t)
	s.dumpOnFailure(t)
	r := &samplesRun{suite: s, parent: t}
	if !t.Run("SamplesReady", r.samplesReady) {
		t.FailNow()
	}
	p := newPlugin(t, r)
	inputs := `{"recipe":"s3://lab/recipes/e2e.yaml","steps":12,"step_ms":400,"checkpoint_every":4}`

	t.Run("Doctor", func(t *testing.T) {
		res := p.run(t, "doctor", "-n", r.ns)
		for _, want := range []string{
			"✓ hcp.io CRDs: callees, callers, capabilitypolicies, hcpsessions established",
			"✓ rabbitmq.com CRDs:",
			"✓ hcp-operator: " + r.opNS + "/",
			"✓ callee sidecar role: ClusterRole ",
			"✓ topology operator:",
			"✓ broker connection Secret ",
			"✓ credentials Secrets: present with username, password and uri for 2 harnesses",
			"✓ policies: every Callee is selected by a CapabilityPolicy",
		} {
			if !strings.Contains(res.out, want) {
				t.Errorf("doctor lacks %q", want)
			}
		}
		if res.code != 0 && !strings.Contains(res.out, "✗") {
			t.Errorf("exit %d without a failed check", res.code)
		}
		if res.code == 0 && strings.Contains(res.out, "✗") {
			t.Error("exit 0 with a failed check")
		}
	})

	t.Run("Topology", func(t *testing.T) {
		// The management API counts consumers from statistics it collects
		// every few seconds (collect_statistics_interval, 5 s by default),
		// so a consumer that attached just now can still show as 0: ask
		// again until the row shows it, for at most 30 s.
		row := regexp.MustCompile(`(?m)^\s+queue\s+hcp\.cmd\.lab-cvd\s+Queue/\S+\s+True\s+quorum, \d+ messages \(\d+ ready, \d+ unacked\), 1 consumers$`)
		var res pluginResult
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(2 * time.Second) {
			res = p.run(t, "topology", "-n", r.ns, calleeID, "--management-url", r.cfg.managementURL)
			if res.code != 0 {
				t.Fatalf("exit %d", res.code)
			}
			if row.MatchString(res.out) || time.Now().After(deadline) {
				break
			}
		}
		for _, want := range []string{
			"Callee " + r.ns + "/" + calleeID + " (id " + calleeID + "): TopologyReady=True",
			"vhost " + r.vhost,
			"answers",
		} {
			if !strings.Contains(res.out, want) {
				t.Errorf("topology lacks %q", want)
			}
		}
		if !row.MatchString(res.out) {
			t.Error("no Ready queue row with its depth and one consumer after 30 s")
		}
		for _, what := range []string{"exchange    hcp.commands", "exchange    hcp.events", "binding", "user        callee.lab-cvd@" + r.vhost, "permission"} {
			if !strings.Contains(res.out, what) {
				t.Errorf("topology lacks the %s row", what)
			}
		}
	})

	var sessionID string
	t.Run("SubmitAndWatchInATerminal", func(t *testing.T) {
		res := p.submit(t, "--capability", synthesis, "--intent", "kubectl hcp e2e", "--inputs", inputs, "--data-class", "T2")
		if res.code != 0 {
			t.Fatalf("submit: exit %d", res.code)
		}
		m := regexp.MustCompile(`accepted: session ([0-9a-f-]{36})`).FindStringSubmatch(res.out)
		if m == nil {
			t.Fatal("submit did not say the session was accepted")
		}
		sessionID = m[1]
		out, code := p.runPTY(t, "watch", "-n", r.ns, sessionID)
		if code != 0 {
			t.Errorf("watch under a terminal: exit %d, want 0 (COMPLETED)", code)
		}
		plain := stripANSI(out)
		for _, want := range []string{"session " + sessionID + ": " + synthesis + " on " + calleeID + " for " + callerID, "RUNNING → COMPLETED", "session " + sessionID + " COMPLETED after"} {
			if !strings.Contains(plain, want) {
				t.Errorf("watch output lacks %q", want)
			}
		}
		if !strings.Contains(out, "\x1b[") {
			t.Error("no terminal escape sequences: watch did not draw progress bars on a terminal")
		}
		if !regexp.MustCompile(`\[[=>\-_ ]{10,}\]`).MatchString(plain) {
			t.Error("no progress bar in the output")
		}
	})

	t.Run("SubmitWatch", func(t *testing.T) {
		// The whole flow in one command, stdout not a terminal: plain lines.
		res := p.submit(t, "--capability", synthesis, "--inputs", `{"steps":4,"step_ms":200}`, "--data-class", "T1", "--watch")
		if res.code != 0 {
			t.Errorf("submit --watch: exit %d, want 0", res.code)
		}
		for _, want := range []string{"accepted: session ", "RUNNING → COMPLETED", " COMPLETED after"} {
			if !strings.Contains(res.out, want) {
				t.Errorf("submit --watch lacks %q", want)
			}
		}
	})

	t.Run("SessionsAndDescribe", func(t *testing.T) {
		if sessionID == "" {
			t.Skip("no session from the earlier step")
		}
		res := p.run(t, "sessions", "-n", r.ns, "--state", "completed")
		row := regexp.MustCompile(`(?m)^` + sessionID + `\s+lab-cvd\s+alpha\s+cvd\.run-synthesis\s+COMPLETED\s+100%\s+\S+\s+\d+s\s+#\d+ `)
		if res.code != 0 || !row.MatchString(res.out) {
			t.Errorf("sessions: exit %d, no COMPLETED 100%% row for %s", res.code, sessionID)
		}
		hs := &hcpv1alpha1.HCPSession{}
		if err := r.c.Get(t.Context(), client.ObjectKey{Namespace: r.ns, Name: sessionID}, hs); err != nil {
			t.Fatal(err)
		}
		res = p.run(t, "describe", "-n", r.ns, sessionID[:8])
		flat := regexp.MustCompile(`[ \t]+`).ReplaceAllString(res.out, " ")
		for _, want := range []string{
			"Name: " + sessionID, "State: COMPLETED", "Intent: kubectl hcp e2e", "Verdict: admitted", "Risk: " + string(hs.Spec.RiskLevel) + " (assessed)",
			"Decided by: pod " + hs.Status.PodName, "Name: " + hs.Status.PodName, "Status: Running, ready",
			"CapabilityPolicies selecting callee " + calleeID + " now: " + r.policy.Name,
			": task_submit received, the L3 gate", "RUNNING: admitted", "last checkpoint ", "COMPLETED",
		} {
			if !strings.Contains(flat, want) {
				t.Errorf("describe lacks %q", want)
			}
		}
	})

	t.Run("SessionsJSON", func(t *testing.T) {
		if sessionID == "" {
			t.Skip("no session from the earlier step")
		}
		res := p.run(t, "sessions", "-n", r.ns, "-o", "json")
		if res.code != 0 {
			t.Fatalf("sessions -o json: exit %d", res.code)
		}
		var l struct {
			Kind  string `json:"kind"`
			Items []struct {
				Kind     string `json:"kind"`
				Metadata struct{ Name string }
				Status   struct{ State string }
				Columns  struct {
					State           string `json:"state"`
					Progress        string `json:"progress"`
					DurationSeconds *int64 `json:"durationSeconds"`
				} `json:"columns"`
			} `json:"items"`
		}
		if err := json.Unmarshal([]byte(res.out), &l); err != nil {
			t.Fatalf("sessions -o json is not JSON: %v", err)
		}
		found := false
		for _, it := range l.Items {
			if it.Metadata.Name != sessionID {
				continue
			}
			found = true
			if it.Kind != "HCPSession" || it.Status.State != "COMPLETED" || it.Columns.State != "COMPLETED" || it.Columns.Progress != "100%" || it.Columns.DurationSeconds == nil {
				t.Errorf("session %s in -o json: %+v", sessionID, it)
			}
		}
		if l.Kind != "List" || !found {
			t.Errorf("-o json: kind %q, session %s listed: %v", l.Kind, sessionID, found)
		}
		// As a user pipes it, when jq is installed.
		if jq, err := exec.LookPath("jq"); err == nil {
			cmd := exec.CommandContext(t.Context(), jq, "-r", `.items[] | select(.columns.state == "COMPLETED") | .metadata.name`)
			cmd.Stdin = strings.NewReader(res.out)
			out, err := cmd.Output()
			if err != nil || !strings.Contains(string(out), sessionID) {
				t.Errorf("kubectl hcp sessions -o json | jq: %v, %q", err, out)
			}
		} else {
			t.Log("no jq on PATH: the JSON was checked by encoding/json only")
		}
		res = p.run(t, "sessions", "-n", r.ns, "--state", "completed", "-o", "name")
		if res.code != 0 || !strings.Contains(res.out, "hcpsession.hcp.io/"+sessionID+"\n") {
			t.Errorf("sessions -o name: exit %d", res.code)
		}
	})

	t.Run("LogsFollowAcrossADrain", func(t *testing.T) {
		r.setCalleeReplicas(t, 2)
		defer func() {
			r.setCalleeReplicas(t, 1)
			r.calleePod = r.readyPod(t, "hcp.io/callee="+calleeID)
		}()
		res := p.submit(t, "--capability", synthesis, "--intent", "kubectl hcp logs -f e2e",
			"--inputs", `{"steps":40,"step_ms":250,"checkpoint_every":2}`, "--data-class", "T1")
		m := regexp.MustCompile(`accepted: session ([0-9a-f-]{36})`).FindStringSubmatch(res.out)
		if m == nil {
			t.Fatalf("submit: exit %d, no accepted session", res.code)
		}
		id := m[1]
		logs := p.start(t, "logs", "-f", "--prefix", "-n", r.ns, id)
		owner := &corev1.Pod{}
		eventually(t, 30*time.Second, "the pod running session "+id, func(ctx context.Context) error {
			hs, err := r.session(ctx, id)
			if err != nil {
				return err
			}
			if hs.Status.PodName == "" {
				return errors.New("no status.podName yet")
			}
			return r.c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: hs.Status.PodName}, owner)
		})
		// The harness logs "Running task" when it starts the session.
		first := regexp.MustCompile(`(?m)^\[pod/` + regexp.QuoteMeta(owner.Name) + `/[^\]]+\] .*"Running task".*` + id + `.*"fromStep"=1\b`)
		logs.waitFor(t, first, time.Minute)
		t.Logf("draining pod %s (it runs session %s)", owner.Name, id)
		if err := r.c.Delete(t.Context(), owner); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := logs.wait(t, 4*time.Minute)
		if code != 0 {
			t.Errorf("logs -f: exit %d, want 0 once the session ended", code)
		}
		resumed := regexp.MustCompile(`(?m)^\[pod/([^/]+)/[^\]]+\] .*"Running task".*` + id + `.*"fromStep"=([0-9]+)`)
		var other string
		for _, mm := range resumed.FindAllStringSubmatch(out, -1) {
			if mm[1] != owner.Name && mm[2] != "1" {
				other = mm[1]
			}
		}
		if other == "" {
			t.Errorf("no line of another pod resuming session %s past step 1 in the log", id)
		}
		for _, want := range []string{"==> session " + id + " moved from pod " + owner.Name + " to pod " + other, "==> session " + id + " ended COMPLETED"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("logs -f stderr lacks %q", want)
			}
		}
		if hs, err := r.session(t.Context(), id); err != nil || hs.Status.State != hcpv1alpha1.SessionCompleted {
			t.Errorf("session %s: %v, want COMPLETED", id, err)
		}
	})

	t.Run("Rejected", func(t *testing.T) {
		res := p.submit(t, "--capability", bakeout, "--data-class", "T1")
		if res.code != 4 || !strings.Contains(res.out, "rejected: not_authorized:") {
			t.Errorf("a task no policy admits: exit %d, want 4 and the reason", res.code)
		}
	})

	t.Run("Abort", func(t *testing.T) {
		res := p.submit(t, "--capability", synthesis, "--inputs", `{"steps":600,"step_ms":100}`, "--data-class", "T1")
		m := regexp.MustCompile(`accepted: session ([0-9a-f-]{36})`).FindStringSubmatch(res.out)
		if m == nil {
			t.Fatalf("submit: exit %d, no accepted session", res.code)
		}
		res = p.run(t, "abort", "-n", r.ns, m[1], "--reason", "e2e abort", "--wait", "--timeout", "2m")
		if res.code != 3 || !strings.Contains(res.out, "reason recorded in the annotation hcp.io/abort-reason") || !strings.Contains(res.out, " ABORTED") {
			t.Errorf("abort --wait: exit %d, want 3 (ABORTED)", res.code)
		}
	})
}

// plugin runs bin/kubectl-hcp.
type plugin struct {
	r   *samplesRun
	bin string
}

func newPlugin(t *testing.T, r *samplesRun) *plugin {
	t.Helper()
	p := &plugin{r: r, bin: filepath.Join(r.cfg.root, "bin", "kubectl-hcp")}
	build := exec.CommandContext(t.Context(), "make", "-s", "--no-print-directory", "kubectl-hcp")
	build.Dir = r.cfg.root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make kubectl-hcp: %v\n%s", err, out)
	}
	return p
}

type pluginResult struct {
	out, err string
	code     int
}

// run runs kubectl-hcp here, with the suite's KUBECONFIG.
func (p *plugin) run(t *testing.T, args ...string) pluginResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.bin, args...)
	cmd.Env = os.Environ()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	res := pluginResult{out: out.String(), err: errOut.String(), code: cmd.ProcessState.ExitCode()}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("kubectl-hcp %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("$ kubectl-hcp %s\n%s%s(exit %d)", strings.Join(args, " "), res.out, res.err, res.code)
	return res
}

// background is kubectl-hcp running in the background.
type background struct {
	cmd         *exec.Cmd
	args        []string
	out, errOut *lockedBuffer
	done        chan struct{}
}

// lockedBuffer is a buffer a process writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// start starts kubectl-hcp in the background, with the suite's KUBECONFIG.
func (p *plugin) start(t *testing.T, args ...string) *background {
	t.Helper()
	b := &background{args: args, out: &lockedBuffer{}, errOut: &lockedBuffer{}, done: make(chan struct{})}
	b.cmd = exec.CommandContext(t.Context(), p.bin, args...)
	b.cmd.Env = os.Environ()
	b.cmd.Stdout, b.cmd.Stderr = b.out, b.errOut
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("kubectl-hcp %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		_ = b.cmd.Wait()
		close(b.done)
	}()
	t.Cleanup(func() {
		select {
		case <-b.done:
		default:
			_ = b.cmd.Process.Kill()
			<-b.done
		}
	})
	return b
}

// waitFor waits until stdout matches re.
func (b *background) waitFor(t *testing.T, re *regexp.Regexp, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !re.MatchString(b.out.String()) {
		select {
		case <-b.done:
			t.Fatalf("kubectl-hcp %s ended before its output matched %s:\n%s%s", strings.Join(b.args, " "), re, b.out, b.errOut)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl-hcp %s: no %s in its output within %s:\n%s%s", strings.Join(b.args, " "), re, timeout, b.out, b.errOut)
		}
	}
}

// wait waits for the process to end and returns its output and exit code.
func (b *background) wait(t *testing.T, timeout time.Duration) (out, errOut string, code int) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(timeout):
		t.Fatalf("kubectl-hcp %s did not end within %s:\n%s%s", strings.Join(b.args, " "), timeout, b.out, b.errOut)
	}
	code = b.cmd.ProcessState.ExitCode()
	t.Logf("$ kubectl-hcp %s\n%s%s(exit %d)", strings.Join(b.args, " "), b.out, b.errOut, code)
	return b.out.String(), b.errOut.String(), code
}

// submit submits as the Caller alpha to lab-cvd through the plugin's
// default port-forward to the caller pod's sidecar, as a user does.
func (p *plugin) submit(t *testing.T, args ...string) pluginResult {
	t.Helper()
	base := []string{"submit", "-n", p.r.ns, "--caller", callerID, "--callee", calleeID, "--decision-timeout", "90s"}
	return p.run(t, append(base, args...)...)
}

// runPTY runs kubectl-hcp with its stdout on a pseudo-terminal, as in a
// user's shell, and returns what it wrote and its exit code.
func (p *plugin) runPTY(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.bin, args...)
	cmd.Env = append(os.Environ(), "TERM=xterm-256color")
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 140})
	if err != nil {
		t.Fatalf("start under a pty: %v", err)
	}
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() {
		// Reading ends with EIO once the process and its terminal are gone.
		_, _ = io.Copy(&out, f)
		close(copied)
	}()
	err = cmd.Wait()
	select {
	case <-copied:
	case <-time.After(5 * time.Second):
	}
	_ = f.Close()
	code := cmd.ProcessState.ExitCode()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) && !errors.Is(err, syscall.EIO) {
		t.Fatalf("kubectl-hcp %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("$ kubectl-hcp %s   (on a terminal)\n%s\n(exit %d)", strings.Join(args, " "), stripANSI(out.String()), code)
	return out.String(), code
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]|\r`)

func stripANSI(s string) string { return ansi.ReplaceAllString(s, "") }
