package kubectlhcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// The commands against a real API server (envtest with the project's and
// the topology operator's CRDs), run as a user runs them: through Main
// with --kubeconfig. Sessions are created with their status, as the callee
// sidecar writes it; watch is driven by status updates.

var (
	envOnce sync.Once
	env     *testbed.Env
	envErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if env != nil {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop envtest:", err)
		}
	}
	os.Exit(code)
}

// apiServer starts envtest on first use (the rendering tests need none).
func apiServer(t *testing.T) *testbed.Env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs an API server (envtest); not with -short")
	}
	envOnce.Do(func() {
		env, envErr = testbed.Start(context.Background(), testbed.Options{AddToScheme: []func(*runtime.Scheme) error{hcpv1alpha1.AddToScheme}})
	})
	if envErr != nil {
		t.Fatal(envErr)
	}
	return env
}

// namespace creates a fresh namespace.
func namespace(t *testing.T, e *testbed.Env) string {
	t.Helper()
	ns := testbed.RandomName("kubectl-hcp-")
	if err := e.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// syncBuf is a buffer written by a command while the test reads it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type result struct {
	out, err string
	code     int
}

// kubectlHCP runs the plugin as `kubectl hcp --kubeconfig K ARGS...`.
func kubectlHCP(t *testing.T, e *testbed.Env, stdin string, args ...string) result {
	t.Helper()
	var out, errOut syncBuf
	code := Main(t.Context(), append([]string{"--kubeconfig", e.Kubeconfig}, args...),
		genericiooptions.IOStreams{In: strings.NewReader(stdin), Out: &out, ErrOut: &errOut})
	r := result{out: out.String(), err: errOut.String(), code: code}
	t.Logf("$ kubectl hcp %s\n%s%s(exit %d)", strings.Join(args, " "), r.out, r.err, r.code)
	return r
}

// startHCP runs the plugin in the background; wait returns its result.
func startHCP(t *testing.T, e *testbed.Env, args ...string) (out *syncBuf, wait func() result) {
	t.Helper()
	out = &syncBuf{}
	errOut := &syncBuf{}
	done := make(chan int, 1)
	go func() {
		done <- Main(t.Context(), append([]string{"--kubeconfig", e.Kubeconfig}, args...), genericiooptions.IOStreams{In: strings.NewReader(""), Out: out, ErrOut: errOut})
	}()
	return out, func() result {
		t.Helper()
		select {
		case code := <-done:
			r := result{out: out.String(), err: errOut.String(), code: code}
			t.Logf("$ kubectl hcp %s\n%s%s(exit %d)", strings.Join(args, " "), r.out, r.err, r.code)
			return r
		case <-time.After(60 * time.Second):
			t.Fatalf("kubectl hcp %s did not end; output so far:\n%s%s", strings.Join(args, " "), out.String(), errOut.String())
			return result{}
		}
	}
}

// waitFor polls until out contains s.
func waitFor(t *testing.T, out *syncBuf, s string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the output within 30s:\n%s", s, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// newSession creates an HCPSession with the labels the callee sidecar sets
// and then its status. name "" takes a random UUID.
func newSession(t *testing.T, e *testbed.Env, ns, name, callee, caller string, st hcpv1alpha1.HCPSessionStatus) *hcpv1alpha1.HCPSession {
	t.Helper()
	if name == "" {
		name = uuid.NewString()
	}
	hs := &hcpv1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{hcpv1alpha1.LabelCalleeID: callee, hcpv1alpha1.LabelCallerID: caller,
				hcpv1alpha1.LabelSessionState: string(hcpv1alpha1.SessionPending)},
			Annotations: map[string]string{annotationDecidingPod: "hcp-callee-" + callee + "-0"}},
		Spec: hcpv1alpha1.HCPSessionSpec{SessionID: name, CalleeID: callee, CallerID: caller, Capability: "cvd.run-synthesis",
			TaskMessageID: uuid.NewString(), RiskLevel: "R2", DataClassification: "T1", MaxDuration: "PT10M", Intent: "a test task"},
	}
	if err := e.Client.Create(t.Context(), hs); err != nil {
		t.Fatal(err)
	}
	if st.State != "" {
		setStatus(t, e, hs, func(s *hcpv1alpha1.HCPSessionStatus) { *s = st })
	}
	return hs
}

// setStatus changes a session's status as the sidecar's status writer does.
func setStatus(t *testing.T, e *testbed.Env, hs *hcpv1alpha1.HCPSession, mutate func(*hcpv1alpha1.HCPSessionStatus)) {
	t.Helper()
	if err := e.Client.Get(t.Context(), client.ObjectKeyFromObject(hs), hs); err != nil {
		t.Fatal(err)
	}
	mutate(&hs.Status)
	if err := e.Client.Status().Update(t.Context(), hs); err != nil {
		t.Fatal(err)
	}
}

