package kubectlhcp

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// The rendering, with fixed inputs: what a user reads.

var spaces = regexp.MustCompile(`[ \t]+`)

var t0 = time.Date(2026, 11, 25, 17, 0, 0, 0, time.UTC)

func mt(t time.Time) *metav1.Time { return &metav1.Time{Time: t} }

func pct(n int32) *int32 { return &n }

// sample returns a session created at t0.
func sample(name string, state hcpv1alpha1.SessionState) hcpv1alpha1.HCPSession {
	return hcpv1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "lab", CreationTimestamp: metav1.Time{Time: t0},
			Annotations: map[string]string{annotationDecidingPod: "hcp-callee-lab-cvd-7d9f-abcde"}},
		Spec: hcpv1alpha1.HCPSessionSpec{SessionID: name, CalleeID: "lab-cvd", CallerID: "alpha", Capability: "cvd.run-synthesis",
			RiskLevel: "R3", DataClassification: "T2", MaxDuration: "PT10M", Intent: "Grow graphene on copper foil"},
		Status: hcpv1alpha1.HCPSessionStatus{State: state},
	}
}

func running() hcpv1alpha1.HCPSession {
	hs := sample("4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10", hcpv1alpha1.SessionRunning)
	hs.Status.Reason = "accepted"
	hs.Status.Message = `admitted by CapabilityPolicy materials-lab rule 0 (callers [alpha], capabilities [cvd.*])`
	hs.Status.StartedAt = mt(t0.Add(time.Second))
	hs.Status.LastSequence, hs.Status.EventCount = 14, 14
	hs.Status.LastEventAt = mt(t0.Add(62 * time.Second))
	hs.Status.Progress = &hcpv1alpha1.SessionProgress{Stage: "heating", Percent: pct(40), Message: "step 4 of 10"}
	hs.Status.PodName = "hcp-callee-lab-cvd-7d9f-abcde"
	return hs
}

func completed() hcpv1alpha1.HCPSession {
	hs := sample("9a0e3f1d-2c7b-4e10-8b1c-8f0e2d7a4c55", hcpv1alpha1.SessionCompleted)
	hs.Status.Reason = "completed"
	hs.Status.StartedAt = mt(t0.Add(time.Second))
	hs.Status.CompletedAt = mt(t0.Add(2*time.Minute + 6*time.Second))
	hs.Status.LastSequence, hs.Status.EventCount = 31, 31
	hs.Status.LastEventAt = mt(t0.Add(2*time.Minute + 6*time.Second))
	hs.Status.Progress = &hcpv1alpha1.SessionProgress{Stage: "done", Percent: pct(100)}
	hs.Status.Result = &hcpv1alpha1.SessionResult{Summary: "graphene grown: 10 steps", Artifacts: []hcpv1alpha1.Artifact{{URI: "s3://lab/results/run-1.json"}}}
	hs.Status.LastCheckpoint = &hcpv1alpha1.SessionCheckpoint{ID: "ckpt-008", Description: "after step 8", Resumable: true, CreatedAt: mt(t0.Add(90 * time.Second))}
	hs.Status.PodName = "hcp-callee-lab-cvd-7d9f-abcde"
	return hs
}

func rejected() hcpv1alpha1.HCPSession {
	hs := sample("0f7c1d2e-3a4b-4c5d-9e6f-7a8b9c0d1e2f", hcpv1alpha1.SessionRejected)
	hs.CreationTimestamp = metav1.Time{Time: t0.Add(30 * time.Second)}
	hs.Status.Reason = "concurrency_limit"
	hs.Status.Message = `callee "lab-cvd" already runs 2 sessions, its spec.sessions.maxConcurrent is 2`
	hs.Status.Error = &hcpv1alpha1.SessionError{Code: "concurrency_limit", Message: hs.Status.Message}
	hs.Status.CompletedAt = mt(t0.Add(30 * time.Second))
	return hs
}

