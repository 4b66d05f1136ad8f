//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/pkg/conformance"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
)

// kitCallerID is the conformance kit's own caller identity: an external
// Caller (no harness), so no caller sidecar competes for its event queue.
const kitCallerID = "hcp-conformance"

// TestConformanceKit runs the conformance kit (pkg/conformance, the
// library behind cmd/hcp-conformance) against the sample callee lab-cvd
// on the local stack: the chart installed, the sample Callee and
// CapabilityPolicy applied, and a Caller of the kit's own whose
// credentials Secret gives the kit its AMQP URI. Every check must pass,
// the management ones included (the suite passes the broker's management
// API). Then the command itself (cmd/hcp-conformance) runs the same
// checks and must exit 0; HCP_CONFORMANCE_REPORT=FILE writes its command
// line and output to FILE.
func TestConformanceKit(t *testing.T) {
	s := newSuite(t)
	t.Logf("run %s: namespace %s, vhost %s, broker %s", s.id, s.ns, s.vhost, s.cfg.managementURL)
	s.install(t)
	s.dumpOnFailure(t)
	ctx := t.Context()

	callee, policy := &hcpv1alpha1.Callee{}, &hcpv1alpha1.CapabilityPolicy{}
	loadSample(t, "hcp_v1alpha1_callee.yaml", callee)
	loadSample(t, "hcp_v1alpha1_capabilitypolicy.yaml", policy)
	broker := hcpv1alpha1.BrokerSpec{Vhost: s.vhost, CreateVhost: true, VhostDeletionPolicy: "delete"}
	callee.Namespace, policy.Namespace = s.ns, s.ns
	callee.Spec.Broker = broker
	callee.Spec.Sessions.MaxConcurrent = new(int32(concurrency))
	if img := s.cfg.calleeImage; img != "" {
		callee.Spec.Harness.Template.Spec.Containers[0].Image = img
	}
	// The sample policy admits alpha; admit the kit alike, with room for
	// the kit's concurrent sessions.
	for i := range policy.Spec.Rules {
		policy.Spec.Rules[i].Callers.IDs = append(policy.Spec.Rules[i].Callers.IDs, kitCallerID)
		policy.Spec.Rules[i].MaxConcurrentSessions = new(int32(concurrency))
	}
	kit := &hcpv1alpha1.Caller{
		TypeMeta:   metav1.TypeMeta{APIVersion: hcpv1alpha1.GroupVersion.String(), Kind: "Caller"},
		ObjectMeta: metav1.ObjectMeta{Name: kitCallerID, Namespace: s.ns},
		Spec:       hcpv1alpha1.CallerSpec{Broker: broker},
	}
	for _, o := range []client.Object{callee, policy, kit} {
		if err := s.c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	eventually(t, readyTimeout, "Callee lab-cvd, Caller "+kitCallerID+" and the policy Ready", func(ctx context.Context) error {
		for _, o := range []client.Object{callee, kit, policy} {
			if err := s.c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
				return err
			}
		}
		for what, conds := range map[string][]metav1.Condition{
			"Callee " + callee.Name: callee.Status.Conditions, "Caller " + kit.Name: kit.Status.Conditions, "CapabilityPolicy " + policy.Name: policy.Status.Conditions,
		} {
			if !meta.IsStatusConditionTrue(conds, hcpv1alpha1.ConditionReady) {
				return fmt.Errorf("%s: %s; pods: %s", what, conditions(conds), s.podsSummary(ctx, s.ns))
			}
		}
		return nil
	})
	(&samplesRun{suite: s, parent: t}).readyPod(t, "hcp.io/callee="+calleeID)

	secret := &corev1.Secret{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: kit.Status.CredentialsSecret}, secret); err != nil {
		t.Fatalf("the kit's credentials Secret %q: %v", kit.Status.CredentialsSecret, err)
	}
	amqpURL := reachable(t, string(secret.Data[resource.CredentialsURIKey]))
	mgmt, err := url.Parse(s.cfg.managementURL)
	if err != nil {
		t.Fatal(err)
	}
	mgmt.User = url.UserPassword(s.cfg.username, s.cfg.password)

	// Wait until the callee consumes its queue (Ready says its pod is;
	// the broker may show the consumer a moment later).
	eventually(t, time.Minute, "a consumer on "+topology.CommandQueue(calleeID), func(context.Context) error {
		q, err := s.broker.Queue(s.vhost, topology.CommandQueue(calleeID))
		if err != nil {
			return err
		}
		if q.Consumers < 1 {
			return fmt.Errorf("%d consumers", q.Consumers)
		}
		return nil
	})

	cfg := conformance.Config{
		AMQPURL:            amqpURL,
		CalleeID:           calleeID,
		CallerID:           kitCallerID,
		Capability:         synthesis,
		Inputs:             json.RawMessage(`{"recipe":"s3://lab/recipes/conformance.yaml","steps":5,"step_ms":100}`),
		AbortInputs:        json.RawMessage(`{"recipe":"s3://lab/recipes/conformance-long.yaml","steps":600,"step_ms":100}`),
		DataClassification: "T2",
		ManagementURL:      mgmt.String(),
		Timeout:            time.Minute,
		Profile:            conformance.ProfileHCPOperator,
		Log:                testWriter{t},
	}
	var rep conformance.Report
	noteFailure(t, func() string { return failedRows(&rep) })
	start := time.Now()
	rep = conformance.Test(t, cfg)
	t.Logf("the kit ran in %s", time.Since(start).Round(100*time.Millisecond))
	if n := rep.Count(conformance.Pass); n != len(rep.Rows) {
		t.Errorf("%d of %d checks passed (%d failed, %d skipped); want all", n, len(rep.Rows), rep.Count(conformance.Fail), rep.Count(conformance.Skip))
	}

	// The command, as a user runs it: exit status 0 and the table.
	t.Run("Command", func(t *testing.T) {
		dir := t.TempDir()
		bin := filepath.Join(dir, "hcp-conformance")
		build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./cmd/hcp-conformance")
		build.Dir = s.cfg.root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/hcp-conformance: %v\n%s", err, out)
		}
		uriFile := filepath.Join(dir, "uri")
		if err := os.WriteFile(uriFile, []byte(amqpURL), 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"--amqp-url-file", uriFile, "--callee", calleeID, "--caller", kitCallerID,
			"--capability", synthesis, "--inputs", string(cfg.Inputs), "--abort-inputs", string(cfg.AbortInputs),
			"--data-class", cfg.DataClassification, "--management-url", mgmt.String(), "--profile", conformance.ProfileHCPOperator,
			"--report-json", filepath.Join(dir, "report.json"), "--report-junit", filepath.Join(dir, "report.xml"), "--quiet"}
		var stdout, stderr strings.Builder
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		shown := strings.ReplaceAll(strings.Join(args, " "), mgmt.String(), mgmt.Redacted())
		t.Logf("hcp-conformance %s\n%s%s", shown, stdout.String(), stderr.String())
		if err != nil {
			t.Errorf("hcp-conformance: %v (want exit status 0)", err)
		}
		var rep conformance.Report
		if js, err := os.ReadFile(filepath.Join(dir, "report.json")); err != nil || json.Unmarshal(js, &rep) != nil ||
			rep.Kit != "callee" || len(rep.Rows) != len(conformance.Checks()) || rep.Failed() {
			t.Errorf("the JSON report: %v; kit %q, %d rows (want %d), failed %t", err, rep.Kit, len(rep.Rows), len(conformance.Checks()), rep.Failed())
		}
		if _, err := os.Stat(filepath.Join(dir, "report.xml")); err != nil {
			t.Errorf("the JUnit report: %v", err)
		}
		if path := os.Getenv("HCP_CONFORMANCE_REPORT"); path != "" {
			host, _ := os.Hostname()
			out := fmt.Sprintf("$ hcp-conformance %s\n# exit status %d; %s on %s (%s)\n\n%s", shown, cmd.ProcessState.ExitCode(),
				time.Now().UTC().Format(time.RFC3339), host, runtime.GOOS+"/"+runtime.GOARCH, stdout.String())
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				t.Error(err)
			}
		}
	})

	// The interactive checks fail against the same callee when the kit is
	// told wrong things: another callee user (MSG-8, profile hcp-operator),
	// a capability the
	// callee offers as the "unknown" one (REJ-1), a "long" task that ends
	// at once (ABT-*). Exit status 1. CON-1 is not required to fail here:
	// with a task that ends at once, whether its last messages arrive
	// before or after the kit's disconnect is a race (it passed in one
	// .ci/run of four on 2026-11-28: "after the reconnect 1 new messages
	// arrived"); the unit test "nothing new after the reconnect" in
	// pkg/conformance shows the check failing on exactly that input.
	t.Run("CommandDetectsFaults", func(t *testing.T) {
		args := []string{"--amqp-url", amqpURL, "--callee", calleeID, "--caller", kitCallerID,
			"--capability", synthesis, "--inputs", string(cfg.Inputs), "--abort-inputs", `{"steps":1,"step_ms":10}`,
			"--data-class", "T1", "--unknown-capability", "cvd.read-telemetry", "--callee-user", "callee.someone-else@/elsewhere",
			"--profile", conformance.ProfileHCPOperator, "--timeout", "20s", "--quiet"}
		var stdout, stderr strings.Builder
		cmd := exec.CommandContext(t.Context(), "go", append([]string{"run", "./cmd/hcp-conformance"}, args...)...)
		cmd.Dir = s.cfg.root
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		t.Logf("hcp-conformance with wrong expectations:\n%s%s", stdout.String(), stderr.String())
		if code := cmd.ProcessState.ExitCode(); code != 1 {
			t.Errorf("exit status %d (%v), want 1", code, err)
		}
		for _, id := range []string{conformance.MsgUserID, conformance.RejUnknown, conformance.AbtAborting} {
			if !strings.Contains(stdout.String(), "| "+id+" |") || !strings.Contains(rowOf(stdout.String(), id), "**FAIL**") {
				t.Errorf("check %s did not fail", id)
			}
		}
		if want := "- " + conformance.RejUnknown + ` [normative] L1-transport-encoding.md:69 (Message Types): "task_rejected Task failed safety check": `; !strings.Contains(stdout.String(), want) {
			t.Errorf("the REJ-1 failure does not cite the spec line: no %q", want)
		}
		for _, id := range []string{conformance.MsgContentType, conformance.SesAccepted, conformance.DupAnswer, conformance.RejIdentity} {
			if strings.Contains(rowOf(stdout.String(), id), "**FAIL**") {
				t.Errorf("check %s failed, and should not have", id)
			}
		}
	})
}