func runningStatus(percent int32) hcpv1alpha1.HCPSessionStatus {
	now := metav1.Now()
	return hcpv1alpha1.HCPSessionStatus{State: hcpv1alpha1.SessionRunning, Reason: "accepted",
		Message:   "admitted by CapabilityPolicy materials-lab rule 0",
		StartedAt: &now, LastEventAt: &now, LastSequence: 3, EventCount: 3, PodName: "hcp-callee-lab-cvd-0",
		Progress: &hcpv1alpha1.SessionProgress{Stage: "heating", Percent: &percent, Message: "warming up"}}
}

func ended(state hcpv1alpha1.SessionState, reason string) func(*hcpv1alpha1.HCPSessionStatus) {
	return func(s *hcpv1alpha1.HCPSessionStatus) {
		now := metav1.Now()
		s.State, s.Reason, s.Message, s.CompletedAt = state, reason, "", &now
		switch state {
		case hcpv1alpha1.SessionCompleted:
			s.Progress = &hcpv1alpha1.SessionProgress{Stage: "done", Percent: new(int32(100))}
			s.Result = &hcpv1alpha1.SessionResult{Summary: "grown"}
		case hcpv1alpha1.SessionFailed:
			s.Error = &hcpv1alpha1.SessionError{Code: reason, Message: "the harness failed"}
		}
	}
}

func TestSessionsCommand(t *testing.T) {
	e := apiServer(t)
	ns, other := namespace(t, e), namespace(t, e)
	run := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(40))
	done := newSession(t, e, ns, "", "lab-cvd", "beta", runningStatus(10))
	setStatus(t, e, done, ended(hcpv1alpha1.SessionCompleted, "completed"))
	newSession(t, e, ns, "", "spectro", "alpha", hcpv1alpha1.HCPSessionStatus{State: hcpv1alpha1.SessionRejected, Reason: "not_authorized"})
	elsewhere := newSession(t, e, other, "", "lab-cvd", "alpha", runningStatus(70))

	r := kubectlHCP(t, e, "", "sessions", "-n", ns)
	if r.code != 0 || strings.Count(r.out, "\n") != 4 {
		t.Fatalf("want a header and 3 rows")
	}
	row := rowOf(t, r.out, run.Name)
	if row[1] != "lab-cvd" || row[2] != "alpha" || row[4] != "RUNNING" || row[5] != "40%" || row[8] != "#3 just now" && !strings.HasSuffix(row[8], "s ago") {
		t.Errorf("running row %q", row)
	}
	if row := rowOf(t, r.out, done.Name); row[4] != "COMPLETED" || row[5] != "100%" {
		t.Errorf("completed row %q", row)
	}

	r = kubectlHCP(t, e, "", "sessions", "-n", ns, "--state", "running,completed", "--callee", "lab-cvd")
	if strings.Count(r.out, "\n") != 3 || strings.Contains(r.out, "spectro") {
		t.Errorf("--state running,completed --callee lab-cvd: want 2 rows")
	}
	r = kubectlHCP(t, e, "", "sessions", "-n", ns, "--caller", "beta")
	if strings.Count(r.out, "\n") != 2 || !strings.Contains(r.out, done.Name) {
		t.Errorf("--caller beta: want the one session of beta")
	}
	r = kubectlHCP(t, e, "", "sessions", "-n", ns, "--callee", "nobody")
	if r.code != 0 || r.out != "" || !strings.Contains(r.err, "No sessions found in namespace "+ns+" matching callee nobody") {
		t.Errorf("no match: want the message on stderr")
	}
	r = kubectlHCP(t, e, "", "sessions", "-A")
	if row := rowOf(t, r.out, other); row[1] != elsewhere.Name || row[6] != "70%" {
		t.Errorf("-A row %q", row)
	}
	r = kubectlHCP(t, e, "", "sessions", "--state", "DONE")
	if r.code != 1 || !strings.Contains(r.err, `--state "DONE": not a session state`) {
		t.Errorf("bad --state: want exit 1 and the valid states")
	}
}