// rowOf returns the table line that starts with prefix, split on runs of
// spaces.
func rowOf(t *testing.T, out, prefix string) []string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1)
		}
	}
	t.Fatalf("no line starting with %q in:\n%s", prefix, out)
	return nil
}

func TestRenderSessions(t *testing.T) {
	now := t0.Add(65 * time.Second)
	var b bytes.Buffer
	if err := RenderSessions(&b, []hcpv1alpha1.HCPSession{running(), completed(), rejected()}, now, false, false); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log("\n" + out)
	if got := rowOf(t, out, "NAME"); strings.Join(got, "|") != "NAME|CALLEE|CALLER|CAPABILITY|STATE|PROGRESS|AGE|DURATION|LAST EVENT" {
		t.Errorf("header %q", got)
	}
	want := map[string]string{
		// running: 40%, created 65s ago, running for 64s, last event 3s ago
		"4b1c8f0e": "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10|lab-cvd|alpha|cvd.run-synthesis|RUNNING|40%|65s|1m4s|#14 3s ago",
		// completed: duration from start to end, not to now
		"9a0e3f1d": "9a0e3f1d-2c7b-4e10-8b1c-8f0e2d7a4c55|lab-cvd|alpha|cvd.run-synthesis|COMPLETED|100%|65s|2m5s|#31 just now",
		// rejected: never ran
		"0f7c1d2e": "0f7c1d2e-3a4b-4c5d-9e6f-7a8b9c0d1e2f|lab-cvd|alpha|cvd.run-synthesis|REJECTED|-|35s|-|-",
	}
	for prefix, w := range want {
		if got := strings.Join(rowOf(t, out, prefix), "|"); got != w {
			t.Errorf("row %s:\n got %s\nwant %s", prefix, got, w)
		}
	}

	b.Reset()
	if err := RenderSessions(&b, []hcpv1alpha1.HCPSession{running()}, now, true, true); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	if got := strings.Join(rowOf(t, b.String(), "NAMESPACE"), "|"); got != "NAMESPACE|NAME|CALLEE|CALLER|CAPABILITY|STATE|PROGRESS|AGE|DURATION|LAST EVENT|RISK|STAGE|SEQ|POD|REASON" {
		t.Errorf("wide header %s", got)
	}
	row := rowOf(t, b.String(), "lab")
	if row[0] != "lab" || row[10] != "R3" || row[11] != "heating" || row[12] != "14" || row[13] != "hcp-callee-lab-cvd-7d9f-abcde" || row[14] != "accepted" {
		t.Errorf("wide row %q", row)
	}
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		850 * time.Millisecond:        "850ms",
		12 * time.Second:              "12s",
		2*time.Minute + 5*time.Second: "2m5s",
		3 * time.Minute:               "3m",
		time.Hour + 4*time.Minute:     "1h4m",
		50 * time.Hour:                "2d2h",
		-time.Second:                  "0ms",
	} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestParseStates(t *testing.T) {
	got, err := parseStates("running, Paused")
	if err != nil || len(got) != 2 || got[0] != hcpv1alpha1.SessionRunning || got[1] != hcpv1alpha1.SessionPaused {
		t.Errorf("parseStates = %v, %v", got, err)
	}
	if _, err := parseStates("RUNNIN"); err == nil || !strings.Contains(err.Error(), "not a session state") || !strings.Contains(err.Error(), "COMPLETED") {
		t.Errorf("a typo: %v", err)
	}
}