// rowOf returns the table row of check id in the kit's output.
func rowOf(out, id string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "| "+id+" |") {
			return l
		}
	}
	return ""
}

// reachable returns the credentials Secret's AMQP URI if its host answers
// from here, else the same URI on the broker's local address (the Secret
// holds the address pods use).
func reachable(t *testing.T, uri string) string {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil || u.Host == "" {
		t.Fatalf("the credentials Secret's uri does not parse: %v", err)
	}
	if c, err := net.DialTimeout("tcp", u.Host, 3*time.Second); err == nil {
		_ = c.Close()
		return uri
	}
	local, err := url.Parse(envOr("RABBITMQ_AMQP_URL", "amqp://127.0.0.1:5672"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s does not answer from here; using %s", u.Host, local.Host)
	u.Host = local.Host
	return u.String()
}

// testWriter sends the kit's progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// kitCalleeID is the caller kit's own callee identity on the stack: a
// broker user and a command queue the test makes (no Callee object, whose
// sidecar would consume the queue).
const kitCalleeID = "hcp-conformance"

// TestConformanceKitCaller runs the caller kit (conformance.RunCaller,
// profile hcp-operator) against the sample Caller alpha on the local
// stack: its pod's caller sidecar is the caller under test, the sample
// app beside it (sample-caller serve) its application. The kit drives it
// the way a foreign implementer would, through a CallerDriver of the
// test's own: submits and aborts through the sidecar's API, what was
// processed from the app's GET /received, both reached through kubectl
// port-forward. The kit plays the callee hcp-conformance: a broker user
// named by the operator's scheme, with the callee permissions, and its
// command queue, made through the management API. Every check must pass,
// and the app must have seen no duplicate and no problem.
func TestConformanceKitCaller(t *testing.T) {
	s := newSuite(t)
	t.Logf("run %s: namespace %s, vhost %s, broker %s", s.id, s.ns, s.vhost, s.cfg.managementURL)
	s.install(t)
	s.dumpOnFailure(t)
	ctx := t.Context()

	caller := &hcpv1alpha1.Caller{}
	loadSample(t, "hcp_v1alpha1_caller.yaml", caller)
	caller.Namespace = s.ns
	caller.Spec.Broker = hcpv1alpha1.BrokerSpec{Vhost: s.vhost, CreateVhost: true, VhostDeletionPolicy: "delete"}
	if img := s.cfg.callerImage; img != "" && caller.Spec.Harness != nil {
		caller.Spec.Harness.Template.Spec.Containers[0].Image = img
	}
	if err := s.c.Create(ctx, caller); err != nil {
		t.Fatalf("create Caller %s: %v", caller.Name, err)
	}
	eventually(t, readyTimeout, "Caller "+caller.Name+" Ready", func(ctx context.Context) error {
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(caller), caller); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(caller.Status.Conditions, hcpv1alpha1.ConditionReady) {
			return fmt.Errorf("%s; pods: %s", conditions(caller.Status.Conditions), s.podsSummary(ctx, s.ns))
		}
		return nil
	})
	pod := (&samplesRun{suite: s, parent: t}).readyPod(t, "hcp.io/caller="+callerID)

	// The kit's callee identity, as the operator would make it.
	user := topology.Username(topology.RoleCallee, s.vhost, kitCalleeID)
	password := s.id + "-kit"
	perm := topology.CalleePermissions(kitCalleeID)
	queue := topology.CommandQueue(kitCalleeID)
	eventually(t, time.Minute, "the kit's user and command queue", func(context.Context) error {
		for what, f := range map[string]func() error{
			"user": func() error {
				_, err := s.broker.API.PutUser(user, rabbithole.UserSettings{Password: password, Tags: rabbithole.UserTags{}})
				return err
			},
			"permissions": func() error {
				_, err := s.broker.API.UpdatePermissionsIn(s.vhost, user, rabbithole.Permissions{Configure: perm.Configure, Write: perm.Write, Read: perm.Read})
				return err
			},
			"queue": func() error {
				_, err := s.broker.API.DeclareQueue(s.vhost, queue, rabbithole.QueueSettings{Type: "quorum", Durable: true})
				return err
			},
			"binding": func() error {
				_, err := s.broker.API.DeclareBinding(s.vhost, rabbithole.BindingInfo{Source: topology.CommandsExchange,
					Destination: queue, DestinationType: "queue", RoutingKey: topology.CommandRoutingKey(kitCalleeID)})
				return err
			},
		} {
			if err := f(); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
		return nil
	})
	t.Cleanup(func() { _ = s.broker.DeleteUsers(user) })
	mgmt, err := url.Parse(s.cfg.managementURL)
	if err != nil {
		t.Fatal(err)
	}
	mgmt.User = url.UserPassword(s.cfg.username, s.cfg.password)

	d := &sampleCallerDriver{hc: s.podHTTP(t, pod, 9090, 8080)}
	var rep conformance.Report
	noteFailure(t, func() string { return failedRows(&rep) })
	start := time.Now()
	rep = conformance.TestCaller(t, conformance.CallerConfig{
		AMQPURL: s.broker.AMQPURI(user, password, s.vhost), CalleeID: kitCalleeID, CallerID: callerID, Driver: d,
		DataClassification: "T1", ManagementURL: mgmt.String(), Timeout: time.Minute,
		RetryWait: 45 * time.Second, // the sidecar republishes an unanswered task_submit after 30 s
		Profile:   conformance.ProfileHCPOperator, Log: testWriter{t},
	})
	t.Logf("the caller kit ran in %s", time.Since(start).Round(100*time.Millisecond))
	if n := rep.Count(conformance.Pass); n != len(rep.Rows) || len(rep.Rows) != len(conformance.CallerChecks()) {
		t.Errorf("%d of %d checks passed (%d failed, %d skipped); want all %d", n, len(rep.Rows), rep.Count(conformance.Fail), rep.Count(conformance.Skip), len(conformance.CallerChecks()))
	}
	if path := os.Getenv("HCP_CONFORMANCE_CALLER_REPORT"); path != "" {
		var b strings.Builder
		_ = rep.Print(&b)
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	snap, err := d.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for id, l := range snap.Sessions {
		if l.CalleeID == kitCalleeID && (l.Duplicates > 0 || len(l.Problems) > 0) {
			t.Errorf("the sample app saw session %s with %d duplicates and problems %v", id, l.Duplicates, l.Problems)
		}
	}
}

// sampleCallerDriver drives the sample Caller's pod: its sidecar's API
// (127.0.0.1:9090) submits and aborts, its app's GET /received
// (127.0.0.1:8080) says what was processed. hc reaches the pod's loopback.
type sampleCallerDriver struct {
	hc *http.Client
}

func (d *sampleCallerDriver) post(ctx context.Context, path string, body any) error {
	js, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:9090"+path, strings.NewReader(string(js)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode/100 != 2 {
		out, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return fmt.Errorf("POST %s: HTTP %d: %s", path, resp.StatusCode, out)
	}
	return nil
}

func (d *sampleCallerDriver) Submit(ctx context.Context, task conformance.DriverTask) error {
	body := map[string]any{"callee_id": task.CalleeID, "capability": task.Capability, "intent": task.Intent, "inputs": task.Inputs}
	if task.DataClassification != "" {
		body["constraints"] = map[string]string{"data_classification": task.DataClassification}
	}
	return d.post(ctx, "/hcp/v1/tasks", body)
}

func (d *sampleCallerDriver) Abort(ctx context.Context, sessionID string) error {
	return d.post(ctx, "/hcp/v1/sessions/"+sessionID+"/abort", map[string]string{})
}

func (d *sampleCallerDriver) snapshot(ctx context.Context) (samplecaller.Snapshot, error) {
	var snap samplecaller.Snapshot
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:8080/received", nil)
	if err != nil {
		return snap, err
	}
	resp, err := d.hc.Do(req)
	if err != nil {
		return snap, err
	}
	defer func() { _ = resp.Body.Close() }()
	return snap, json.NewDecoder(resp.Body).Decode(&snap)
}

// Processed lists what the app received, session by session. The app
// keeps a duplicate out of its list (it counts it instead): the test
// checks those counts after the run.
func (d *sampleCallerDriver) Processed() []conformance.Processed {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	snap, err := d.snapshot(ctx)
	if err != nil {
		return nil
	}
	var out []conformance.Processed
	for id, l := range snap.Sessions {
		for _, m := range l.Messages {
			p := conformance.Processed{SessionID: id, MessageID: m.MessageID, Type: m.Type, Sequence: m.Sequence, EventType: m.EventType, Data: m.Data}
			if m.Type == "task_accepted" || m.Type == "task_rejected" {
				p.TaskMessageID = l.TaskMessageID
			}
			out = append(out, p)
		}
	}
	return out
}