func TestDescribeCommand(t *testing.T) {
	e := apiServer(t)
	ns := namespace(t, e)
	name := "5e1f0000-2d7a-4c55-9a0e-3f1d2c7b9e10"
	hs := newSession(t, e, ns, name, "lab-cvd", "alpha", runningStatus(60))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hcp-callee-lab-cvd-0", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "harness", Image: "example/harness"}}}}
	if err := e.Client.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.250.0.9", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := e.Client.Status().Update(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: name + ".1", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: "HCPSession", APIVersion: hcpv1alpha1.GroupVersion.String(), Name: name, Namespace: ns, UID: hs.UID},
		Type:           "Normal", Reason: "CheckpointCreated", Message: "checkpoint ckpt-1 stored",
		FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1, Source: corev1.EventSource{Component: "hcp-sidecar"}}
	if err := e.Client.Create(t.Context(), ev); err != nil {
		t.Fatal(err)
	}

	// A unique prefix of the name is enough.
	r := kubectlHCP(t, e, "", "describe", "-n", ns, "5e1f")
	flat := spaces.ReplaceAllString(r.out, " ")
	for _, want := range []string{
		"Name: " + name, "State: RUNNING (accepted)", "Progress: 60% heating: warming up",
		"Verdict: admitted", "Rule: admitted by CapabilityPolicy materials-lab rule 0", "Risk: R2 (assessed)", "Decided by: pod hcp-callee-lab-cvd-0",
		"Name: hcp-callee-lab-cvd-0", "Status: Running, ready", "Node: node-1",
		"created PENDING: task_submit received, the L3 gate ran in pod hcp-callee-lab-cvd-0",
		"Normal CheckpointCreated: checkpoint ckpt-1 stored [hcp-sidecar]",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("describe lacks %q", want)
		}
	}
	if r.code != 0 {
		t.Errorf("exit %d", r.code)
	}

	// Two sessions share the prefix "5e1f": ambiguous.
	newSession(t, e, ns, "5e1f1111-2d7a-4c55-9a0e-3f1d2c7b9e10", "lab-cvd", "alpha", runningStatus(1))
	r = kubectlHCP(t, e, "", "describe", "-n", ns, "5e1f")
	if r.code != 1 || !strings.Contains(r.err, `"5e1f" is the prefix of 2 HCPSessions`) {
		t.Errorf("ambiguous prefix: want exit 1 naming both")
	}
	r = kubectlHCP(t, e, "", "describe", "-n", ns, "ffff")
	if r.code != 1 || !strings.Contains(r.err, `HCPSession "ffff" not found in namespace `+ns) {
		t.Errorf("unknown session: want exit 1")
	}
	r = kubectlHCP(t, e, "", "describe", "-n", ns)
	if r.code != 1 || !strings.Contains(r.err, "takes SESSION") {
		t.Errorf("no argument: want a usage error")
	}
}

func TestAbortCommand(t *testing.T) {
	e := apiServer(t)
	ns := namespace(t, e)
	hs := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(20))
	r := kubectlHCP(t, e, "", "abort", "-n", ns, hs.Name, "--reason", "wrong substrate")
	if r.code != 0 || !strings.Contains(r.out, "abort requested (spec.abortRequested=true; it was RUNNING)") ||
		!strings.Contains(r.out, "reason recorded in the annotation hcp.io/abort-reason") {
		t.Errorf("abort: exit %d", r.code)
	}
	got := &hcpv1alpha1.HCPSession{}
	if err := e.Client.Get(t.Context(), client.ObjectKeyFromObject(hs), got); err != nil {
		t.Fatal(err)
	}
	if !got.Spec.AbortRequested || got.Annotations[AnnotationAbortReason] != "wrong substrate" {
		t.Errorf("after abort: abortRequested %v, annotations %v", got.Spec.AbortRequested, got.Annotations)
	}
	r = kubectlHCP(t, e, "", "abort", "-n", ns, hs.Name)
	if r.code != 0 || !strings.Contains(r.out, "abort already requested") {
		t.Errorf("second abort: want it said")
	}
	r = kubectlHCP(t, e, "", "describe", "-n", ns, hs.Name)
	if !strings.Contains(spaces.ReplaceAllString(r.out, " "), "Abort requested: yes, reason: wrong substrate (annotation hcp.io/abort-reason)") {
		t.Error("describe does not show the abort reason")
	}

	// --wait follows it to ABORTED: exit 3.
	out, wait := startHCP(t, e, "abort", "-n", ns, hs.Name, "--wait")
	waitFor(t, out, "session "+hs.Name+": cvd.run-synthesis")
	setStatus(t, e, hs, func(s *hcpv1alpha1.HCPSessionStatus) { s.State = hcpv1alpha1.SessionAborting })
	waitFor(t, out, "RUNNING → ABORTING")
	setStatus(t, e, hs, ended(hcpv1alpha1.SessionAborted, "abort requested (spec.abortRequested)"))
	if r := wait(); r.code != ExitAborted || !strings.Contains(r.out, "ABORTING → ABORTED (abort requested (spec.abortRequested))") {
		t.Errorf("abort --wait: exit %d, want %d and the transition", r.code, ExitAborted)
	}

	r = kubectlHCP(t, e, "", "abort", "-n", ns, hs.Name)
	if r.code != 1 || !strings.Contains(r.err, "already ended ABORTED: nothing to abort") {
		t.Errorf("abort of an ended session: want exit 1")
	}
}

