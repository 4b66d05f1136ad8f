package kubectlhcp

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// Which pod's log logs shows, and from when, as the session moves.

const (
	podA = "hcp-callee-lab-cvd-7d9f-aaaaa"
	podB = "hcp-callee-lab-cvd-7d9f-bbbbb"
)

func onPod(hs hcpv1alpha1.HCPSession, pod string) *hcpv1alpha1.HCPSession {
	hs.Status.PodName = pod
	return &hs
}

// released is the session as the drained pod leaves it.
func released(hs hcpv1alpha1.HCPSession, at time.Time) *hcpv1alpha1.HCPSession {
	hs.Status.State, hs.Status.Reason, hs.Status.PodName = hcpv1alpha1.SessionPaused, "harness_moved", ""
	hs.Status.Conditions = []metav1.Condition{{Type: hcpv1alpha1.ConditionHandover, Status: "True", Reason: "Released",
		Message: "released by pod " + podA, LastTransitionTime: metav1.Time{Time: at}}}
	return &hs
}

// takenOver is the session as the pod that took it over writes it; first
// is when the Handover condition first turned True (it keeps that time).
func takenOver(hs hcpv1alpha1.HCPSession, pod string, first time.Time) *hcpv1alpha1.HCPSession {
	hs.Status.State, hs.Status.Reason, hs.Status.PodName = hcpv1alpha1.SessionRunning, "accepted", pod
	hs.Status.Conditions = []metav1.Condition{{Type: hcpv1alpha1.ConditionHandover, Status: "True", Reason: "TakenOver",
		Message: "handed over by its replica; resumed by pod " + pod, LastTransitionTime: metav1.Time{Time: first}}}
	return &hs
}

