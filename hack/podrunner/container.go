package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const reasonCreateConfig = "CreateContainerConfigError"

// waitingError keeps a container from being created at all: it stays
// Waiting with this reason (CreateContainerConfigError, ErrImagePull).
type waitingError struct{ reason, msg string }

func (e *waitingError) Error() string { return e.msg }

// startError is a container that was created but could not start (a
// missing program, a failed mount): Terminated, reason StartError, exit 128.
type startError struct{ msg string }

func (e *startError) Error() string { return e.msg }

// proc is one run of a container's process.
type proc struct {
	cmd       *exec.Cmd
	pid       int
	startedAt time.Time
	done      chan struct{}
	exit      corev1.ContainerStateTerminated // valid once done is closed
	logPath   string
	logOffset int64 // where this run's output starts in the log
}

// supervise runs a container until it terminates for good under policy or
// ctx ends (then it stops it gracefully). It reports whether the last run
// succeeded.
func (w *podWorker) supervise(ctx context.Context, c *ctr, policy corev1.RestartPolicy) bool {
	backoff := initialBackoff
	for {
		p, err := w.startContainer(ctx, c)
		var werr *waitingError
		switch {
		case ctx.Err() != nil:
			if p != nil {
				w.stopProc(c, p, "the pod is being deleted")
			}
			return false
		case errors.As(err, &werr):
			w.setState(c, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: werr.reason, Message: werr.msg}})
			w.event(corev1.EventTypeWarning, "Failed", "Error: %s", werr.msg)
			if !sleepCtx(ctx, backoff) {
				return false
			}
			backoff = min(backoff*2, maxBackoff)
			continue
		case err != nil:
			now := metav1.Now()
			w.terminated(c, corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error(), StartedAt: now, FinishedAt: now})
			w.event(corev1.EventTypeWarning, "Failed", "Error: %v", err)
		default:
			go w.probe(ctx, c, p)
			select {
			case <-p.done:
			case <-ctx.Done():
				w.stopProc(c, p, "the pod is being deleted")
				<-p.done
				w.terminated(c, p.exit)
				return false
			}
			if p.exit.ExitCode != 0 && c.spec.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
				p.exit.Message = terminationMessage(p.logPath, p.logOffset)
			}
			w.terminated(c, p.exit)
			if time.Since(p.startedAt) > backoffReset {
				backoff = initialBackoff
			}
		}
		succeeded := w.lastExitCode(c) == 0
		if policy == corev1.RestartPolicyNever || (policy == corev1.RestartPolicyOnFailure && succeeded) {
			return succeeded
		}
		pod := w.current()
		msg := fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", backoff, c.spec.Name, pod.Name, pod.Namespace, pod.UID)
		w.mu.Lock()
		// While it waits, the run that ended is the last state.
		c.lastState = c.state
		c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: msg}}
		w.mu.Unlock()
		w.changed()
		w.event(corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)", c.spec.Name, pod.Name, pod.Namespace, pod.UID)
		if !sleepCtx(ctx, backoff) {
			return false
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

func (w *podWorker) setState(c *ctr, s corev1.ContainerState) {
	w.mu.Lock()
	c.state = s
	if s.Running == nil {
		c.ready = false
	}
	w.mu.Unlock()
	w.changed()
}

func (w *podWorker) terminated(c *ctr, t corev1.ContainerStateTerminated) {
	w.mu.Lock()
	c.state = corev1.ContainerState{Terminated: &t}
	c.ready = false
	c.started = false
	c.proc = nil
	w.mu.Unlock()
	w.changed()
	w.r.log.Info("Container exited", append(w.logAttrs(), "container", c.spec.Name, "exitCode", t.ExitCode, "reason", t.Reason)...)
}

func (w *podWorker) lastExitCode(c *ctr) int32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c.state.Terminated != nil {
		return c.state.Terminated.ExitCode
	}
	return -1
}

