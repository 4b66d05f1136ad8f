package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The kubelet's container restart back-off.
const (
	initialBackoff = 10 * time.Second
	maxBackoff     = 5 * time.Minute
	// A container that ran this long without failing starts over at the
	// initial back-off.
	backoffReset = 10 * time.Minute
	// volumeResync is how often Secret, ConfigMap and token volumes are
	// refreshed (the kubelet's sync period is about a minute).
	volumeResync = time.Minute
)

type containerKind int

const (
	kindRegular containerKind = iota
	kindInit
	kindSidecar // an init container with restartPolicy Always
)

// ctr is the runner's record of one container of a pod.
type ctr struct {
	spec         corev1.Container
	kind         containerKind
	restartCount int32
	hadRun       bool
	state        corev1.ContainerState
	lastState    corev1.ContainerState
	ready        bool
	started      bool
	containerID  string
	imageID      string
	proc         *proc
	// startedCh is closed when the container first counts as started (the
	// next init container may run once a sidecar has started).
	startedCh chan struct{}
	// hookDone is closed when a sidecar's preStop hook, started with the
	// pod's deletion, returned (lifecycle.go).
	hookDone chan struct{}
}

type podWorker struct {
	r   *runner
	uid types.UID
	dir string

	mu           sync.Mutex
	pod          *corev1.Pod
	ctrs         []*ctr
	ip           string
	sandboxReady bool
	initialized  bool
	startTime    *metav1.Time
	phase        corev1.PodPhase // set once the pod has finished
	volumeErr    string
	condTimes    map[corev1.PodConditionType]condTime

	terminating bool
	deadline    time.Time // of the graceful stop
	finalDelete bool      // delete the Pod object once stopped
	stopCh      chan struct{}
	kick        chan struct{}
	lastStatus  []byte
	done        chan struct{}
}

func newPodWorker(r *runner, pod *corev1.Pod) *podWorker {
	w := &podWorker{
		r: r, uid: pod.UID, dir: r.podDir(pod.UID), pod: pod,
		stopCh: make(chan struct{}), kick: make(chan struct{}, 1), done: make(chan struct{}),
	}
	prev := map[string]corev1.ContainerStatus{}
	for _, s := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		prev[s.Name] = s
	}
	add := func(c corev1.Container, kind containerKind) {
		x := &ctr{spec: c, kind: kind, startedCh: make(chan struct{})}
		if s, ok := prev[c.Name]; ok {
			// A previous run of the runner ran it: like after a node
			// reboot, the next start counts as a restart.
			x.restartCount = s.RestartCount
			x.hadRun = s.State.Running != nil || s.State.Terminated != nil || s.LastTerminationState.Terminated != nil
		}
		w.ctrs = append(w.ctrs, x)
	}
	for _, c := range pod.Spec.InitContainers {
		kind := kindInit
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			kind = kindSidecar
		}
		add(c, kind)
	}
	for _, c := range pod.Spec.Containers {
		add(c, kindRegular)
	}
	if pod.Status.StartTime != nil {
		w.startTime = pod.Status.StartTime
	}
	return w
}

func (w *podWorker) current() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod
}

func (w *podWorker) logAttrs() []any {
	p := w.current()
	return []any{"pod", p.Namespace + "/" + p.Name}
}

func (w *podWorker) event(eventType, reason, format string, args ...any) {
	w.r.recorder.Eventf(w.current(), eventType, reason, format, args...)
}

// update takes a newer version of the Pod; a deletion timestamp starts the
// graceful stop.
func (w *podWorker) update(pod *corev1.Pod) {
	w.mu.Lock()
	w.pod = pod
	start := pod.DeletionTimestamp != nil && !w.terminating
	if start {
		grace := int64(30)
		switch {
		case pod.DeletionGracePeriodSeconds != nil:
			grace = *pod.DeletionGracePeriodSeconds
		case pod.Spec.TerminationGracePeriodSeconds != nil:
			grace = *pod.Spec.TerminationGracePeriodSeconds
		}
		w.terminating, w.finalDelete = true, true
		w.deadline = time.Now().Add(time.Duration(grace) * time.Second)
	}
	w.mu.Unlock()
	if start {
		close(w.stopCh)
	}
}

