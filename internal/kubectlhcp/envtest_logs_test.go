package kubectlhcp

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// logs against a real API server. envtest has no kubelet, so pods/log is
// a stand-in (fakeLogs) serving what the test writes; the session, its
// watch and the pods are real.

// fakeLogs serves each pod's lines ("TIME text"); a follow stream stays
// open for new lines until the pod's container exits (exit) or the
// request is cancelled.
type fakeLogs struct {
	mu       sync.Mutex
	lines    map[string][]string
	exited   map[string]bool
	requests []string
}

func newFakeLogs() *fakeLogs {
	return &fakeLogs{lines: map[string][]string{}, exited: map[string]bool{}}
}

func (f *fakeLogs) write(pod, text string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lines[pod] = append(f.lines[pod], at.UTC().Format(time.RFC3339Nano)+" "+text+"\n")
}

func (f *fakeLogs) exit(pod string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exited[pod] = true
}

func (f *fakeLogs) Logs(ctx context.Context, ns, pod, container string, o LogRequest) (io.ReadCloser, error) {
	f.mu.Lock()
	f.requests = append(f.requests, fmt.Sprintf("%s/%s follow=%v", pod, container, o.Follow))
	f.mu.Unlock()
	r, w := io.Pipe()
	go func() {
		sent := 0
		for {
			f.mu.Lock()
			lines, exited := f.lines[pod][sent:], f.exited[pod]
			f.mu.Unlock()
			for _, l := range lines {
				if _, err := io.WriteString(w, l); err != nil {
					return
				}
				sent++
			}
			if !o.Follow || exited {
				_ = w.Close()
				return
			}
			select {
			case <-ctx.Done():
				_ = w.CloseWithError(ctx.Err())
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return r, nil
}

// startWithLogs runs the plugin in the background with logs served by src.
func startWithLogs(t *testing.T, e *testbed.Env, src LogSource, args ...string) (out, errOut *syncBuf, wait func() int) {
	t.Helper()
	out, errOut = &syncBuf{}, &syncBuf{}
	env := &Env{Streams: genericiooptions.IOStreams{In: strings.NewReader(""), Out: out, ErrOut: errOut}, Logs: src}
	cmd := NewCommand(env)
	cmd.SetArgs(append([]string{"--kubeconfig", e.Kubeconfig}, args...))
	done := make(chan int, 1)
	go func() { done <- report(cmd.ExecuteContext(t.Context()), errOut) }()
	return out, errOut, func() int {
		t.Helper()
		select {
		case code := <-done:
			t.Logf("$ kubectl hcp %s\n%s%s(exit %d)", strings.Join(args, " "), out.String(), errOut.String(), code)
			return code
		case <-time.After(60 * time.Second):
			t.Fatalf("kubectl hcp %s did not end; output so far:\n%s%s", strings.Join(args, " "), out.String(), errOut.String())
			return -1
		}
	}
}

func harnessPod(t *testing.T, e *testbed.Env, ns, name string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "hcp-sidecar", Image: "example/sidecar"}},
		Containers:     []corev1.Container{{Name: "harness", Image: "example/harness"}},
	}}
	if err := e.Client.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
}

