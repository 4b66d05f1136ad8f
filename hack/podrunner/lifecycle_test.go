package main

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

// TestMain lets the test binary be the container init too: the runner
// starts every container as /proc/self/exe __container-init.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == initCommand {
		containerInit()
		return
	}
	os.Exit(m.Run())
}

// orderLog is a file the containers (shell scripts) and the test's hook
// endpoints append lines to; appends of a line are atomic, so the file's
// order is the order of events.
type orderLog string

func (l orderLog) add(t *testing.T, line string) {
	f, err := os.OpenFile(string(l), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o666)
	if err != nil {
		t.Error(err)
		return
	}
	defer func() { _ = f.Close() }()
	_, _ = f.WriteString(line + "\n")
}

func (l orderLog) lines(t *testing.T) []string {
	raw, err := os.ReadFile(string(l))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(raw)), "\n")
}

// before checks that each line appears, and in the order given.
func before(t *testing.T, lines []string, order ...string) {
	t.Helper()
	last := -1
	for _, want := range order {
		i := slices.Index(lines, want)
		if i < 0 {
			t.Errorf("%q never happened; log:\n%s", want, strings.Join(lines, "\n"))
			return
		}
		if i < last {
			t.Errorf("%q happened before %q; log:\n%s", want, order[slices.Index(order, want)-1], strings.Join(lines, "\n"))
		}
		last = i
	}
}

// shell is a container running a shell script that logs to $LOG. It logs
// "NAME up", and "NAME TERM" when it gets SIGTERM (then exits), unless
// ignoreTerm.
func shell(name, logFile string, ignoreTerm bool, extra string) corev1.Container {
	onTerm := `trap 'log "` + name + ` TERM"; exit 0' TERM`
	if ignoreTerm {
		onTerm = `trap '' TERM`
	}
	script := `log() { echo "$1" >> "$LOG"; }
log "` + name + ` up"
` + onTerm + `
` + extra + `
while :; do sleep 0.05; done`
	return corev1.Container{Name: name, Image: "test/sh:1", Command: []string{"/bin/sh", "-c", script},
		Env: []corev1.EnvVar{{Name: "LOG", Value: logFile}}}
}

func nativeSidecar(c corev1.Container) corev1.Container {
	c.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
	return c
}

// readyFileProbe is a startup probe passing once the file exists.
func readyFileProbe(file string) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", "test -e " + file}}},
		PeriodSeconds: 1, FailureThreshold: 30}
}

// startPod runs pod on a runner of its own: host network (no sandbox to
// build), a fake API, /bin/sh as the only image.
func startPod(t *testing.T, pod *corev1.Pod) *podWorker {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runs containers: needs root (mount and UTS namespaces)")
	}
	dir := t.TempDir()
	images := filepath.Join(dir, "images.yaml")
	table := "images:\n- repository: test/sh\n  env: [\"PATH=/usr/local/bin:/usr/bin:/bin\"]\n  files: {/bin/sh: /bin/sh}\n"
	if err := os.WriteFile(images, []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	netw, err := newNetwork("hcptest0", "10.9.0.0/29", nil)
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewSimpleClientset(pod)
	r := &runner{
		o:  options{imagesFile: images, stateDir: dir, logDir: dir, nodeName: "test", kubernetesVersion: "v1.36.3"},
		cs: cs, log: slog.New(slog.NewTextHandler(testLog{t}, nil)), src: fakeSource{}, tokens: newTokenCache(cs),
		net: netw, hostIP: "127.0.0.1", recorder: record.NewFakeRecorder(10000),
		mounts: &mountpoints{file: filepath.Join(dir, "mountpoints")}, workers: map[types.UID]*podWorker{},
	}
	pod.Spec.HostNetwork = true
	w := newPodWorker(r, pod)
	r.workers[pod.UID] = w
	go w.run()
	t.Cleanup(func() {
		w.stop(time.Second, false)
		<-w.done
	})
	return w
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// deleteAndWait deletes the pod as the API server would (a deletion
// timestamp and grace period) and waits for the runner to finish it.
func deleteAndWait(t *testing.T, w *podWorker, grace int64) time.Time {
	t.Helper()
	p := w.current().DeepCopy()
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = new(metav1.Now()), &grace
	start := time.Now()
	w.update(p)
	select {
	case <-w.done:
	case <-time.After(time.Duration(grace)*time.Second + 20*time.Second):
		t.Fatal("the pod did not stop")
	}
	return start
}

// waitFor waits until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 20s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *podWorker) ctrNamed(name string) *ctr {
	for _, c := range w.ctrs {
		if c.spec.Name == name {
			return c
		}
	}
	return nil
}

func (w *podWorker) terminatedState(name string) *corev1.ContainerStateTerminated {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ctrNamed(name).state.Terminated
}