// gone stops a pod deleted from the API behind our back (a forced delete).
func (w *podWorker) gone() { w.stop(2*time.Second, false) }

// shutdown stops the pod because the runner stops; the Pod object stays.
func (w *podWorker) shutdown() {
	w.stop(10*time.Second, false)
	<-w.done
}

func (w *podWorker) stop(grace time.Duration, finalDelete bool) {
	w.mu.Lock()
	if w.terminating {
		// Shorten an ongoing graceful stop, never lengthen it.
		if d := time.Now().Add(grace); d.Before(w.deadline) {
			w.deadline = d
		}
		w.finalDelete = w.finalDelete && finalDelete
		w.mu.Unlock()
		return
	}
	w.terminating, w.finalDelete = true, finalDelete
	w.deadline = time.Now().Add(grace)
	w.mu.Unlock()
	close(w.stopCh)
}

func (w *podWorker) stopDeadline() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deadline
}

func (w *podWorker) changed() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *podWorker) run() {
	defer close(w.done)
	defer w.r.removeWorker(w.uid)
	statusCtx, stopStatus := context.WithCancel(context.Background())
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		w.statusLoop(statusCtx)
	}()

	// mainCtx ends regular and init containers; each sidecar has its own
	// context, ended after the main containers have exited, in reverse
	// order (lifecycle.go). mainCtx ends only through stopCh, which
	// carries the grace period: the runner's own shutdown stops pods
	// through it too.
	mainCtx, stopMain := context.WithCancel(context.Background())
	go func() {
		<-w.stopCh
		w.startSidecarHooks()
		stopMain()
	}()

	w.mu.Lock()
	if w.startTime == nil {
		w.startTime = new(metav1.Now())
	}
	w.mu.Unlock()
	w.changed()

	var mainWG sync.WaitGroup
	var sidecars []sidecarRun
	if w.prepare(mainCtx) {
		go w.refreshVolumes(mainCtx)
		sidecars = w.runContainers(mainCtx, &mainWG)
	}
	mainWG.Wait()
	w.stopSidecars(sidecars)

	// The pod has finished on its own (restartPolicy Never/OnFailure), or
	// is being stopped. A finished pod keeps its object until deleted.
	w.teardown()
	<-w.stopCh
	w.mu.Lock()
	finalDelete := w.finalDelete
	w.mu.Unlock()
	if finalDelete {
		// Let the status loop write the terminated containers first.
		w.changed()
		time.Sleep(200 * time.Millisecond)
	}
	stopStatus()
	<-statusDone
	if finalDelete {
		if err := w.r.deletePod(context.Background(), w.current()); err != nil {
			w.r.log.Error("Deleting the pod failed", append(w.logAttrs(), "err", err)...)
		}
	}
	w.r.tokens.forget(string(w.uid))
	_ = os.RemoveAll(w.dir)
	w.r.log.Info("Pod stopped", w.logAttrs()...)
}