func TestDiffAndLines(t *testing.T) {
	prev := running()
	cur := prev.DeepCopy()
	cur.Status.Progress = &hcpv1alpha1.SessionProgress{Stage: "growth", Percent: pct(70), Message: "step 7 of 10"}
	cur.Status.LastEventAt = mt(t0.Add(90 * time.Second))
	cur.Status.LastCheckpoint = &hcpv1alpha1.SessionCheckpoint{ID: "ckpt-004", Description: "after step 4", CreatedAt: mt(t0.Add(80 * time.Second))}
	changes := diffSession(&prev, cur, t0.Add(91*time.Second))
	if len(changes) != 2 || changes[0].kind != changeProgress || changes[1].kind != changeCheckpoint {
		t.Fatalf("changes %+v, want progress then checkpoint", changes)
	}
	if got := changeLine(cur, changes[0]); got != "17:01:30Z 4b1c8f0e  70% growth: step 7 of 10" {
		t.Errorf("progress line %q", got)
	}
	if got := changeLine(cur, changes[1]); got != "17:01:20Z 4b1c8f0e checkpoint ckpt-004: after step 4" {
		t.Errorf("checkpoint line %q", got)
	}
	if diffSession(cur, cur, t0) != nil {
		t.Error("no change reported changes")
	}

	end := completed()
	end.Name = prev.Name
	changes = diffSession(cur, &end, t0.Add(3*time.Minute))
	// Progress and checkpoint first, the state change last.
	changes = changes[len(changes)-1:]
	if changes[0].kind != changeState || changes[0].from != hcpv1alpha1.SessionRunning || changes[0].to != hcpv1alpha1.SessionCompleted {
		t.Fatalf("last change %+v, want RUNNING → COMPLETED", changes[0])
	}
	if got := changeLine(&end, changes[0]); got != "17:02:06Z 4b1c8f0e RUNNING → COMPLETED (completed)" {
		t.Errorf("transition line %q (the time is completedAt)", got)
	}
	if got := outcomeLine(&end); got != "session 4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10 COMPLETED after 2m5s, 31 events: graphene grown: 10 steps [1 artifacts]" {
		t.Errorf("outcome %q", got)
	}
	failed := running()
	failed.Status.State = hcpv1alpha1.SessionFailed
	failed.Status.Reason = "timeout"
	failed.Status.CompletedAt = mt(t0.Add(11 * time.Second))
	failed.Status.Error = &hcpv1alpha1.SessionError{Code: "timeout", Message: "the session reached its max duration PT10S"}
	if got := outcomeLine(&failed); got != "session 4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10 FAILED after 10s, 14 events: timeout: the session reached its max duration PT10S" {
		t.Errorf("failed outcome %q", got)
	}
	quick := failed
	quick.Status.CompletedAt = mt(t0.Add(time.Second))
	if got := outcomeLine(&quick); !strings.Contains(got, "FAILED after <1s,") {
		t.Errorf("a session that ended within its first second: %q", got)
	}
	for s, code := range map[hcpv1alpha1.SessionState]int{
		hcpv1alpha1.SessionCompleted: 0, hcpv1alpha1.SessionFailed: 2, hcpv1alpha1.SessionAborted: 3, hcpv1alpha1.SessionRejected: 4,
	} {
		if got := outcomeCode(s); got != code {
			t.Errorf("outcomeCode(%s) = %d, want %d", s, got, code)
		}
	}
}

func TestPlainView(t *testing.T) {
	var b bytes.Buffer
	v := &plainView{w: &b, now: func() time.Time { return t0.Add(time.Hour) }}
	hs := running()
	v.add(&hs)
	end := completed()
	end.Name = hs.Name
	v.update(&end, diffSession(&hs, &end, t0))
	v.end(&end, false)
	want := `session 4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10: cvd.run-synthesis on lab-cvd for alpha, RUNNING 40%
18:00:00Z 4b1c8f0e  40% heating: step 4 of 10
17:02:06Z 4b1c8f0e 100% done
17:01:30Z 4b1c8f0e checkpoint ckpt-008: after step 8
17:02:06Z 4b1c8f0e RUNNING → COMPLETED (completed)
session 4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10 COMPLETED after 2m5s, 31 events: graphene grown: 10 steps [1 artifacts]
`
	// The first progress line is dated when it was seen (the session was
	// already running); later ones by status.lastEventAt.
	if b.String() != want {
		t.Errorf("plain output:\n%s\nwant:\n%s", b.String(), want)
	}
}