// TestNativeSidecarOrder: native sidecars start first, each next container
// once the previous sidecar passed its startup probe; on deletion the
// regular containers' preStop hooks run (an HTTP GET on a named port of
// their own container, against the pod's address, and an exec) while
// everything still runs, each regular container gets SIGTERM once its hook
// returned, and the sidecars get SIGTERM after every regular container
// exited, the last one first. A sidecar's own preStop hook starts with the
// deletion.
func TestNativeSidecarOrder(t *testing.T) {
	dir := t.TempDir()
	log := orderLog(filepath.Join(dir, "order.log"))
	readyA, readyB := filepath.Join(dir, "a-ready"), filepath.Join(dir, "b-ready")

	// The drain endpoint: it takes a second, as a sidecar handing sessions
	// over would.
	var drains sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		drains.Add(1)
		defer drains.Done()
		log.add(t, "drain begin "+r.URL.Path)
		time.Sleep(time.Second)
		log.add(t, "drain end")
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	_, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)

	sideA := nativeSidecar(shell("side-a", string(log), false, `sleep 0.3; : > "`+readyA+`"; log "side-a ready"`))
	sideA.StartupProbe = readyFileProbe(readyA)
	sideA.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", `echo "side-a prestop" >> "$LOG"`}}}}
	sideB := nativeSidecar(shell("side-b", string(log), false, `sleep 0.3; : > "`+readyB+`"; log "side-b ready"`))
	sideB.StartupProbe = readyFileProbe(readyB)
	initC := corev1.Container{Name: "init-c", Image: "test/sh:1", Command: []string{"/bin/sh", "-c", `echo "init-c ran" >> "$LOG"`},
		Env: []corev1.EnvVar{{Name: "LOG", Value: string(log)}}}
	app1 := shell("app-1", string(log), false, "")
	app1.Ports = []corev1.ContainerPort{{Name: "probes", ContainerPort: int32(port)}}
	app1.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/drain", Port: intstr.FromString("probes")}}}
	app2 := shell("app-2", string(log), false, "")
	app2.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", `echo "app-2 prestop" >> "$LOG"`}}}}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "order", Namespace: "ns", UID: "0b6f3c1e-8d1a-4c3b-9a8e-1f2d3c4b5a01"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{sideA, sideB, initC},
			Containers:     []corev1.Container{app1, app2},
			// Time enough for the drain: the grace period is not what this
			// test is about.
			TerminationGracePeriodSeconds: new(int64(20)),
		},
	}
	w := startPod(t, pod)
	waitFor(t, "both regular containers up", func() bool {
		raw, _ := os.ReadFile(string(log))
		return strings.Contains(string(raw), "app-1 up") && strings.Contains(string(raw), "app-2 up")
	})
	before(t, log.lines(t), "side-a up", "side-a ready", "side-b up", "side-b ready", "init-c ran", "app-1 up")
	before(t, log.lines(t), "init-c ran", "app-2 up")

	deleteAndWait(t, w, 20)
	drains.Wait()
	lines := log.lines(t)
	// The drain runs while everything runs, and the app goes after it.
	before(t, lines, "drain begin /drain", "drain end", "app-1 TERM", "side-b TERM", "side-a TERM")
	before(t, lines, "app-2 prestop", "app-2 TERM", "side-b TERM")
	before(t, lines, "side-a prestop", "app-1 TERM")
	for _, name := range []string{"side-a", "side-b", "app-1", "app-2"} {
		if st := w.terminatedState(name); st == nil || st.ExitCode != 0 {
			t.Errorf("%s: terminated %+v, want exit 0 after its SIGTERM", name, st)
		}
	}
}

// TestGracePeriodKills: a preStop hook that never returns is abandoned when
// the grace period ends, the container that ignores SIGTERM is killed
// (after the kubelet's minimum of 2 seconds past its SIGTERM), and only
// then does the sidecar get its SIGTERM.
func TestGracePeriodKills(t *testing.T) {
	dir := t.TempDir()
	log := orderLog(filepath.Join(dir, "order.log"))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.add(t, "hook called")
		<-r.Context().Done() // never answers
	}))
	defer srv.Close()
	_, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)

	app := shell("app", string(log), true, "")
	app.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/drain", Port: intstr.FromInt(port)}}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "grace", Namespace: "ns", UID: "0b6f3c1e-8d1a-4c3b-9a8e-1f2d3c4b5a02"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{nativeSidecar(shell("side", string(log), false, ""))},
			Containers:     []corev1.Container{app},
		},
	}
	w := startPod(t, pod)
	waitFor(t, "the app up", func() bool {
		raw, _ := os.ReadFile(string(log))
		return strings.Contains(string(raw), "app up")
	})
	const grace = 2
	start := deleteAndWait(t, w, grace)
	appEnd, sideEnd := w.terminatedState("app"), w.terminatedState("side")
	if appEnd == nil || sideEnd == nil {
		t.Fatalf("app %+v, side %+v", appEnd, sideEnd)
	}
	if appEnd.ExitCode != 137 || appEnd.Signal != 9 {
		t.Errorf("app: exit %d signal %d, want SIGKILL", appEnd.ExitCode, appEnd.Signal)
	}
	// Hook abandoned at 2s, SIGTERM, SIGKILL 2s later.
	if took := appEnd.FinishedAt.Sub(start); took < grace*time.Second+minStopGrace-500*time.Millisecond || took > 8*time.Second {
		t.Errorf("app killed %s after the deletion, want about %s", took, grace*time.Second+minStopGrace)
	}
	if sideEnd.ExitCode != 0 || sideEnd.FinishedAt.Before(&appEnd.FinishedAt) {
		t.Errorf("side: exit %d at %s, app killed at %s: the sidecar must get SIGTERM after the app is gone", sideEnd.ExitCode, sideEnd.FinishedAt, appEnd.FinishedAt)
	}
	before(t, log.lines(t), "hook called", "side TERM")
}