func TestLogsFollowsAHandover(t *testing.T) {
	e := apiServer(t)
	ns := namespace(t, e)
	a, b := "hcp-callee-lab-cvd-a", "hcp-callee-lab-cvd-b"
	harnessPod(t, e, ns, a)
	harnessPod(t, e, ns, b)
	st := runningStatus(10)
	st.PodName = a
	hs := newSession(t, e, ns, "", "lab-cvd", "alpha", st)
	logs := newFakeLogs()
	now := time.Now()
	logs.write(a, "a: before the session", now.Add(-time.Hour))
	logs.write(a, "a: step 1 of "+hs.Name, now)
	logs.write(b, "b: another session, before the handover", now.Add(-10*time.Second))

	out, errOut, wait := startWithLogs(t, e, logs, "logs", "-f", "-n", ns, hs.Name[:8])
	waitFor(t, out, "a: step 1")

	// The drain: A releases the session, checkpoints, its container exits.
	setStatus(t, e, hs, func(s *hcpv1alpha1.HCPSessionStatus) {
		s.State, s.Reason, s.PodName = hcpv1alpha1.SessionPaused, "harness_moved", ""
		s.Conditions = []metav1.Condition{{Type: hcpv1alpha1.ConditionHandover, Status: "True", Reason: "Released", Message: "released by pod " + a, LastTransitionTime: metav1.Now()}}
	})
	logs.write(a, "a: checkpointed, exiting", time.Now())
	time.Sleep(200 * time.Millisecond)
	logs.exit(a)
	waitFor(t, out, "a: checkpointed")

	// B takes it over.
	took := time.Now()
	setStatus(t, e, hs, func(s *hcpv1alpha1.HCPSessionStatus) {
		s.State, s.Reason, s.PodName = hcpv1alpha1.SessionRunning, "accepted", b
		s.Conditions = []metav1.Condition{{Type: hcpv1alpha1.ConditionHandover, Status: "True", Reason: "TakenOver",
			Message: "handed over by its replica; resumed by pod " + b, LastTransitionTime: metav1.NewTime(took)}}
	})
	logs.write(b, "b: resumed "+hs.Name+" from ckpt-001", took.Add(100*time.Millisecond))
	waitFor(t, out, "b: resumed")
	logs.write(b, "b: step 2", time.Now())
	waitFor(t, out, "b: step 2")

	setStatus(t, e, hs, ended(hcpv1alpha1.SessionCompleted, "completed"))
	if code := wait(); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	got := out.String()
	want := "a: step 1 of " + hs.Name + "\na: checkpointed, exiting\nb: resumed " + hs.Name + " from ckpt-001\nb: step 2\n"
	if got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
	for _, w := range []string{"==> session " + hs.Name + " moved from pod " + a + " to pod " + b + " (RUNNING (accepted)); following pod " + b,
		"==> session " + hs.Name + " ended COMPLETED (completed)"} {
		if !strings.Contains(errOut.String(), w) {
			t.Errorf("stderr lacks %q", w)
		}
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	if strings.Join(logs.requests, ",") != a+"/harness follow=true,"+b+"/harness follow=true" {
		t.Errorf("log requests %v", logs.requests)
	}
}

func TestLogsCommand(t *testing.T) {
	e := apiServer(t)
	ns := namespace(t, e)
	a := "hcp-callee-lab-cvd-a"
	harnessPod(t, e, ns, a)
	st := runningStatus(10)
	st.PodName = a
	hs := newSession(t, e, ns, "", "lab-cvd", "alpha", st)
	logs := newFakeLogs()
	logs.write(a, "sidecar or harness line", time.Now())

	out, _, wait := startWithLogs(t, e, logs, "logs", "-n", ns, hs.Name, "-c", "hcp-sidecar", "--prefix")
	if code := wait(); code != 0 || out.String() != "[pod/"+a+"/hcp-sidecar] sidecar or harness line\n" {
		t.Errorf("logs -c hcp-sidecar --prefix: exit %d, %q", code, out.String())
	}
	// No pod owns it: refused without -f.
	setStatus(t, e, hs, func(s *hcpv1alpha1.HCPSessionStatus) {
		s.State, s.Reason, s.PodName = hcpv1alpha1.SessionPaused, "harness_moved", ""
	})
	_, errOut, wait := startWithLogs(t, e, logs, "logs", "-n", ns, hs.Name)
	if code := wait(); code != 1 || !strings.Contains(errOut.String(), "is PAUSED (harness_moved) and no pod owns it now (kubectl hcp logs -f waits for one)") {
		t.Errorf("no owner: exit %d, %q", code, errOut.String())
	}
	// Its pod is gone.
	setStatus(t, e, hs, func(s *hcpv1alpha1.HCPSessionStatus) { s.PodName = "hcp-callee-lab-cvd-gone" })
	_, errOut, wait = startWithLogs(t, e, logs, "logs", "-n", ns, hs.Name)
	if code := wait(); code != 1 || !strings.Contains(errOut.String(), "pod hcp-callee-lab-cvd-gone is gone, and its log with it") {
		t.Errorf("pod gone: exit %d, %q", code, errOut.String())
	}
}