// prepare creates the sandbox (network namespace, /etc/hosts) and the
// volumes, retrying until it works or the pod is stopped.
func (w *podWorker) prepare(ctx context.Context) bool {
	pod := w.current()
	delay := time.Second
	for {
		err := w.createSandbox(ctx, pod)
		if err == nil {
			break
		}
		w.event(corev1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
		w.r.log.Error("Creating the sandbox failed", append(w.logAttrs(), "err", err)...)
		if !sleepCtx(ctx, delay) {
			return false
		}
		delay = min(delay*2, 30*time.Second)
	}
	w.mu.Lock()
	w.sandboxReady = true
	w.mu.Unlock()
	w.changed()
	delay = time.Second
	for {
		err := w.syncVolumes(ctx)
		w.mu.Lock()
		w.volumeErr = ""
		if err != nil {
			w.volumeErr = err.Error()
		}
		w.mu.Unlock()
		w.changed()
		if err == nil {
			return true
		}
		w.event(corev1.EventTypeWarning, "FailedMount", "%v", err)
		if !sleepCtx(ctx, delay) {
			return false
		}
		delay = min(delay*2, 30*time.Second)
	}
}

func (w *podWorker) createSandbox(ctx context.Context, pod *corev1.Pod) error {
	if err := os.MkdirAll(filepath.Join(w.dir, "containers"), 0o700); err != nil {
		return err
	}
	ip := w.r.hostIP
	hostname := w.r.o.nodeName
	if !pod.Spec.HostNetwork {
		var preferred netip.Addr
		if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			preferred = a
		}
		a, err := w.r.net.allocate(string(pod.UID), preferred)
		if err != nil {
			return err
		}
		if err := w.r.net.createSandbox(ctx, string(pod.UID), a); err != nil {
			return err
		}
		ip = a.String()
		hostname = podHostname(pod)
	}
	var aliases []hostAlias
	for _, a := range pod.Spec.HostAliases {
		aliases = append(aliases, hostAlias{ip: a.IP, hostnames: a.Hostnames})
	}
	hosts := hostsFile(ip, hostname, pod.Spec.Subdomain, pod.Namespace, aliases)
	if err := os.WriteFile(filepath.Join(w.dir, "etc-hosts"), hosts, 0o644); err != nil {
		return err
	}
	w.mu.Lock()
	w.ip = ip
	w.mu.Unlock()
	return nil
}

func podHostname(pod *corev1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	if len(pod.Name) > 63 {
		return pod.Name[:63]
	}
	return pod.Name
}

func (w *podWorker) envContext() podEnvContext {
	w.mu.Lock()
	defer w.mu.Unlock()
	return podEnvContext{
		pod: w.pod, podIP: w.ip, hostIP: w.r.hostIP, nodeName: w.r.o.nodeName,
		allocatable: corev1.ResourceList{corev1.ResourceCPU: w.r.o.cpu, corev1.ResourceMemory: w.r.o.memory},
	}
}

func (w *podWorker) volumeDir(name string) string { return filepath.Join(w.dir, "volumes", name) }