// The bar view draws through mpb; on a buffer (no terminal) it still
// renders, and close returns once every bar is done.
func TestBarViewEnds(t *testing.T) {
	var b bytes.Buffer
	v := newBarView(&b, func() time.Time { return t0 })
	hs := running()
	v.add(&hs)
	other := rejected()
	other.Status.State = hcpv1alpha1.SessionRunning
	v.add(&other)
	end := completed()
	end.Name = hs.Name
	v.update(&end, diffSession(&hs, &end, t0))
	v.end(&end, false)
	v.end(&other, true)
	done := make(chan struct{})
	go func() { v.close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("close did not return")
	}
	out := b.String()
	for _, s := range []string{"session 4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10: cvd.run-synthesis", "RUNNING → COMPLETED", "COMPLETED after 2m5s", "deleted before it ended", "4b1c8f0e cvd.run-synthesis"} {
		if !strings.Contains(out, s) {
			t.Errorf("bar output lacks %q:\n%s", s, out)
		}
	}
}

func TestDescription(t *testing.T) {
	hs := completed()
	hs.OwnerReferences = []metav1.OwnerReference{{Kind: "Callee", Name: "lab-cvd"}}
	hs.Status.Conditions = []metav1.Condition{
		{Type: "Ready", Status: "True", Reason: "Completed", LastTransitionTime: metav1.Time{Time: t0.Add(126 * time.Second)}},
		{Type: hcpv1alpha1.ConditionHandover, Status: "True", Reason: "Released", Message: "handed over by pod a", LastTransitionTime: metav1.Time{Time: t0.Add(40 * time.Second)}},
	}
	events := []corev1.Event{{
		Type: "Normal", Reason: "Accepted", Message: "admitted by CapabilityPolicy materials-lab rule 0",
		LastTimestamp: metav1.Time{Time: t0.Add(time.Second)}, Source: corev1.EventSource{Component: "hcp-sidecar", Host: "pod-a"},
	}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: hs.Status.PodName}, Spec: corev1.PodSpec{NodeName: "hcp-local"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.250.0.7", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	var b bytes.Buffer
	if err := RenderDescription(&b, Description{Session: &hs, Pod: pod, Events: events}, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log("\n" + out)
	flat := spaces.ReplaceAllString(out, " ")
	for _, want := range []string{
		"Callee: lab-cvd (Callee lab-cvd)",
		"State: COMPLETED (completed)",
		"Duration: 2m5s",
		"Result: graphene grown: 10 steps",
		"Artifact: s3://lab/results/run-1.json",
		"Verdict: admitted",
		// the rule comes from the Event once status.message moved on
		"Rule: admitted by CapabilityPolicy materials-lab rule 0",
		"Risk: R3 (assessed)",
		"Decided by: pod hcp-callee-lab-cvd-7d9f-abcde",
		"Status: Running, ready",
		"Node: hcp-local",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("description lacks %q", want)
		}
	}
	// The timeline, in order: created, started (and the Event), handover,
	// checkpoint, last event/end.
	tl := out[strings.Index(out, "Timeline:"):]
	order := []string{"created PENDING", "RUNNING: admitted", "Normal Accepted: admitted by", "condition Handover=True (Released): handed over by pod a",
		"last checkpoint ckpt-008: after step 8 (resumable)", "COMPLETED (completed): graphene grown"}
	last := -1
	for _, s := range order {
		i := strings.Index(tl, s)
		if i < 0 || i < last {
			t.Errorf("timeline: %q missing or out of order:\n%s", s, tl)
		}
		last = i
	}
	if strings.Contains(tl, "condition Ready") {
		t.Error("the derived Ready condition is in the timeline")
	}

	// A rejected session: the decision is the rejection.
	rj := rejected()
	d := DecisionOf(&rj, nil)
	if d.Verdict != "rejected" || d.Detail != `concurrency_limit: callee "lab-cvd" already runs 2 sessions, its spec.sessions.maxConcurrent is 2` {
		t.Errorf("rejected decision %+v", d)
	}
	// A running one: the rule from status.message.
	rn := running()
	if d := DecisionOf(&rn, nil); d.Verdict != "admitted" || !strings.HasPrefix(d.Detail, "admitted by CapabilityPolicy materials-lab") {
		t.Errorf("running decision %+v", d)
	}
	// No rule recorded any more: said so.
	b.Reset()
	plain := completed()
	_ = RenderDescription(&b, Description{Session: &plain, PodErr: "gone", Policies: []string{"materials-lab"}}, t0.Add(time.Hour))
	if !strings.Contains(b.String(), "not recorded any more") || !strings.Contains(b.String(), "CapabilityPolicies selecting callee lab-cvd now: materials-lab") || !strings.Contains(b.String(), "hcp-callee-lab-cvd-7d9f-abcde (gone)") ||
		!strings.Contains(b.String(), "no Kubernetes Events about this session") {
		t.Errorf("description without rule, pod or events:\n%s", b.String())
	}
}

func TestRenderChecks(t *testing.T) {
	var b bytes.Buffer
	RenderChecks(&b, []Check{
		{Name: "hcp.io CRDs", Status: CheckOK, Detail: "callees, callers established"},
		{Name: "hcp-operator", Status: CheckFail, Detail: "no Deployment", Fix: "helm install hcp-operator charts/hcp-operator"},
		{Name: "policies", Status: CheckWarn, Detail: "no CapabilityPolicy selects Callee lab/x", Fix: "apply one"},
	})
	want := `✓ hcp.io CRDs: callees, callers established
✗ hcp-operator: no Deployment
    fix: helm install hcp-operator charts/hcp-operator
! policies: no CapabilityPolicy selects Callee lab/x
    fix: apply one

3 checks: 1 passed, 1 warnings, 1 failed
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestRenderTopology(t *testing.T) {
	var b bytes.Buffer
	err := RenderTopology(&b, HarnessTopology{
		Kind: "Callee", Name: "lab-cvd", Namespace: "lab", ID: "lab-cvd", Vhost: "/hcp",
		TopologyReady: &metav1.Condition{Type: "TopologyReady", Status: "True", Reason: "Reconciled"},
		Broker:        "connection Secret lab/hcp-broker", Management: "http://127.0.0.1:15672 answers",
		Items: []TopologyItem{
			{What: "queue", BrokerName: "hcp.cmd.lab-cvd", Object: "Queue/hcp-callee-lab-cvd", Ready: "True", Details: "quorum, 3 messages (2 ready, 1 unacked), 1 consumers"},
			{What: "permission", BrokerName: "callee.lab-cvd@/hcp on /hcp", Object: "Permission/hcp-callee-lab-cvd", Ready: "False (FailedCreateOrUpdate: 401)", Details: `configure ^$, write ^hcp\.events$, read ^hcp\.cmd\.lab-cvd$`},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log("\n" + out)
	for _, want := range []string{
		"Callee lab/lab-cvd (id lab-cvd): TopologyReady=True (Reconciled)",
		"vhost /hcp, broker connection Secret lab/hcp-broker",
		"management API: http://127.0.0.1:15672 answers",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q", want)
		}
	}
	if row := rowOf(t, out, "  queue"); row[1] != "hcp.cmd.lab-cvd" || row[3] != "True" || row[4] != "quorum, 3 messages (2 ready, 1 unacked), 1 consumers" {
		t.Errorf("queue row %q", row)
	}
	if row := rowOf(t, out, "  permission"); row[3] != "False (FailedCreateOrUpdate: 401)" || !strings.Contains(row[4], `read ^hcp\.cmd\.lab-cvd$`) {
		t.Errorf("permission row %q", row)
	}
}

func TestBuildSubmitRequest(t *testing.T) {
	base := SubmitOptions{Caller: "alpha", Callee: "lab-cvd", Capability: "cvd.run-synthesis", Inputs: `{"steps": 3}`}
	req, err := buildSubmitRequest(base, nil)
	if err != nil || string(req.Inputs) != `{"steps": 3}` || req.Intent == "" {
		t.Fatalf("request %+v, %v", req, err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "task.json")
	if err := os.WriteFile(file, []byte(`{"recipe":"s3://lab/r.yaml"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := base
	o.Inputs, o.DataClass, o.MaxDuration, o.MaxRisk = "@"+file, "t2", "PT10M", "R3"
	req, err = buildSubmitRequest(o, nil)
	if err != nil || string(req.Inputs) != `{"recipe":"s3://lab/r.yaml"}` || req.Constraints.DataClassification != task.T2 ||
		req.Constraints.MaxDuration.Std() != 10*time.Minute || req.Constraints.MaxRiskLevel != "R3" {
		t.Errorf("from a file: %+v, %v", req, err)
	}
	o.Inputs = "@-"
	if req, err = buildSubmitRequest(o, strings.NewReader(`{"a":1}`)); err != nil || string(req.Inputs) != `{"a":1}` {
		t.Errorf("from stdin: %+v, %v", req, err)
	}
	for _, c := range []struct {
		mut  func(*SubmitOptions)
		want string
	}{
		{func(o *SubmitOptions) { o.Caller, o.Capability = "", "" }, "missing --caller, --capability"},
		{func(o *SubmitOptions) { o.Inputs = "[1,2]" }, "--inputs: not a JSON object"},
		{func(o *SubmitOptions) { o.Inputs = "null" }, "not a JSON object (null)"},
		{func(o *SubmitOptions) { o.Inputs = "@" + filepath.Join(dir, "missing.json") }, "missing.json: open"},
		{func(o *SubmitOptions) { o.DataClass = "T9" }, "--data-class"},
		{func(o *SubmitOptions) { o.MaxDuration = "10m" }, `--max-duration "10m"`},
		{func(o *SubmitOptions) { o.MaxRisk = "high" }, "--max-risk"},
	} {
		o := base
		c.mut(&o)
		if _, err := buildSubmitRequest(o, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want it to say %q", err, c.want)
		}
	}
}

func TestSidecarPort(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: "hcp-sidecar", Env: []corev1.EnvVar{{Name: "HCP_API_ADDR", Value: "127.0.0.1:9190"}}}}}}
	if p := sidecarPort(pod); p != 9190 {
		t.Errorf("port %d, want 9190 from HCP_API_ADDR", p)
	}
	if p := sidecarPort(&corev1.Pod{}); p != 9090 {
		t.Errorf("default port %d", p)
	}
}

// The timeline's first line says how the session was created: an
// undecided claim, or admitted by the create itself (no concurrency limit).
func TestTimelineCreatedLine(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	for _, c := range []struct {
		annotations map[string]string
		want        string
	}{
		{map[string]string{annotationDecidingPod: "p-0"}, "created PENDING: task_submit received, the L3 gate ran in pod p-0"},
		{map[string]string{annotationDecidingPod: "p-0", hcpv1alpha1.AnnotationAdmitted: "true"}, "created admitted: task_submit received, the L3 gate admitted it in pod p-0"},
	} {
		hs := &hcpv1alpha1.HCPSession{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: at, Annotations: c.annotations}}
		if tl := Timeline(hs, nil); len(tl) == 0 || tl[0].What != c.want {
			t.Errorf("annotations %v: timeline %+v, want first %q", c.annotations, tl, c.want)
		}
	}
}
