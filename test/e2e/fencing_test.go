//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/internal/sidecar/lease"
)

// The fencing faults' procedures (faults_test.go), and the local stack's
// commands they run. A command that holds a fault (freeze, pause, cut-api)
// undoes it when it ends, also when it is ended early (SIGTERM): a test
// that fails or times out leaves no process stopped and no pod cut off.

const sidecarContainer = "hcp-sidecar"

// stack runs hack/local-stack.sh with args until it ends; it fails t if the
// command fails. The test's end stops it with SIGTERM.
func (r *samplesRun) stack(t *testing.T, args ...string) {
	t.Helper()
	r.stackOutput(t, args...)
}

// stackOutput is stack, returning the command's standard output.
func (r *samplesRun) stackOutput(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := r.stackCommand(t.Context(), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	if msg := strings.TrimSpace(stderr.String()); msg != "" {
		t.Logf("hack/local-stack.sh %s (%s):\n%s", strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond), indent(msg))
	}
	if err != nil {
		t.Fatalf("hack/local-stack.sh %s: %v\n%s", strings.Join(args, " "), err, stdout.String())
	}
	return stdout.String()
}

func (r *samplesRun) stackCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(r.cfg.root, "hack", "local-stack.sh"), args...)
	cmd.Dir = r.cfg.root
	// SIGTERM: the script undoes the fault it holds, and exits.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	return cmd
}

// stackProcess is a hack/local-stack.sh command holding a fault in the
// background while the test goes on.
type stackProcess struct {
	args    []string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
	mu      sync.Mutex
	out     strings.Builder
	stopped bool
	logged  sync.Once
}

func (p *stackProcess) write(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out.WriteString(line + "\n")
}

func (p *stackProcess) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.TrimSpace(p.out.String())
}

// startStack starts hack/local-stack.sh args and returns once it wrote a
// line containing ready: the fault is in place. It runs until it ends by
// itself or end stops it, at the latest when t ends.
func (r *samplesRun) startStack(t *testing.T, ready string, args ...string) *stackProcess {
	t.Helper()
	p := &stackProcess{args: args, done: make(chan struct{})}
	p.cmd = r.stackCommand(context.Background(), args...)
	pipe, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = nil
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("hack/local-stack.sh %s: %v", strings.Join(args, " "), err)
	}
	seen := make(chan struct{})
	go func() {
		var once sync.Once
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			p.write(sc.Text())
			if strings.Contains(sc.Text(), ready) {
				once.Do(func() { close(seen) })
			}
		}
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.end(t) })
	select {
	case <-seen:
		return p
	case <-p.done:
		t.Fatalf("hack/local-stack.sh %s ended (%v) before it wrote %q:\n%s", strings.Join(args, " "), p.err, ready, p.output())
	case <-time.After(time.Minute):
		p.end(t)
		t.Fatalf("hack/local-stack.sh %s did not write %q within a minute", strings.Join(args, " "), ready)
	}
	return nil
}

// end stops the command unless it ended (SIGTERM: it undoes its fault),
// waits for it and logs what it wrote. A command that failed by itself
// fails t.
func (p *stackProcess) end(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
	default:
		p.mu.Lock()
		p.stopped = true
		p.mu.Unlock()
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	p.logged.Do(func() {
		t.Logf("hack/local-stack.sh %s:\n%s", strings.Join(p.args, " "), indent(p.output()))
		p.mu.Lock()
		stopped := p.stopped
		p.mu.Unlock()
		if p.err != nil && !stopped {
			t.Errorf("hack/local-stack.sh %s: %v", strings.Join(p.args, " "), p.err)
		}
	})
}

// ownerLease is the Lease duration of the pod's sidecar, as its Lease
// says.
func (r *samplesRun) ownerLease(t *testing.T, pod *corev1.Pod) time.Duration {
	t.Helper()
	var l coordinationv1.Lease
	if err := r.c.Get(t.Context(), client.ObjectKey{Namespace: pod.Namespace, Name: lease.Name(pod.Name)}, &l); err != nil {
		t.Fatalf("the Lease of pod %s: %v", pod.Name, err)
	}
	if l.Spec.LeaseDurationSeconds == nil {
		t.Fatalf("the Lease of pod %s has no duration", pod.Name)
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
}

// containerPID is the host pid of a container's first process.
func (r *samplesRun) containerPID(t *testing.T, pod *corev1.Pod, container string) int {
	t.Helper()
	out := strings.TrimSpace(r.stackOutput(t, "pid", podRef(pod), container))
	pid, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("hack/local-stack.sh pid %s %s: %q is not a pid", podRef(pod), container, out)
	}
	return pid
}

func seconds(d time.Duration) string { return strconv.Itoa(int(d.Round(time.Second) / time.Second)) }