// startContainer prepares a container (image, command, environment, user,
// mounts) and starts its process through the init subcommand.
func (w *podWorker) startContainer(ctx context.Context, c *ctr) (*proc, error) {
	pc := w.envContext()
	pod := pc.pod
	images, err := loadImages(w.r.o.imagesFile)
	if err != nil {
		return nil, &waitingError{"ErrImagePull", fmt.Sprintf("reading the pod runner's image table: %v", err)}
	}
	img, ok := images.lookup(c.spec.Image)
	if !ok {
		return nil, &waitingError{"ErrImagePull", fmt.Sprintf("image %q is not available on this node: the local pod runner maps only %s to local binaries (image table %s)",
			c.spec.Image, strings.Join(images.repositories(), ", "), w.r.o.imagesFile)}
	}
	env, envMap, err := containerEnv(ctx, w.r.src, pc, &c.spec)
	if err != nil {
		return nil, &waitingError{reasonCreateConfig, err.Error()}
	}
	hostname := podHostname(pod)
	if pod.Spec.HostNetwork {
		hostname, _ = os.Hostname()
	}
	// The runtime's environment: HOSTNAME, the image's ENV, then the
	// container's, later ones replacing earlier ones of the same name.
	fullEnv := mergeEnv(append(append([]string{"HOSTNAME=" + hostname}, img.Env...), env...))

	// From here on the container counts as created: a failure is a
	// StartError, and the next attempt a restart.
	imageID := ""
	created := func(p *proc, err error) (*proc, error) {
		w.mu.Lock()
		if c.hadRun {
			c.restartCount++
		}
		c.hadRun = true
		c.imageID = imageID
		c.containerID = fmt.Sprintf("hcp-podrunner://%s/%s/%d", pod.UID, c.spec.Name, c.restartCount)
		if err == nil {
			c.proc = p
			c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(p.startedAt)}}
			c.ready = false
			c.started = c.spec.StartupProbe == nil
		}
		startedNow := err == nil && c.started
		w.mu.Unlock()
		if startedNow {
			w.markStarted(c)
		}
		w.changed()
		return p, err
	}
	argv, err := commandLine(c.spec, img, envMap)
	if err != nil {
		return created(nil, &startError{err.Error()})
	}
	binary, err := img.resolve(argv[0], fullEnv)
	if err != nil {
		return created(nil, &startError{err.Error()})
	}
	info, err := os.Stat(binary)
	if err != nil || info.IsDir() {
		return created(nil, &startError{fmt.Sprintf("exec: %q: the image table maps it to %s, which does not exist here (build it first, e.g. make build)", argv[0], binary)})
	}
	imageID = "local://" + binary
	if sum, err := fileSHA256(binary); err == nil {
		imageID += "@sha256:" + sum
	}

	spec := initSpec{Binary: binary, Argv: argv, Env: fullEnv, Hostname: hostname}
	if !pod.Spec.HostNetwork {
		spec.NetNS = netnsPath(netnsName(string(pod.UID)))
	}
	if err := w.userSpec(&spec, pod, &c.spec, img); err != nil {
		return nil, err
	}
	if spec.Mounts, err = w.mounts(pod, &c.spec, envMap); err != nil {
		var serr *startError
		if errors.As(err, &serr) {
			return created(nil, err)
		}
		return nil, err
	}
	spec.WorkingDir = c.spec.WorkingDir
	if spec.WorkingDir == "" {
		spec.WorkingDir = img.dir()
	}
	if err := w.r.mounts.ensure(spec.WorkingDir, false); err != nil {
		return created(nil, &startError{fmt.Sprintf("working directory %s: %v", spec.WorkingDir, err)})
	}

	logPath := filepath.Join(w.r.o.logDir, fmt.Sprintf("%s_%s_%s.log", pod.Namespace, pod.Name, c.spec.Name))
	p, err := created(launch(spec, logPath, filepath.Join(w.dir, "containers", c.spec.Name+".pid")))
	if err != nil {
		return nil, err
	}
	w.event(corev1.EventTypeNormal, "Pulled", "Container image %q maps to the local binary %s", c.spec.Image, binary)
	w.event(corev1.EventTypeNormal, "Started", "Started container %s", c.spec.Name)
	if l := c.spec.Lifecycle; l != nil && l.PostStart != nil {
		w.event(corev1.EventTypeWarning, "HookNotRun", "Container %s has a postStart hook; the local pod runner does not run it (it runs preStop hooks)", c.spec.Name)
	}
	w.r.log.Info("Container started", append(w.logAttrs(), "container", c.spec.Name, "pid", p.pid, "argv", argv, "uid", spec.UID)...)
	return p, nil
}

func (w *podWorker) markStarted(c *ctr) {
	select {
	case <-c.startedCh:
	default:
		close(c.startedCh)
	}
}

// commandLine is what the runtime executes: the container's command or the
// image's entrypoint, then the container's args or (with neither command nor
// args set) the image's cmd. $(VAR) references in the container's command
// and args are expanded.
func commandLine(c corev1.Container, img *imageConfig, env map[string]string) ([]string, error) {
	mapping := mappingFuncFor(env)
	exp := func(in []string) []string {
		out := make([]string, len(in))
		for i, s := range in {
			out[i] = expand(s, mapping)
		}
		return out
	}
	var argv []string
	switch {
	case len(c.Command) > 0:
		argv = append(exp(c.Command), exp(c.Args)...)
	case len(c.Args) > 0:
		argv = append(slices.Clone(img.Entrypoint), exp(c.Args)...)
	default:
		argv = append(slices.Clone(img.Entrypoint), img.Cmd...)
	}
	if len(argv) == 0 {
		return nil, errors.New("no command specified: the container has no command and the image no entrypoint")
	}
	return argv, nil
}

