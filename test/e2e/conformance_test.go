//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
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
	"github.com/hcp-io/hcp-operator/pkg/conformance"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
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
		Log:                testWriter{t},
	}
	start := time.Now()
	rep := conformance.Test(t, cfg)
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
			"--data-class", cfg.DataClassification, "--management-url", mgmt.String(), "--quiet"}
		var stdout, stderr strings.Builder
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		shown := strings.ReplaceAll(strings.Join(args, " "), mgmt.String(), mgmt.Redacted())
		t.Logf("hcp-conformance %s\n%s%s", shown, stdout.String(), stderr.String())
		if err != nil {
			t.Errorf("hcp-conformance: %v (want exit status 0)", err)
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
	// told wrong things: another callee user (MSG-8), a capability the
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
			"--timeout", "20s", "--quiet"}
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