// syncVolumes writes every generated volume and creates the directories of
// emptyDirs; it is called again every volumeResync to pick up changed
// Secrets and ConfigMaps and to renew tokens.
func (w *podWorker) syncVolumes(ctx context.Context) error {
	pc := w.envContext()
	pod := pc.pod
	gid := -1
	if pod.Spec.SecurityContext != nil && pod.Spec.SecurityContext.FSGroup != nil {
		gid = int(*pod.Spec.SecurityContext.FSGroup)
	}
	var errs []error
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		files, generated, err := volumeFiles(ctx, w.r.src, w.r.tokens, pc, v)
		if err != nil {
			errs = append(errs, fmt.Errorf("MountVolume.SetUp failed for volume %q: %w", v.Name, err))
			continue
		}
		dir := w.volumeDir(v.Name)
		switch {
		case generated:
			if _, err := writeAtomic(dir, files, gid); err != nil {
				errs = append(errs, fmt.Errorf("volume %q: %w", v.Name, err))
			}
		case v.EmptyDir != nil:
			if err := os.MkdirAll(dir, 0o777); err != nil {
				errs = append(errs, err)
				continue
			}
			// World-writable like the kubelet's emptyDir (umask aside).
			_ = os.Chmod(dir, 0o777)
			if gid >= 0 {
				_ = os.Chown(dir, 0, gid)
				_ = os.Chmod(dir, 0o777|os.ModeSetgid)
			}
		case v.HostPath != nil:
			t := v.HostPath.Type
			if t != nil && (*t == corev1.HostPathDirectoryOrCreate) {
				if err := os.MkdirAll(v.HostPath.Path, 0o755); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

func (w *podWorker) refreshVolumes(ctx context.Context) {
	t := time.NewTicker(volumeResync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := w.syncVolumes(ctx); err != nil && ctx.Err() == nil {
				w.r.log.Error("Refreshing volumes failed", append(w.logAttrs(), "err", err)...)
			}
		}
	}
}

// runContainers runs the init containers in order (a sidecar stays
// running, and the next container starts once it has started: after its
// startup probe passed, if it has one), then starts every regular
// container; it returns once they are started, with the sidecars it
// started, in order.
func (w *podWorker) runContainers(mainCtx context.Context, mainWG *sync.WaitGroup) []sidecarRun {
	pod := w.current()
	initPolicy := corev1.RestartPolicyOnFailure
	if pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
		initPolicy = corev1.RestartPolicyNever
	}
	var sidecars []sidecarRun
	for _, c := range w.ctrs {
		switch c.kind {
		case kindSidecar:
			ctx, cancel := context.WithCancel(context.Background())
			s := sidecarRun{c: c, cancel: cancel, done: make(chan struct{})}
			sidecars = append(sidecars, s)
			go func() {
				defer close(s.done)
				w.supervise(ctx, c, corev1.RestartPolicyAlways)
			}()
			select {
			case <-c.startedCh:
			case <-mainCtx.Done():
				return sidecars
			}
		case kindInit:
			if !w.supervise(mainCtx, c, initPolicy) {
				if mainCtx.Err() == nil {
					w.finish(corev1.PodFailed)
				}
				return sidecars
			}
		}
	}
	w.mu.Lock()
	w.initialized = true
	w.mu.Unlock()
	w.changed()
	var regular sync.WaitGroup
	results := make(chan bool, len(w.ctrs))
	for _, c := range w.ctrs {
		if c.kind != kindRegular {
			continue
		}
		regular.Add(1)
		mainWG.Add(1)
		go func() {
			defer mainWG.Done()
			defer regular.Done()
			results <- w.supervise(mainCtx, c, pod.Spec.RestartPolicy)
		}()
	}
	mainWG.Add(1)
	go func() {
		defer mainWG.Done()
		regular.Wait()
		close(results)
		if mainCtx.Err() != nil {
			return
		}
		phase := corev1.PodSucceeded
		for ok := range results {
			if !ok {
				phase = corev1.PodFailed
			}
		}
		w.finish(phase)
	}()
	return sidecars
}

func (w *podWorker) finish(phase corev1.PodPhase) {
	w.mu.Lock()
	w.phase = phase
	w.mu.Unlock()
	w.changed()
}

// teardown removes the network namespace and the volumes; the processes
// are gone by now.
func (w *podWorker) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.r.net.deleteSandbox(ctx, string(w.uid))
	w.r.net.release(string(w.uid))
	w.mu.Lock()
	w.sandboxReady = false
	w.mu.Unlock()
	w.changed()
}

// statusLoop writes the Pod status whenever it changes, coalescing bursts.
func (w *podWorker) statusLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return
		}
		select {
		case <-w.kick:
		default:
		}
		if err := w.writeStatus(ctx); err != nil && ctx.Err() == nil {
			w.r.log.Error("Writing the pod status failed", append(w.logAttrs(), "err", err)...)
			sleepCtx(ctx, time.Second)
			w.changed()
		}
	}
}

func (w *podWorker) writeStatus(ctx context.Context) error {
	w.mu.Lock()
	status := w.status(metav1.Now())
	pod := w.pod
	w.mu.Unlock()
	raw, err := json.Marshal(status)
	if err != nil {
		return err
	}
	w.mu.Lock()
	same := string(raw) == string(w.lastStatus)
	w.mu.Unlock()
	if same {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	_, err = w.r.cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.lastStatus = raw
	w.mu.Unlock()
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