func mergeEnv(env []string) []string {
	idx := map[string]int{}
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// userSpec applies the security context: user and groups (the container's
// settings over the pod's over the image's USER), runAsNonRoot, a read-only
// root filesystem and no_new_privs.
func (w *podWorker) userSpec(spec *initSpec, pod *corev1.Pod, c *corev1.Container, img *imageConfig) error {
	imgUID, imgGID, err := img.user()
	if err != nil {
		return &waitingError{reasonCreateConfig, err.Error()}
	}
	psc := pod.Spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	csc := c.SecurityContext
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}
	uid, gid := imgUID, imgGID
	runAsUser := firstNonNil(csc.RunAsUser, psc.RunAsUser)
	if runAsUser != nil {
		uid = *runAsUser
		if uid != imgUID {
			gid = 0
		}
	}
	if g := firstNonNil(csc.RunAsGroup, psc.RunAsGroup); g != nil {
		gid = *g
	}
	if nonRoot := firstNonNil(csc.RunAsNonRoot, psc.RunAsNonRoot); nonRoot != nil && *nonRoot && uid == 0 {
		return &waitingError{reasonCreateConfig, "container has runAsNonRoot and image will run as root (pod: \"" + pod.Name + "_" + pod.Namespace + "(" + string(pod.UID) + ")\", container: " + c.Name + ")"}
	}
	spec.UID, spec.GID = int(uid), int(gid)
	for _, g := range psc.SupplementalGroups {
		spec.Groups = append(spec.Groups, int(g))
	}
	if psc.FSGroup != nil {
		spec.Groups = append(spec.Groups, int(*psc.FSGroup))
	}
	spec.ReadOnlyRoot = csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem
	spec.NoNewPrivs = csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation
	return nil
}

func firstNonNil[T any](ps ...*T) *T {
	for _, p := range ps {
		if p != nil {
			return p
		}
	}
	return nil
}

// mounts lists the container's bind mounts: /etc/hosts, then its
// volumeMounts in order. Secret, ConfigMap, projected and downward-API
// volumes are read-only, as the kubelet mounts them.
func (w *podWorker) mounts(pod *corev1.Pod, c *corev1.Container, env map[string]string) ([]mountSpec, error) {
	var out []mountSpec
	mountsHosts := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return filepath.Clean(m.MountPath) == "/etc/hosts" })
	if !pod.Spec.HostNetwork && !mountsHosts {
		out = append(out, mountSpec{Source: filepath.Join(w.dir, "etc-hosts"), Target: "/etc/hosts"})
	}
	for _, m := range c.VolumeMounts {
		var vol *corev1.Volume
		for i := range pod.Spec.Volumes {
			if pod.Spec.Volumes[i].Name == m.Name {
				vol = &pod.Spec.Volumes[i]
			}
		}
		if vol == nil {
			return nil, &waitingError{reasonCreateConfig, fmt.Sprintf("volumeMount %q: no volume of that name in the pod", m.Name)}
		}
		src := w.volumeDir(m.Name)
		if vol.HostPath != nil {
			src = vol.HostPath.Path
		}
		readOnly := m.ReadOnly || vol.Secret != nil || vol.ConfigMap != nil || vol.Projected != nil || vol.DownwardAPI != nil
		sub := m.SubPath
		if m.SubPathExpr != "" {
			sub = expand(m.SubPathExpr, mappingFuncFor(env))
		}
		if sub != "" {
			if filepath.IsAbs(sub) || slices.Contains(strings.Split(sub, "/"), "..") {
				return nil, &waitingError{reasonCreateConfig, fmt.Sprintf("volumeMount %q: invalid subPath %q", m.Name, sub)}
			}
			src = filepath.Join(src, sub)
			if vol.EmptyDir != nil {
				_ = os.MkdirAll(src, 0o777)
			}
			// A subPath of a generated volume is a symlink through ..data:
			// mount what it points to now (it then no longer updates, as
			// with the kubelet).
			if r, err := filepath.EvalSymlinks(src); err == nil {
				src = r
			}
		}
		info, err := os.Stat(src)
		if err != nil {
			return nil, &startError{fmt.Sprintf("mount volume %q at %s: %v", m.Name, m.MountPath, err)}
		}
		if err := w.r.mounts.ensure(m.MountPath, !info.IsDir()); err != nil {
			return nil, &startError{fmt.Sprintf("create mount point %s: %v", m.MountPath, err)}
		}
		out = append(out, mountSpec{Source: src, Target: m.MountPath, ReadOnly: readOnly})
	}
	return out, nil
}