// pauseOwnerSidecar stops the owner's sidecar for twice its Lease and
// resumes it. The kubelet is frozen for that time too: its liveness probe
// (every 10 s, 3 failures) would kill the paused sidecar after about 30 s,
// and the Callee has no setting for the probe (the operator injects it,
// internal/resource). A stalled node (a paused VM, a host overloaded)
// stops its kubelet with its pods, so this is a zombie users meet: a
// frozen kubelet neither probes nor restarts anything, and the pod's
// other processes (the harness) run on. The same sidecar process must
// resume: its pid is checked.
func (r *samplesRun) pauseOwnerSidecar(t *testing.T, owner *corev1.Pod) {
	t.Helper()
	pause := 2 * r.ownerLease(t, owner)
	pid := r.containerPID(t, owner, sidecarContainer)
	// Frozen longer than the pause: the sidecar resumes first, so the
	// kubelet never probes a stopped sidecar; ended right after it.
	kubelet := r.startStack(t, "froze kubelet", "freeze", "kubelet", seconds(pause+time.Minute))
	r.stack(t, "pause", podRef(owner), sidecarContainer, seconds(pause))
	kubelet.end(t)
	if now := r.containerPID(t, owner, sidecarContainer); now != pid {
		t.Fatalf("pod %s: the sidecar (pid %d) did not resume, pid %d runs now: the fault tested a restart, not a zombie", owner.Name, pid, now)
	}
	t.Logf("pod %s: the sidecar (pid %d) resumed after %s", owner.Name, pid, pause)
	r.reconnectCaller(t)
}

// zombieOwner force-deletes the owner pod while the kubelet is frozen, so
// that its processes run on with the pod gone from the API, until another
// replica took its first session over and 10 s more; then the kubelet is
// thawed and stops them.
func (r *samplesRun) zombieOwner(t *testing.T, owner *corev1.Pod, ids []string) {
	t.Helper()
	lease := r.ownerLease(t, owner)
	pid := r.containerPID(t, owner, sidecarContainer)
	// The takeover comes a Lease duration after another replica saw the
	// pod and its Lease gone (its sweep runs every 30 s). The bound keeps
	// well within the 300 s after which a NotReady node's pods are evicted.
	wait := 3 * lease
	kubelet := r.startStack(t, "froze kubelet", "freeze", "kubelet", seconds(wait+time.Minute))
	if err := r.c.Delete(t.Context(), owner, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	var to string
	eventually(t, wait, "another replica took session "+ids[0]+" over from the deleted pod "+owner.Name, func(ctx context.Context) error {
		hs, err := r.session(ctx, ids[0])
		if err != nil {
			return err
		}
		if p := hs.Status.PodName; p != "" && p != owner.Name {
			to = p
			return nil
		}
		return fmt.Errorf("owned by %q, state %s", hs.Status.PodName, hs.Status.State)
	})
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the deleted pod's sidecar (pid %d) was gone before the takeover (%v): the fault tested no zombie", pid, err)
	}
	t.Logf("session %s taken over by %s %s after pod %s was deleted; its sidecar (pid %d) still runs",
		ids[0], to, time.Since(deleted).Round(100*time.Millisecond), owner.Name, pid)
	// What the zombie still does after the takeover, the checker sees.
	time.Sleep(10 * time.Second)
	kubelet.end(t)
	r.reconnectCaller(t)
}

// killHandoverReceiver starts a rolling update and SIGKILLs the sidecar of
// the pod that received the first session from the draining owner, as
// soon as the HCPSession names it.
func (r *samplesRun) killHandoverReceiver(t *testing.T, owner *corev1.Pod, ids []string) {
	t.Helper()
	r.patchCallee(t, fmt.Sprintf(`{"spec":{"harness":{"template":{"metadata":{"annotations":{"chaos.hcp.io/rollout":%q}}}}}}`, time.Now().Format(time.RFC3339Nano)))
	var to string
	eventually(t, 2*time.Minute, "session "+ids[0]+" handed over by pod "+owner.Name, func(ctx context.Context) error {
		hs, err := r.session(ctx, ids[0])
		if err != nil {
			return err
		}
		if p := hs.Status.PodName; p != "" && p != owner.Name {
			to = p
			return nil
		}
		return fmt.Errorf("owned by %q, state %s", hs.Status.PodName, hs.Status.State)
	})
	r.stack(t, "kill", r.ns+"/"+to, sidecarContainer, "KILL")
	t.Logf("session %s: pod %s received it from %s and lost its sidecar", ids[0], to, owner.Name)
}

// lastStepsRan fails t unless the harness has executed the last step of
// every session: a fault meant to span the sessions' completion must not
// end before the harnesses reached it.
func (r *samplesRun) lastStepsRan(t *testing.T, ids []string, last int) {
	t.Helper()
	if r.stepLog == "" {
		return
	}
	steps, _ := r.steps(t, ids)
	ran := map[string]bool{}
	for _, s := range steps {
		if s.Step == last {
			ran[s.Session] = true
		}
	}
	for _, id := range ids {
		if !ran[id] {
			t.Errorf("session %s had not run its step %d when the fault ended: the fault did not span its completion", id, last)
		}
	}
}