func TestFirstTarget(t *testing.T) {
	base := running() // created at t0
	pending := sample("5d6e7f80-1a2b-4c3d-8e4f-5a6b7c8d9e0f", "")
	for _, c := range []struct {
		name string
		hs   *hcpv1alpha1.HCPSession
		want logTarget
	}{
		{"never moved: from its creation", onPod(base, podA), logTarget{Pod: podA, Since: t0.Add(-arrivalSlack)}},
		{"taken over: from the takeover", takenOver(base, podB, t0.Add(40*time.Second)), logTarget{Pod: podB, Since: t0.Add(40*time.Second - arrivalSlack)}},
		{"undecided: the deciding pod", &pending, logTarget{Pod: "hcp-callee-lab-cvd-7d9f-abcde", Since: t0.Add(-arrivalSlack)}},
		{"between release and takeover: none", released(base, t0.Add(30*time.Second)), logTarget{}},
		{"moved, time not recorded for this pod: all it kept", func() *hcpv1alpha1.HCPSession {
			hs := takenOver(base, podB, t0)
			hs.Status.PodName = podA
			return hs
		}(), logTarget{Pod: podA}},
	} {
		if got := firstTarget(c.hs); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestFollowPlanAcrossADrain(t *testing.T) {
	base := running()
	var p followPlan
	st := p.start(onPod(base, podA))
	if st.Next == nil || st.Next.Pod != podA || st.Done {
		t.Fatalf("start: %+v", st)
	}
	// Progress on the same pod changes nothing.
	more := onPod(base, podA)
	more.Status.LastSequence = 20
	if st := p.observe(more, t0.Add(20*time.Second)); st.Next != nil || st.Done || st.Note != "" {
		t.Errorf("progress: %+v", st)
	}
	// Released at the drain: no pod owns it; the old pod's log goes on.
	st = p.observe(released(base, t0.Add(30*time.Second)), t0.Add(30*time.Second))
	if st.Next != nil || st.Done || !st.Left || !strings.Contains(st.Note, "left pod "+podA+" (PAUSED (harness_moved)); waiting") {
		t.Errorf("released: %+v", st)
	}
	if st := p.observe(released(base, t0.Add(30*time.Second)), t0.Add(30*time.Second)); st.Left || st.Note != "" {
		t.Errorf("released again: %+v", st)
	}
	// Taken over by B at 31 s, seen at 31.5 s: B from the takeover's time.
	took := t0.Add(31 * time.Second)
	st = p.observe(takenOver(base, podB, took), took.Add(500*time.Millisecond))
	if st.Next == nil || *st.Next != (logTarget{Pod: podB, Since: took.Add(-arrivalSlack)}) || st.Done {
		t.Fatalf("taken over: %+v", st)
	}
	if !strings.Contains(st.Note, "moved from pod "+podA+" to pod "+podB+" (RUNNING (accepted))") {
		t.Errorf("note %q", st.Note)
	}
	// Back to A later: the condition keeps its first time (31 s), which is
	// before B's arrival: the time it was seen is used.
	seen := t0.Add(90 * time.Second)
	st = p.observe(takenOver(base, podA, took), seen)
	if st.Next == nil || *st.Next != (logTarget{Pod: podA, Since: seen.Add(-arrivalSlack)}) {
		t.Fatalf("second move: %+v", st)
	}
	// Ends on A.
	end := takenOver(base, podA, took)
	end.Status.State, end.Status.Reason, end.Status.CompletedAt = hcpv1alpha1.SessionCompleted, "completed", mt(t0.Add(100*time.Second))
	st = p.observe(end, t0.Add(100*time.Second))
	if !st.Done || st.Next != nil || !strings.Contains(st.Note, "ended COMPLETED (completed)") {
		t.Errorf("end: %+v", st)
	}
	if st := p.observe(end, t0.Add(101*time.Second)); st.Done || st.Next != nil || st.Note != "" {
		t.Errorf("after the end: %+v", st)
	}
}

func TestFollowPlanWaitsForAPod(t *testing.T) {
	base := running()
	var p followPlan
	st := p.start(released(base, t0))
	if st.Next != nil || !strings.Contains(st.Note, "is PAUSED (harness_moved) and no pod owns it now; waiting") {
		t.Fatalf("start: %+v", st)
	}
	// Ends moved to B in one write (a quick task): B, then done.
	end := takenOver(base, podB, t0.Add(time.Second))
	end.Status.State = hcpv1alpha1.SessionFailed
	st = p.observe(end, t0.Add(2*time.Second))
	if st.Next == nil || st.Next.Pod != podB || !st.Done || !strings.Contains(st.Note, "is on pod "+podB) || !strings.Contains(st.Note, "ended FAILED") {
		t.Errorf("%+v", st)
	}
	var q followPlan
	q.start(onPod(base, podA))
	if st := q.gone("x"); !st.Done || st.Note != "session x was deleted" {
		t.Errorf("gone: %+v", st)
	}
}

func TestHarnessContainer(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "hcp-sidecar"}},
		Containers:     []corev1.Container{{Name: "harness"}, {Name: "exporter"}},
	}}
	for _, c := range []struct {
		annotation, want, got, err string
	}{
		{got: "harness"},
		{annotation: "exporter", got: "exporter"},
		{annotation: "nope", got: "harness"},
		{want: "hcp-sidecar", got: "hcp-sidecar"},
		{want: "x", err: `pod p has no container "x" (it has hcp-sidecar, harness, exporter)`},
	} {
		pod.Annotations = map[string]string{annotationDefaultContainer: c.annotation}
		got, err := harnessContainer(pod, c.want)
		if got != c.got || (err == nil) != (c.err == "") || (err != nil && err.Error() != c.err) {
			t.Errorf("%+v: %q, %v", c, got, err)
		}
	}
}

func TestLineWriter(t *testing.T) {
	in := "2026-11-25T17:00:00.5Z before the session\n" +
		"2026-11-25T17:00:01.25Z {\"msg\":\"Running task\"}\n" +
		"not a timestamped line\n" +
		"2026-11-25T17:00:02Z stdout\n" +
		"2026-11-25T17:00:01.9Z stderr, a little earlier\n" +
		"2026-11-25T17:00:02Z same time, without a newline"
	var b bytes.Buffer
	l := lineWriter{out: &b, since: t0.Add(time.Second), prefix: "[pod/a/harness] "}
	if err := l.copy(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	want := "[pod/a/harness] {\"msg\":\"Running task\"}\n[pod/a/harness] not a timestamped line\n[pod/a/harness] stdout\n" +
		"[pod/a/harness] stderr, a little earlier\n[pod/a/harness] same time, without a newline\n"
	if b.String() != want {
		t.Errorf("got %q\nwant %q", b.String(), want)
	}
	if !l.last.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("last %s", l.last)
	}
	// Reopened after the last line: nothing again; with timestamps kept.
	b.Reset()
	l2 := lineWriter{out: &b, timestamps: true, skip: l.last}
	_ = l2.copy(strings.NewReader(in + "\n2026-11-25T17:00:03Z new\n"))
	if b.String() != "not a timestamped line\n2026-11-25T17:00:03Z new\n" {
		t.Errorf("reopened: %q", b.String())
	}
}