// launch starts the init subcommand in new mount and UTS namespaces and
// hands it the spec; it returns once the program is exec'd (or failed to).
func launch(spec initSpec, logPath, pidFile string) (*proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	var offset int64
	if st, err := logFile.Stat(); err == nil {
		offset = st.Size()
	}
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer func() { _ = errR.Close() }()
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer func() { _ = devNull.Close() }()
	cmd := exec.Command("/proc/self/exe", initCommand)
	cmd.Args[0] = "hcp-podrunner-init"
	cmd.Env = []string{}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devNull, logFile, logFile
	cmd.ExtraFiles = []*os.File{specR, errW}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:      true,
		Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
	}
	err = cmd.Start()
	_ = specR.Close()
	_ = errW.Close()
	if err != nil {
		_ = specW.Close()
		return nil, &startError{fmt.Sprintf("start the container init: %v", err)}
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, startedAt: time.Now(), done: make(chan struct{}), logPath: logPath, logOffset: offset}
	writePidFile(pidFile, p.pid)
	raw, _ := json.Marshal(spec)
	_, _ = specW.Write(raw)
	_ = specW.Close()
	_ = errR.SetReadDeadline(time.Now().Add(30 * time.Second))
	msg, _ := io.ReadAll(errR)
	go func() {
		_ = cmd.Wait()
		p.exit = exitState(cmd.ProcessState, p.startedAt)
		close(p.done)
	}()
	if len(msg) > 0 {
		<-p.done
		return nil, &startError{string(msg)}
	}
	return p, nil
}

func exitState(ps *os.ProcessState, started time.Time) corev1.ContainerStateTerminated {
	t := corev1.ContainerStateTerminated{StartedAt: metav1.NewTime(started), FinishedAt: metav1.Now()}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		t.ExitCode = 128 + int32(ws.Signal())
		t.Signal = int32(ws.Signal())
		t.Reason = "Error"
	default:
		t.ExitCode = int32(ps.ExitCode())
		t.Reason = "Completed"
		if t.ExitCode != 0 {
			t.Reason = "Error"
		}
	}
	return t
}

// stopProc stops a container: its preStop hook (see lifecycle.go), then
// SIGTERM to its process group, SIGKILL when the pod's grace period is over
// (but not before minStopGrace after the SIGTERM).
func (w *podWorker) stopProc(c *ctr, p *proc, why string) {
	w.preStopDone(c, p, w.stopDeadline())
	w.event(corev1.EventTypeNormal, "Killing", "Stopping container %s: %s", c.spec.Name, why)
	_ = syscall.Kill(-p.pid, syscall.SIGTERM)
	wait := max(time.Until(w.stopDeadline()), minStopGrace)
	select {
	case <-p.done:
	case <-time.After(wait):
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		<-p.done
	}
	// Whatever the program left in its group goes too.
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
}

// killForRestart stops a container that failed its liveness or startup
// probe, its preStop hook first, as the kubelet does; supervise then
// restarts it under the pod's restart policy.
func (w *podWorker) killForRestart(c *ctr, p *proc, grace time.Duration, why string) {
	deadline := time.Now().Add(grace)
	w.runPreStop(c, p, deadline)
	w.event(corev1.EventTypeNormal, "Killing", "Container %s %s, will be restarted", c.spec.Name, why)
	_ = syscall.Kill(-p.pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(max(time.Until(deadline), minStopGrace)):
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
}

// terminationMessage is the tail of the log, for
// terminationMessagePolicy FallbackToLogsOnError (the kubelet's 80 lines or
// 2 KiB).
func terminationMessage(logPath string, from int64) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	const maxBytes = 2048
	if st, err := f.Stat(); err == nil {
		_, _ = f.Seek(max(from, st.Size()-maxBytes), io.SeekStart)
	}
	raw, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	return strings.Join(lines, "\n")
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writePidFile records "pid starttime" so that a later run can kill a
// leftover process without hitting a reused pid.
func writePidFile(path string, pid int) {
	_ = os.WriteFile(path, []byte(fmt.Sprintf("%d %s\n", pid, procStartTime(pid))), 0o600)
}

func procStartTime(pid int) string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// Field 22, counted after the parenthesised command name.
	s := string(raw)
	if i := strings.LastIndex(s, ")"); i >= 0 {
		f := strings.Fields(s[i+1:])
		if len(f) > 19 {
			return f[19]
		}
	}
	return ""
}

func killStale(pidFile string, log *slog.Logger) {
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	f := strings.Fields(string(raw))
	if len(f) < 2 {
		return
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 1 || procStartTime(pid) != f[1] {
		return
	}
	log.Info("Killing a container process left by a previous run", "pid", pid)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}