func TestWatchCommand(t *testing.T) {
	e := apiServer(t)
	ns := namespace(t, e)

	t.Run("Completed", func(t *testing.T) {
		hs := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(10))
		out, wait := startHCP(t, e, "watch", "-n", ns, hs.Name)
		waitFor(t, out, "RUNNING 10%")
		setStatus(t, e, hs, func(s *hcpv1alpha1.HCPSessionStatus) {
			s.Progress = &hcpv1alpha1.SessionProgress{Stage: "growth", Percent: new(int32(55)), Message: "step 5"}
			s.LastSequence, s.EventCount = 9, 9
		})
		waitFor(t, out, " 55% growth: step 5")
		setStatus(t, e, hs, ended(hcpv1alpha1.SessionCompleted, "completed"))
		r := wait()
		if r.code != 0 {
			t.Errorf("exit %d, want 0 for COMPLETED", r.code)
		}
		for _, want := range []string{"RUNNING → COMPLETED (completed)", "100% done", "session " + hs.Name + " COMPLETED after", ": grown"} {
			if !strings.Contains(r.out, want) {
				t.Errorf("output lacks %q", want)
			}
		}
		// stdout is not a terminal: plain lines, no escape sequences.
		if strings.Contains(r.out, "\x1b[") {
			t.Error("escape sequences in plain output")
		}
	})
	t.Run("Failed", func(t *testing.T) {
		hs := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(10))
		out, wait := startHCP(t, e, "watch", "-n", ns, hs.Name)
		waitFor(t, out, "RUNNING 10%")
		setStatus(t, e, hs, ended(hcpv1alpha1.SessionFailed, "harness_refused"))
		if r := wait(); r.code != ExitFailed || !strings.Contains(r.out, "FAILED after") || !strings.Contains(r.out, "harness_refused: the harness failed") {
			t.Errorf("exit %d, want %d and the error", r.code, ExitFailed)
		}
	})
	t.Run("Deleted", func(t *testing.T) {
		hs := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(10))
		out, wait := startHCP(t, e, "watch", "-n", ns, hs.Name)
		waitFor(t, out, "RUNNING 10%")
		if err := e.Client.Delete(t.Context(), hs); err != nil {
			t.Fatal(err)
		}
		if r := wait(); r.code != ExitGone || !strings.Contains(r.out, "deleted before it ended (last seen RUNNING)") {
			t.Errorf("exit %d, want %d", r.code, ExitGone)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		hs := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(10))
		r := kubectlHCP(t, e, "", "watch", "-n", ns, hs.Name, "--timeout", "1s")
		if r.code != ExitTimeout || !strings.Contains(r.out, "timed out; still running") {
			t.Errorf("exit %d, want %d", r.code, ExitTimeout)
		}
	})
	t.Run("AlreadyEnded", func(t *testing.T) {
		hs := newSession(t, e, ns, "", "lab-cvd", "alpha", hcpv1alpha1.HCPSessionStatus{State: hcpv1alpha1.SessionRejected, Reason: "not_authorized",
			Error: &hcpv1alpha1.SessionError{Code: "not_authorized", Message: "no rule admits caller alpha"}})
		r := kubectlHCP(t, e, "", "watch", "-n", ns, hs.Name)
		if r.code != ExitRejected || !strings.Contains(r.out, "REJECTED: not_authorized: no rule admits caller alpha") {
			t.Errorf("exit %d, want %d", r.code, ExitRejected)
		}
	})
	t.Run("All", func(t *testing.T) {
		ns := namespace(t, e)
		a := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(10))
		b := newSession(t, e, ns, "", "lab-cvd", "beta", runningStatus(20))
		old := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(10))
		setStatus(t, e, old, ended(hcpv1alpha1.SessionCompleted, "completed"))
		out, wait := startHCP(t, e, "watch", "-n", ns, "--all")
		waitFor(t, out, b.Name)
		// A session that had ended before is not shown when its status
		// changes (the caller sidecar acknowledges after the end).
		setStatus(t, e, old, func(s *hcpv1alpha1.HCPSessionStatus) { s.CallerAckedSequence = 3 })
		// A session that starts while watching is followed too.
		c := newSession(t, e, ns, "", "lab-cvd", "gamma", runningStatus(5))
		waitFor(t, out, c.Name)
		setStatus(t, e, a, ended(hcpv1alpha1.SessionCompleted, "completed"))
		setStatus(t, e, c, ended(hcpv1alpha1.SessionCompleted, "completed"))
		waitFor(t, out, "session "+c.Name+" COMPLETED")
		setStatus(t, e, b, ended(hcpv1alpha1.SessionFailed, "timeout"))
		r := wait()
		if r.code != ExitFailed {
			t.Errorf("exit %d, want %d (one of them FAILED)", r.code, ExitFailed)
		}
		if strings.Contains(r.out, old.Name) {
			t.Error("--all showed a session that had ended before it started")
		}
		r = kubectlHCP(t, e, "", "watch", "-n", ns, "--all")
		if r.code != 0 || !strings.Contains(r.out, "No running sessions; nothing to watch.") {
			t.Errorf("--all with nothing running: want exit 0 and a note")
		}
	})
	t.Run("BadInput", func(t *testing.T) {
		for _, args := range [][]string{{"watch"}, {"watch", "a", "--all"}, {"watch", "a", "-A"}} {
			if r := kubectlHCP(t, e, "", args...); r.code != 1 || r.err == "" {
				t.Errorf("%v: exit %d, want 1 with a message", args, r.code)
			}
		}
	})
}

// fakeCallerSidecar answers POST /hcp/v1/tasks and GET /hcp/v1/tasks/{id}
// as the Caller sidecar does: pending first, then answer.
func fakeCallerSidecar(t *testing.T, sessionID string, answer TaskView) (*httptest.Server, *[]SubmitRequest) {
	var mu sync.Mutex
	var got []SubmitRequest
	polls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/hcp/v1/tasks":
			var req SubmitRequest
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Capability == "forbidden-typo" {
				w.WriteHeader(400)
				_, _ = w.Write([]byte(`{"error":{"code":"invalid_request","message":"invalid task","fields":[{"field":"capability","message":"unknown"}]}}`))
				return
			}
			got = append(got, req)
			w.WriteHeader(202)
			_ = json.NewEncoder(w).Encode(TaskView{MessageID: "7f1c0000-0000-4000-8000-000000000001", CalleeID: req.CalleeID, Status: "pending", SessionID: sessionID})
		case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/hcp/v1/tasks/"):
			polls++
			a := answer
			if polls < 3 {
				a = TaskView{MessageID: answer.MessageID, Status: "pending", SessionID: sessionID}
			}
			_ = json.NewEncoder(w).Encode(a)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &got
}

func TestSubmitCommand(t *testing.T) {
	e := apiServer(t)
	ns := namespace(t, e)
	hs := newSession(t, e, ns, "", "lab-cvd", "alpha", runningStatus(0))
	srv, got := fakeCallerSidecar(t, hs.Name, TaskView{MessageID: "7f1c0000-0000-4000-8000-000000000001", Status: "accepted", SessionID: hs.Name, RiskLevel: "R2"})

	out, wait := startHCP(t, e, "submit", "-n", ns, "--caller", "alpha", "--callee", "lab-cvd", "--capability", "cvd.run-synthesis",
		"--inputs", `{"steps":3}`, "--data-class", "T1", "--sidecar-url", srv.URL, "--watch")
	waitFor(t, out, "accepted: session "+hs.Name+", risk R2")
	waitFor(t, out, "RUNNING 0%")
	setStatus(t, e, hs, ended(hcpv1alpha1.SessionCompleted, "completed"))
	r := wait()
	if r.code != 0 || !strings.Contains(r.out, "task 7f1c0000-0000-4000-8000-000000000001 submitted to lab-cvd (cvd.run-synthesis); session "+hs.Name) ||
		!strings.Contains(r.out, "COMPLETED after") {
		t.Errorf("submit --watch: exit %d", r.code)
	}
	if len(*got) != 1 || (*got)[0].CalleeID != "lab-cvd" || (*got)[0].Constraints.DataClassification != "T1" || string((*got)[0].Inputs) != `{"steps":3}` {
		t.Errorf("the sidecar got %+v", *got)
	}

	srv, _ = fakeCallerSidecar(t, "", TaskView{MessageID: "7f1c0000-0000-4000-8000-000000000001", Status: "rejected", ReasonCode: "not_authorized", Message: "no rule of any CapabilityPolicy admits caller alpha"})
	r = kubectlHCP(t, e, `{"steps": 2}`, "submit", "-n", ns, "--caller", "alpha", "--callee", "lab-cvd", "--capability", "maint.bakeout", "--inputs", "@-", "--sidecar-url", srv.URL)
	if r.code != ExitRejected || !strings.Contains(r.out, "rejected: not_authorized: no rule of any CapabilityPolicy admits caller alpha") {
		t.Errorf("rejected: exit %d, want %d", r.code, ExitRejected)
	}
	r = kubectlHCP(t, e, "", "submit", "-n", ns, "--caller", "alpha", "--callee", "lab-cvd", "--capability", "forbidden-typo", "--sidecar-url", srv.URL)
	if r.code != 1 || !strings.Contains(r.err, "the Caller sidecar answered 400 invalid_request: invalid task; capability: unknown") {
		t.Errorf("a refused submit: exit %d", r.code)
	}

	// Without --sidecar-url: a port-forward to the Caller's pod.
	r = kubectlHCP(t, e, "", "submit", "-n", ns, "--caller", "nobody", "--callee", "lab-cvd", "--capability", "x")
	if r.code != 1 || !strings.Contains(r.err, `no Caller "nobody" in namespace `+ns) {
		t.Errorf("unknown Caller: exit %d", r.code)
	}
	external := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: ns}}
	if err := e.Client.Create(t.Context(), external); err != nil {
		t.Fatal(err)
	}
	r = kubectlHCP(t, e, "", "submit", "-n", ns, "--caller", "ext", "--callee", "lab-cvd", "--capability", "x")
	if r.code != 1 || !strings.Contains(r.err, "the Caller ext is external (no spec.harness)") {
		t.Errorf("external Caller: exit %d", r.code)
	}
	withHarness := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Name: "alpha", Namespace: ns}, Spec: hcpv1alpha1.CallerSpec{
		Harness: &hcpv1alpha1.HarnessSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example/app"}}}}}}}
	if err := e.Client.Create(t.Context(), withHarness); err != nil {
		t.Fatal(err)
	}
	r = kubectlHCP(t, e, "", "submit", "-n", ns, "--caller", "alpha", "--callee", "lab-cvd", "--capability", "x")
	if r.code != 1 || !strings.Contains(r.err, "the Caller alpha: no Ready pod among the 0 pods labelled") {
		t.Errorf("no pod: exit %d", r.code)
	}
}

func TestDoctorCommand(t *testing.T) {
	e := apiServer(t)
	ns := namespace(t, e)
	r := kubectlHCP(t, e, "", "doctor", "-n", ns)
	if r.code != 1 {
		t.Errorf("exit %d, want 1: no operator runs", r.code)
	}
	for _, want := range []string{
		"✓ hcp.io CRDs: callees, callers, capabilitypolicies, hcpsessions established",
		"✓ rabbitmq.com CRDs: vhosts, exchanges, queues, bindings, users, permissions, policies established",
		"✗ hcp-operator: no Deployment labelled app.kubernetes.io/name=hcp-operator",
		"    fix: helm install hcp-operator charts/hcp-operator",
		"✗ topology operator: no Deployment labelled app.kubernetes.io/name=messaging-topology-operator",
		"! harnesses: no Callees or Callers in namespace " + ns,
		"✗ admission policies: no *sidecar-sessions ValidatingAdmissionPolicy",
		"✓ admission webhooks: none for hcp.io or rabbitmq.com",
	} {
		if !strings.Contains(r.out, want) {
			t.Errorf("doctor lacks %q", want)
		}
	}

	// The operator appears (its Deployment available): that check passes.
	sys := namespace(t, e)
	labels := map[string]string{"app.kubernetes.io/name": "hcp-operator", "app.kubernetes.io/component": "manager"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "hcp-operator-controller-manager", Namespace: sys, Labels: labels},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "ghcr.io/hcp-io/hcp-operator:test"}}}}}}
	if err := e.Client.Create(t.Context(), dep); err != nil {
		t.Fatal(err)
	}
	dep.Status = appsv1.DeploymentStatus{Replicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
	if err := e.Client.Status().Update(t.Context(), dep); err != nil {
		t.Fatal(err)
	}
	r = kubectlHCP(t, e, "", "doctor", "-n", ns)
	if !strings.Contains(r.out, "✓ hcp-operator: "+sys+"/hcp-operator-controller-manager 1/1 available") {
		t.Error("the available operator Deployment was not recognised")
	}
	// Its callee sidecars' ClusterRole (the default name: no
	// --callee-sidecar-cluster-role): missing, incomplete, then as the
	// install ships it.
	for _, want := range []string{
		"✗ callee sidecar role: ClusterRole hcp-operator-callee-sidecar not found: callee sidecars have no rights",
		"    fix: install it with the operator: helm upgrade, or kubectl apply -k config/default",
	} {
		if !strings.Contains(r.out, want) {
			t.Errorf("doctor lacks %q:\n%s", want, r.out)
		}
	}
	role := resource.CalleeSidecarClusterRole(resource.DefaultCalleeSidecarClusterRole)
	role.Rules = role.Rules[1:]
	if err := e.Client.Create(t.Context(), role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), role) })
	r = kubectlHCP(t, e, "", "doctor", "-n", ns)
	if want := "✗ callee sidecar role: ClusterRole hcp-operator-callee-sidecar lacks rules the callee sidecars need: hcpsessions: get,list,watch,create,update,patch,delete"; !strings.Contains(r.out, want) {
		t.Errorf("doctor lacks %q:\n%s", want, r.out)
	}
	role.Rules = resource.CalleeSidecarClusterRole("").Rules
	if err := e.Client.Update(t.Context(), role); err != nil {
		t.Fatal(err)
	}
	r = kubectlHCP(t, e, "", "doctor", "-n", ns)
	if want := "✓ callee sidecar role: ClusterRole hcp-operator-callee-sidecar grants what callee sidecars need"; !strings.Contains(r.out, want) {
		t.Errorf("doctor lacks %q:\n%s", want, r.out)
	}
}

// TestTopologyCommand: a Callee with the objects the operator creates for
// it, their Ready conditions as the topology operator writes them, and a
// management API (a stand-in answering /api/overview and /api/queues) for
// the queue's depth.
func TestTopologyCommand(t *testing.T) {
	e := apiServer(t)
	ns := namespace(t, e)
	ctx := t.Context()
	mgmt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "admin" || p != "s3cret" {
			w.WriteHeader(401)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.EscapedPath() {
		case "/api/overview":
			_, _ = w.Write([]byte(`{"rabbitmq_version":"3.10.8","node":"rabbit@test"}`))
		case "/api/queues/%2Fhcp/hcp.cmd.lab-cvd":
			_, _ = w.Write([]byte(`{"name":"hcp.cmd.lab-cvd","messages":3,"messages_ready":2,"messages_unacknowledged":1,"consumers":1}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(mgmt.Close)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hcp-broker", Namespace: ns, Labels: map[string]string{"rabbitmq.com/topology-operator": "true"}},
		StringData: map[string]string{"uri": mgmt.URL, "username": "admin", "password": "s3cret"}}
	callee := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Name: "lab-cvd", Namespace: ns}, Spec: hcpv1alpha1.CalleeSpec{
		Capabilities: []hcpv1alpha1.Capability{{Name: "cvd.run-synthesis", RiskLevel: "R2", DataClassification: "T2"}},
		Harness:      hcpv1alpha1.HarnessSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "h", Image: "example/h"}}}}}}}
	for _, o := range []client.Object{secret, callee} {
		if err := e.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	callee.Status = hcpv1alpha1.CalleeStatus{CalleeID: "lab-cvd", Vhost: "/hcp", CommandQueue: "hcp.cmd.lab-cvd", Username: "callee.lab-cvd@/hcp",
		CredentialsSecret: "hcp-callee-lab-cvd-credentials",
		Conditions:        []metav1.Condition{{Type: hcpv1alpha1.ConditionTopologyReady, Status: "True", Reason: "Reconciled", LastTransitionTime: metav1.Now()}}}
	if err := e.Client.Status().Update(ctx, callee); err != nil {
		t.Fatal(err)
	}
	ref := topologyv1beta1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: "hcp-broker"}}
	own := map[string]string{hcpv1alpha1.LabelCallee: "lab-cvd", hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue}
	// The shared objects live in the operator's namespace, labelled with
	// the (broker, vhost) pair's key.
	home := namespace(t, e)
	brk, err := resource.BrokerFromConnectionSecret(ref, hcpv1alpha1.BrokerSpec{Vhost: "/hcp"}, secret)
	if err != nil {
		t.Fatal(err)
	}
	key := brk.Key()
	shared := map[string]string{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue, hcpv1alpha1.LabelVhostKey: key}
	otherKey := map[string]string{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue, hcpv1alpha1.LabelVhostKey: "9999999999"}
	homeRef := topologyv1beta1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: "hcp-broker-" + key}}
	meta := func(name string, labels map[string]string) metav1.ObjectMeta {
		m := metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}
		if labels[hcpv1alpha1.LabelVhostKey] != "" {
			m.Namespace = home
		}
		return m
	}
	ready := []topologyv1beta1.Condition{{Type: "Ready", Status: "True", Reason: "SuccessfulCreateOrUpdate", LastTransitionTime: metav1.Now()}}
	failed := []topologyv1beta1.Condition{{Type: "Ready", Status: "False", Reason: "FailedCreateOrUpdate", Message: "Error 401 (Unauthorized)", LastTransitionTime: metav1.Now()}}
	type withStatus struct {
		obj    client.Object
		status func()
	}
	objs := make([]withStatus, 0, 6)
	q := &topologyv1beta1.Queue{ObjectMeta: meta("hcp-callee-lab-cvd", own), Spec: topologyv1beta1.QueueSpec{Name: "hcp.cmd.lab-cvd", Vhost: "/hcp", Type: "quorum", RabbitmqClusterReference: ref}}
	objs = append(objs, withStatus{q, func() { q.Status.Conditions, q.Status.ObservedGeneration = ready, 1 }})
	b := &topologyv1beta1.Binding{ObjectMeta: meta("hcp-callee-lab-cvd", own), Spec: topologyv1beta1.BindingSpec{Vhost: "/hcp", Source: "hcp.commands", Destination: "hcp.cmd.lab-cvd", DestinationType: "queue", RoutingKey: "lab-cvd", RabbitmqClusterReference: ref}}
	objs = append(objs, withStatus{b, func() { b.Status.Conditions = ready }})
	u := &topologyv1beta1.User{ObjectMeta: meta("hcp-callee-lab-cvd", own), Spec: topologyv1beta1.UserSpec{RabbitmqClusterReference: ref}}
	objs = append(objs, withStatus{u, func() { u.Status.Conditions, u.Status.Username = ready, "callee.lab-cvd@/hcp" }})
	p := &topologyv1beta1.Permission{ObjectMeta: meta("hcp-callee-lab-cvd", own), Spec: topologyv1beta1.PermissionSpec{User: "callee.lab-cvd@/hcp", Vhost: "/hcp",
		Permissions: topologyv1beta1.VhostPermissions{Configure: "^$", Write: `^hcp\.events$`, Read: `^hcp\.cmd\.lab-cvd$`}, RabbitmqClusterReference: ref}}
	objs = append(objs, withStatus{p, func() { p.Status.Conditions = failed }})
	x := &topologyv1beta1.Exchange{ObjectMeta: meta("hcp-commands-"+key, shared), Spec: topologyv1beta1.ExchangeSpec{Name: "hcp.commands", Vhost: "/hcp", Type: "direct", Durable: true, RabbitmqClusterReference: homeRef}}
	objs = append(objs, withStatus{x, func() { x.Status.Conditions = ready }})
	// Another pair's exchange is not this Callee's.
	y := &topologyv1beta1.Exchange{ObjectMeta: meta("hcp-commands-9999999999", otherKey), Spec: topologyv1beta1.ExchangeSpec{Name: "hcp.commands", Vhost: "/other", Type: "direct", RabbitmqClusterReference: homeRef}}
	objs = append(objs, withStatus{y, func() {}})
	pol := &topologyv1beta1.Policy{ObjectMeta: meta("hcp-callee-lab-cvd", own), Spec: topologyv1beta1.PolicySpec{Name: "hcp-limits.hcp.cmd.lab-cvd", Vhost: "/hcp",
		Pattern: `^hcp\.cmd\.lab-cvd$`, ApplyTo: "queues", Priority: 100, Definition: &runtime.RawExtension{Raw: []byte(`{"max-length":1000,"delivery-limit":5}`)}, RabbitmqClusterReference: ref}}
	objs = append(objs, withStatus{pol, func() { pol.Status.Conditions = ready }})
	for _, o := range objs {
		if err := e.Client.Create(ctx, o.obj); err != nil {
			t.Fatalf("create %T: %v", o.obj, err)
		}
		o.status()
		if err := e.Client.Status().Update(ctx, o.obj); err != nil {
			t.Fatalf("status of %T: %v", o.obj, err)
		}
	}

	r := kubectlHCP(t, e, "", "topology", "-n", ns, "lab-cvd")
	if r.code != 0 {
		t.Errorf("exit %d", r.code)
	}
	for _, want := range []string{
		"Callee " + ns + "/lab-cvd (id lab-cvd): TopologyReady=True (Reconciled)",
		"vhost /hcp, broker connection Secret " + ns + "/hcp-broker",
		"management API: " + mgmt.URL + " answers",
	} {
		if !strings.Contains(r.out, want) {
			t.Errorf("topology lacks %q", want)
		}
	}
	if row := rowOf(t, r.out, "  queue"); row[1] != "hcp.cmd.lab-cvd" || row[3] != "True" || row[4] != "quorum, 3 messages (2 ready, 1 unacked), 1 consumers" {
		t.Errorf("queue row %q", row)
	}
	if row := rowOf(t, r.out, "  exchange"); row[1] != "hcp.commands" || row[2] != "Exchange/"+home+"/hcp-commands-"+key {
		t.Errorf("exchange row %q", row)
	}
	if strings.Contains(r.out, "9999999999") {
		t.Error("another pair's exchange is shown")
	}
	if row := rowOf(t, r.out, "  policy"); row[1] != "hcp-limits.hcp.cmd.lab-cvd" || row[3] != "True" || row[4] != `pattern ^hcp\.cmd\.lab-cvd$ on queues: delivery-limit=5, max-length=1000` {
		t.Errorf("policy row %q", row)
	}
	if row := rowOf(t, r.out, "  permission"); row[3] != "False (FailedCreateOrUpdate: Error 401 (Unauthorized))" {
		t.Errorf("permission row %q", row)
	}
	if row := rowOf(t, r.out, "  binding"); row[1] != "hcp.commands → hcp.cmd.lab-cvd" || row[4] != "routing key lab-cvd" {
		t.Errorf("binding row %q", row)
	}

	// Wrong credentials in --management-url: depth unknown, said why.
	bad := strings.Replace(mgmt.URL, "http://", "http://admin:wrong@", 1)
	r = kubectlHCP(t, e, "", "topology", "-n", ns, "--management-url", bad)
	if !strings.Contains(r.out, "management API: unreachable:") || !strings.Contains(r.out, "queue depth unknown") {
		t.Error("a refused management API is not reported")
	}
	r = kubectlHCP(t, e, "", "topology", "-n", ns, "nope")
	if r.code != 1 || !strings.Contains(r.err, `no Callee "nope" in namespace `+ns) {
		t.Errorf("unknown Callee: exit %d", r.code)
	}

	// doctor sees this broker and checks its Secret and management API.
	r = kubectlHCP(t, e, "", "doctor", "-n", ns)
	if !strings.Contains(r.out, "✓ broker connection Secret "+ns+"/hcp-broker: management API "+mgmt.URL+" answers (RabbitMQ 3.10.8, node rabbit@test)") {
		t.Error("doctor did not check the broker")
	}
	if !strings.Contains(r.out, "✗ credentials Secrets: Callee "+ns+"/lab-cvd: Secret hcp-callee-lab-cvd-credentials:") {
		t.Error("doctor did not report the missing credentials Secret")
	}
	if !strings.Contains(r.out, "! policies: no CapabilityPolicy selects Callee "+ns+"/lab-cvd") {
		t.Error("doctor did not warn about the Callee without a policy")
	}
}
