// Package apivalidation checks the hcp.io CRDs against a real API server
// (envtest: kube-apiserver and etcd built by hack/testbed-k8s.sh): the
// samples are accepted, every manifest under config/samples/invalid is
// refused with a message naming the field, ids and HCPSession specs cannot be
// changed, and defaults are applied. What the API server enforces here is
// the schema and the CEL rules in the CRDs; nothing of the operator runs.
package apivalidation

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	hcpv1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

var (
	env      *testbed.Env
	repoRoot string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // a cold build of the binaries takes ~9 min
	defer cancel()
	var err error
	if repoRoot, err = testbed.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env, err = testbed.Start(ctx, testbed.Options{
		WithoutTopologyCRDs: true, // only our own schemas are under test
		AddToScheme:         []func(*runtime.Scheme) error{hcpv1.AddToScheme},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "apivalidation:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "apivalidation: stop envtest:", err)
		}
	}()
	return m.Run()
}

// strict makes the API server refuse unknown fields instead of pruning them
// silently, so a typo in a sample fails here rather than being ignored.
var strict = client.FieldValidation(metav1.FieldValidationStrict)

// samples returns the files config/samples/Kustomization lists, in order.
func samples(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "config", "samples", "Kustomization"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("config/samples/Kustomization: %v", err)
	}
	if len(k.Resources) == 0 {
		t.Fatal("config/samples/Kustomization lists no resources")
	}
	files := make([]string, len(k.Resources))
	for i, r := range k.Resources {
		files[i] = filepath.Join(repoRoot, "config", "samples", r)
	}
	return files
}

// load reads a one-object manifest into namespace ns.
func load(t *testing.T, file, ns string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &u.Object); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if u.GetAPIVersion() != hcpv1.GroupVersion.String() {
		t.Fatalf("%s: apiVersion %q, want %q", file, u.GetAPIVersion(), hcpv1.GroupVersion)
	}
	u.SetNamespace(ns)
	return u
}

func TestSamplesAccepted(t *testing.T) {
	t.Parallel()
	ns := env.CreateNamespace(t, "samples-")
	for _, file := range samples(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			obj := load(t, file, ns)
			if err := env.Client.Create(t.Context(), obj.DeepCopy(), client.DryRunAll, strict); err != nil {
				t.Fatalf("server-side dry-run refused the sample: %v", err)
			}
			probe := obj.DeepCopy()
			if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), probe); !apierrors.IsNotFound(err) {
				t.Fatalf("dry-run persisted the object (get: %v)", err)
			}
			if err := env.Client.Create(t.Context(), obj, strict); err != nil {
				t.Fatalf("create refused the sample: %v", err)
			}
			// Read back through the typed API: the sample means what it says.
			typed, err := env.Scheme.New(obj.GroupVersionKind())
			if err != nil {
				t.Fatal(err)
			}
			if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), typed.(client.Object)); err != nil {
				t.Fatal(err)
			}
		})
	}

	// The spec's example, as the samples spell it.
	var callee hcpv1.Callee
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "lab-cvd"}, &callee); err != nil {
		t.Fatal(err)
	}
	if callee.ID() != "lab-cvd" || len(callee.Spec.Capabilities) < 2 || callee.Spec.Harness.Template.Spec.Containers[0].Image != "ghcr.io/hcp-io/hcp-sample-callee:latest" {
		t.Errorf("Callee sample is not the spec's lab-cvd: %+v", callee.Spec)
	}
	var caller hcpv1.Caller
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "alpha"}, &caller); err != nil {
		t.Fatal(err)
	}
	if caller.ID() != "alpha" || caller.Spec.Harness == nil || caller.Spec.Harness.Template.Spec.Containers[0].Image != "ghcr.io/hcp-io/hcp-sample-caller:latest" {
		t.Errorf("Caller sample is not the spec's alpha: %+v", caller.Spec)
	}
}

// TestKubectlDryRunSamples runs what a user runs: kubectl apply
// --dry-run=server with -k config/samples and with -f config/samples.
func TestKubectlDryRunSamples(t *testing.T) {
	t.Parallel()
	kubectl := filepath.Join(env.AssetsDir, "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("no kubectl in %s (hack/testbed-k8s.sh builds it): %v", env.AssetsDir, err)
	}
	for _, flag := range []string{"-k", "-f"} {
		t.Run(flag, func(t *testing.T) {
			ns := env.CreateNamespace(t, "kubectl-")
			cmd := exec.CommandContext(t.Context(), kubectl, "--kubeconfig", env.Kubeconfig, "apply", "--dry-run=server", "-n", ns, flag, filepath.Join(repoRoot, "config", "samples"))
			out, err := cmd.CombinedOutput()
			t.Logf("$ %s\n%s", strings.Join(cmd.Args, " "), out)
			if err != nil {
				t.Fatalf("kubectl apply --dry-run=server %s config/samples: %v", flag, err)
			}
			for _, want := range []string{"callee.hcp.io/lab-cvd created (server dry run)", "caller.hcp.io/alpha created (server dry run)", "capabilitypolicy.hcp.io/materials-lab created (server dry run)"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("kubectl output lacks %q", want)
				}
			}
		})
	}
}

// wants returns the "# want: <text>" lines of an invalid sample: substrings
// the API server's error must contain.
func wants(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if w, ok := strings.CutPrefix(sc.Text(), "# want: "); ok {
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no '# want: <message>' line saying how the API server refuses it", file)
	}
	return out
}

// TestInvalidSamplesRefused: every manifest under config/samples/invalid is
// refused, on dry-run and for real, with a message naming the field.
func TestInvalidSamplesRefused(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(repoRoot, "config", "samples", "invalid", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no invalid samples (%v)", err)
	}
	ns := env.CreateNamespace(t, "invalid-")
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			obj := load(t, file, ns)
			var err error
			for _, opts := range [][]client.CreateOption{{client.DryRunAll}, nil} {
				err = env.Client.Create(t.Context(), obj.DeepCopy(), opts...)
				if err == nil {
					t.Fatalf("accepted (options %v)", opts)
				}
				if !apierrors.IsInvalid(err) {
					t.Fatalf("refused, but not as invalid: %v", err)
				}
				for _, w := range wants(t, file) {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error does not contain %q:\n%v", w, err)
					}
				}
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestValidEdgeCases: values at the edges of what the schema allows are
// accepted, so the invalid samples fail for the reason they say.
func TestValidEdgeCases(t *testing.T) {
	t.Parallel()
	ns := env.CreateNamespace(t, "edges-")
	tests := []struct {
		name string
		obj  client.Object
	}{
		{"callee id with '_' and a dotted name", withCallee("lab.cvd.a", func(c *hcpv1.Callee) { c.Spec.CalleeID = "lab_cvd-a" })},
		{"63-character callee id", withCallee(strings.Repeat("a", 63), nil)},
		{"durations in days, fractions of seconds", withCallee("durations", func(c *hcpv1.Callee) {
			c.Spec.Capabilities[0].MaxDuration = "P1DT12H"
			c.Spec.Sessions.AbortTimeout = "PT0.5S"
			c.Spec.Sessions.TTLAfterFinished = "P7D"
		})},
		{"broker by connection Secret", withCallee("by-secret", func(c *hcpv1.Callee) {
			c.Spec.Broker.RabbitmqClusterReference = &hcpv1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: "rabbit"}}
		})},
		{"prefetch 1 and 100", withCaller("prefetch", func(c *hcpv1.Caller) {
			c.Spec.Consumer.Prefetch = 100
			c.Spec.Sidecar.Prefetch = ptr.To[int32](1)
		})},
		{"external caller: no harness", withCaller("external", nil)},
		{"sidecar env: Go runtime settings and a Secret's value", withCaller("sidecar-env", func(c *hcpv1.Caller) {
			c.Spec.Sidecar.Env = []corev1.EnvVar{{Name: "GODEBUG", Value: "schedtrace=2147483647"}, {Name: "HTTPS_PROXY",
				ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "proxy"}, Key: "url"}}}}
		})},
		{"policy: unnamed rules, selector callers, '*' ids", withPolicy("mixed", func(p *hcpv1.CapabilityPolicy) {
			p.Spec.Rules = append(p.Spec.Rules,
				hcpv1.PolicyRule{Callers: hcpv1.CallerMatch{IDs: []string{"*"}}, Capabilities: []string{"*"}, MaxRiskLevel: hcpv1.RiskR1},
				hcpv1.PolicyRule{Callers: hcpv1.CallerMatch{Selector: &metav1.LabelSelector{}}, Capabilities: []string{"cvd.read-*"}, MaxRiskLevel: hcpv1.RiskR1},
			)
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.obj.SetNamespace(ns)
			if err := env.Client.Create(t.Context(), tc.obj, strict); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
	}
}

// TestIDsImmutable: a callee or caller id cannot change, whether it is set
// explicitly or defaults to metadata.name. Changing an id is a two-step in
// any client: create the object, then update it; the update is refused.
func TestIDsImmutable(t *testing.T) {
	t.Parallel()
	ns := env.CreateNamespace(t, "ids-")
	tests := []struct {
		name    string
		obj     client.Object
		mutate  func(client.Object)
		wantErr string // "" when the update is allowed
	}{
		{
			name: "callee: change spec.calleeID", obj: withCallee("c1", func(c *hcpv1.Callee) { c.Spec.CalleeID = "lab-cvd" }),
			mutate: func(o client.Object) { o.(*hcpv1.Callee).Spec.CalleeID = "lab-xrd" }, wantErr: "spec.calleeID: Invalid value: spec.calleeID is immutable",
		},
		{
			name: "callee: set spec.calleeID other than the name", obj: withCallee("c2", nil),
			mutate: func(o client.Object) { o.(*hcpv1.Callee).Spec.CalleeID = "other" }, wantErr: "spec.calleeID: Invalid value: spec.calleeID is immutable",
		},
		{
			name: "callee: unset spec.calleeID that differs from the name", obj: withCallee("c3", func(c *hcpv1.Callee) { c.Spec.CalleeID = "lab-cvd" }),
			mutate: func(o client.Object) { o.(*hcpv1.Callee).Spec.CalleeID = "" }, wantErr: "spec.calleeID: Invalid value: spec.calleeID is immutable",
		},
		{
			name: "callee: spell out the defaulted id (no change)", obj: withCallee("c4", nil),
			mutate: func(o client.Object) { o.(*hcpv1.Callee).Spec.CalleeID = "c4" },
		},
		{
			name: "callee: other fields stay mutable", obj: withCallee("c5", nil),
			mutate: func(o client.Object) { o.(*hcpv1.Callee).Spec.Harness.Replicas = ptr.To[int32](3) },
		},
		{
			name: "callee: spec.broker is immutable", obj: withCallee("c6", nil),
			mutate: func(o client.Object) { o.(*hcpv1.Callee).Spec.Broker.Vhost = "/other" }, wantErr: "spec.broker: Invalid value: spec.broker is immutable except spec.broker.tls; delete and recreate the Callee to move it",
		},
		{
			name: "callee: spec.broker.createVhost is immutable", obj: withCallee("c7", nil),
			mutate: func(o client.Object) { o.(*hcpv1.Callee).Spec.Broker.CreateVhost = true }, wantErr: "spec.broker is immutable except spec.broker.tls",
		},
		{
			name: "callee: spec.broker.tls may be added", obj: withCallee("c8", nil),
			mutate: func(o client.Object) {
				o.(*hcpv1.Callee).Spec.Broker.TLS = &hcpv1.BrokerTLS{CASecret: "rmq-ca", ClientCertSecret: "c8-amqp"}
			},
		},
		{
			name: "callee: spec.broker.tls may change and go", obj: withCallee("c9", func(c *hcpv1.Callee) {
				c.Spec.Broker.TLS = &hcpv1.BrokerTLS{CASecret: "rmq-ca"}
			}),
			mutate: func(o client.Object) { o.(*hcpv1.Callee).Spec.Broker.TLS = nil },
		},
		{
			name: "callee: spec.broker.tls with another change", obj: withCallee("c10", nil),
			mutate: func(o client.Object) {
				c := o.(*hcpv1.Callee)
				c.Spec.Broker.TLS = &hcpv1.BrokerTLS{}
				c.Spec.Broker.VhostDeletionPolicy = "delete"
			},
			wantErr: "spec.broker is immutable except spec.broker.tls",
		},
		{
			name: "caller: change spec.callerID", obj: withCaller("r1", func(c *hcpv1.Caller) { c.Spec.CallerID = "alpha" }),
			mutate: func(o client.Object) { o.(*hcpv1.Caller).Spec.CallerID = "beta" }, wantErr: "spec.callerID: Invalid value: spec.callerID is immutable",
		},
		{
			name: "caller: set spec.callerID other than the name", obj: withCaller("r2", nil),
			mutate: func(o client.Object) { o.(*hcpv1.Caller).Spec.CallerID = "beta" }, wantErr: "spec.callerID: Invalid value: spec.callerID is immutable",
		},
		{
			name: "caller: spell out the defaulted id (no change)", obj: withCaller("r3", nil),
			mutate: func(o client.Object) { o.(*hcpv1.Caller).Spec.CallerID = "r3" },
		},
		{
			name: "caller: spec.broker is immutable", obj: withCaller("r4", nil),
			mutate: func(o client.Object) {
				o.(*hcpv1.Caller).Spec.Broker.RabbitmqClusterReference = &hcpv1.RabbitmqClusterReference{Name: "other"}
			},
			wantErr: "spec.broker is immutable except spec.broker.tls; delete and recreate the Caller to move it",
		},
		{
			name: "caller: spec.broker.tls may be added", obj: withCaller("r5", nil),
			mutate: func(o client.Object) { o.(*hcpv1.Caller).Spec.Broker.TLS = &hcpv1.BrokerTLS{CASecret: "rmq-ca"} },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.obj.SetNamespace(ns)
			if err := env.Client.Create(t.Context(), tc.obj); err != nil {
				t.Fatalf("create: %v", err)
			}
			tc.mutate(tc.obj)
			err := env.Client.Update(t.Context(), tc.obj)
			checkUpdate(t, err, tc.wantErr)
		})
	}
}

// TestHCPSessionSpecImmutable: the spec records what was asked and never
// changes, except abortRequested, which may go from false to true only.
func TestHCPSessionSpecImmutable(t *testing.T) {
	t.Parallel()
	ns := env.CreateNamespace(t, "sessions-")
	tests := []struct {
		name    string
		aborted bool // create with abortRequested true
		mutate  func(*hcpv1.HCPSessionSpec)
		wantErr string
		alsoErr string
	}{
		{name: "abortRequested false to true", mutate: func(s *hcpv1.HCPSessionSpec) { s.AbortRequested = true }},
		{name: "abortRequested true to false", aborted: true, mutate: func(s *hcpv1.HCPSessionSpec) { s.AbortRequested = false }, wantErr: "spec.abortRequested: Invalid value: spec.abortRequested cannot be unset once true"},
		{name: "abortRequested true stays true", aborted: true, mutate: func(*hcpv1.HCPSessionSpec) {}},
		{name: "sessionID", mutate: func(s *hcpv1.HCPSessionSpec) { s.SessionID = "11111111-2222-4333-8444-555555555555" }, wantErr: `spec.sessionID: Invalid value: "11111111-2222-4333-8444-555555555555": spec.sessionID is immutable`},
		{name: "calleeID", mutate: func(s *hcpv1.HCPSessionSpec) { s.CalleeID = "lab-xrd" }, wantErr: `spec.calleeID: Invalid value: "lab-xrd": spec.calleeID is immutable`},
		{name: "callerID", mutate: func(s *hcpv1.HCPSessionSpec) { s.CallerID = "beta" }, wantErr: `spec.callerID: Invalid value: "beta": spec.callerID is immutable`},
		{name: "capability", mutate: func(s *hcpv1.HCPSessionSpec) { s.Capability = "cvd.read-telemetry" }, wantErr: `spec.capability: Invalid value: "cvd.read-telemetry": spec.capability is immutable`},
		{name: "taskMessageID", mutate: func(s *hcpv1.HCPSessionSpec) { s.TaskMessageID = "11111111-2222-4333-8444-555555555555" }, wantErr: `spec.taskMessageID: Invalid value: "11111111-2222-4333-8444-555555555555": spec.taskMessageID is immutable`},
		{name: "riskLevel changed", mutate: func(s *hcpv1.HCPSessionSpec) { s.RiskLevel = hcpv1.RiskR5 }, wantErr: "spec.riskLevel: Invalid value: spec.riskLevel is immutable"},
		{name: "riskLevel removed", mutate: func(s *hcpv1.HCPSessionSpec) { s.RiskLevel = "" }, wantErr: "spec.riskLevel: Invalid value: spec.riskLevel is immutable"},
		{name: "dataClassification", mutate: func(s *hcpv1.HCPSessionSpec) { s.DataClassification = hcpv1.DataT4 }, wantErr: "spec.dataClassification: Invalid value: spec.dataClassification is immutable"},
		{name: "maxDuration", mutate: func(s *hcpv1.HCPSessionSpec) { s.MaxDuration = "PT1H" }, wantErr: "spec.maxDuration: Invalid value: spec.maxDuration is immutable"},
		{name: "intent added", mutate: func(s *hcpv1.HCPSessionSpec) { s.Intent = "something else" }, wantErr: "spec.intent: Invalid value: spec.intent is immutable"},
		{name: "issuedAt changed", mutate: func(s *hcpv1.HCPSessionSpec) { s.IssuedAt = &metav1.Time{Time: s.IssuedAt.Add(time.Hour)} }, wantErr: "spec.issuedAt: Invalid value: spec.issuedAt is immutable"},
		{name: "issuedAt removed", mutate: func(s *hcpv1.HCPSessionSpec) { s.IssuedAt = nil }, wantErr: "spec.issuedAt: Invalid value: spec.issuedAt is immutable"},
		{name: "two changes, two messages", mutate: func(s *hcpv1.HCPSessionSpec) { s.Capability = "x"; s.RiskLevel = hcpv1.RiskR1 },
			wantErr: "spec.capability: Invalid value: \"x\": spec.capability is immutable", alsoErr: "spec.riskLevel: Invalid value: spec.riskLevel is immutable"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("9d1f7c8a-2b3e-4c5d-8e9f-%012x", i)
			s := &hcpv1.HCPSession{
				ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: ns},
				Spec: hcpv1.HCPSessionSpec{
					SessionID: id, CalleeID: "lab-cvd", CallerID: "alpha", Capability: "cvd.run-synthesis",
					TaskMessageID: "0b7d8b8e-8d0b-4e5a-9f7c-3a1d2c4b5e6f", RiskLevel: hcpv1.RiskR3, DataClassification: hcpv1.DataT2,
					MaxDuration: "PT72H", AbortRequested: tc.aborted, IssuedAt: &metav1.Time{Time: time.Date(2026, 1, 15, 8, 30, 0, 0, time.UTC)},
				},
			}
			if err := env.Client.Create(t.Context(), s); err != nil {
				t.Fatalf("create: %v", err)
			}
			tc.mutate(&s.Spec)
			err := env.Client.Update(t.Context(), s)
			checkUpdate(t, err, tc.wantErr)
			if tc.alsoErr != "" {
				checkUpdate(t, err, tc.alsoErr)
			}
		})
	}

	// Status is written through its subresource, whatever the spec rules.
	t.Run("status is writable", func(t *testing.T) {
		id := "9d1f7c8a-2b3e-4c5d-8e9f-ffffffffffff"
		s := &hcpv1.HCPSession{
			ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: ns},
			Spec:       hcpv1.HCPSessionSpec{SessionID: id, CalleeID: "lab-cvd", CallerID: "alpha", Capability: "cvd.run-synthesis", TaskMessageID: id},
		}
		if err := env.Client.Create(t.Context(), s); err != nil {
			t.Fatalf("create: %v", err)
		}
		s.Status.State = hcpv1.SessionRunning
		s.Status.Progress = &hcpv1.SessionProgress{Percent: ptr.To[int32](42)}
		if err := env.Client.Status().Update(t.Context(), s); err != nil {
			t.Fatalf("status update: %v", err)
		}
		s.Status.Progress.Percent = ptr.To[int32](142)
		err := env.Client.Status().Update(t.Context(), s)
		checkUpdate(t, err, "status.progress.percent: Invalid value: 142")
	})
}

// TestDefaults: what a user leaves out, the API server fills in. The objects
// are written as a user writes YAML (parents omitted, not sent as {}), and
// read back untyped so that "absent" and "zero" differ.
func TestDefaults(t *testing.T) {
	t.Parallel()
	ns := env.CreateNamespace(t, "defaults-")
	objects := map[string]string{
		"Callee/minimal": `
apiVersion: hcp.io/v1alpha1
kind: Callee
metadata: {name: minimal}
spec:
  capabilities: [{name: cvd.read-telemetry, riskLevel: R1, dataClassification: T1}]
  harness:
    template: {spec: {containers: [{name: harness, image: ghcr.io/hcp-io/hcp-sample-callee:latest}]}}`,
		"Callee/with-sidecar": `
apiVersion: hcp.io/v1alpha1
kind: Callee
metadata: {name: with-sidecar}
spec:
  broker: {createVhost: true}
  capabilities: [{name: cvd.read-telemetry, riskLevel: R1, dataClassification: T1}]
  harness:
    template: {spec: {containers: [{name: harness, image: ghcr.io/hcp-io/hcp-sample-callee:latest}]}}
  sidecar: {prefetch: 5}
  sessions: {maxConcurrent: 3}`,
		"Caller/minimal": `
apiVersion: hcp.io/v1alpha1
kind: Caller
metadata: {name: minimal}
spec: {}`,
		"Caller/some-queue-settings": `
apiVersion: hcp.io/v1alpha1
kind: Caller
metadata: {name: some-queue-settings}
spec:
  eventQueue: {maxLength: 5}
  consumer: {}`,
	}
	stored := map[string]map[string]any{}
	for name, manifest := range objects {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(manifest), &u.Object); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		u.SetNamespace(ns)
		if err := env.Client.Create(t.Context(), u, strict); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(u.GroupVersionKind())
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(u), got); err != nil {
			t.Fatal(err)
		}
		stored[name] = got.Object
	}
	tests := []struct {
		obj, path string
		want      any
	}{
		{"Callee/minimal", "spec.broker.vhost", "/hcp"},
		{"Callee/minimal", "spec.broker.vhostDeletionPolicy", "retain"},
		{"Callee/minimal", "spec.harness.replicas", int64(1)},
		{"Callee/minimal", "spec.harness.port", int64(8080)},
		{"Callee/minimal", "spec.sessions.defaultMaxDuration", "PT1H"},
		{"Callee/minimal", "spec.sessions.abortTimeout", "PT30S"},
		{"Callee/minimal", "spec.sessions.statusUpdateInterval", "PT1S"},
		{"Callee/minimal", "spec.sessions.ttlAfterFinished", "P1D"},
		{"Callee/with-sidecar", "spec.broker.vhost", "/hcp"},
		{"Callee/with-sidecar", "spec.broker.vhostDeletionPolicy", "retain"},
		{"Callee/with-sidecar", "spec.sidecar.logLevel", "info"},
		{"Callee/with-sidecar", "spec.sidecar.prefetch", int64(5)},
		{"Callee/with-sidecar", "spec.sessions.maxConcurrent", int64(3)},
		{"Callee/with-sidecar", "spec.sessions.defaultMaxDuration", "PT1H"},
		{"Caller/minimal", "spec.broker.vhost", "/hcp"},
		{"Caller/minimal", "spec.eventQueue.messageTTL", "PT24H"},
		{"Caller/minimal", "spec.eventQueue.maxLength", int64(100000)},
		{"Caller/minimal", "spec.eventQueue.overflow", "drop-head"},
		{"Caller/minimal", "spec.consumer.prefetch", int64(10)},
		{"Caller/some-queue-settings", "spec.eventQueue.maxLength", int64(5)},
		{"Caller/some-queue-settings", "spec.eventQueue.messageTTL", "PT24H"},
		{"Caller/some-queue-settings", "spec.eventQueue.overflow", "drop-head"},
		{"Caller/some-queue-settings", "spec.consumer.prefetch", int64(10)},
		// Not observed yet (below metadata.generation): kstatus reads a new
		// object as InProgress until the operator writes its status.
		{"Callee/minimal", "status.observedGeneration", int64(0)},
		{"Caller/minimal", "status.observedGeneration", int64(0)},
	}
	for _, tc := range tests {
		t.Run(tc.obj+"/"+tc.path, func(t *testing.T) {
			got, found, err := unstructured.NestedFieldNoCopy(stored[tc.obj], strings.Split(tc.path, ".")...)
			if err != nil || !found {
				t.Fatalf("%s not set (err %v); stored spec: %v", tc.path, err, stored[tc.obj]["spec"])
			}
			if got != tc.want {
				t.Errorf("%s = %#v, want %#v", tc.path, got, tc.want)
			}
		})
	}
	// No default where none is documented: the sidecar prefetch of a Callee
	// comes from the manager when unset, and a Caller is external unless it
	// has a harness.
	for obj, path := range map[string]string{"Callee/minimal": "spec.sidecar.prefetch", "Caller/minimal": "spec.harness"} {
		if v, found, _ := unstructured.NestedFieldNoCopy(stored[obj], strings.Split(path, ".")...); found {
			t.Errorf("%s %s defaulted to %v", obj, path, v)
		}
	}
}

func checkUpdate(t *testing.T, err error, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Fatalf("update refused: %v", err)
	case wantErr == "":
	case err == nil:
		t.Fatalf("update accepted, want it refused with %q", wantErr)
	case !apierrors.IsInvalid(err):
		t.Fatalf("update refused, but not as invalid: %v", err)
	case !strings.Contains(err.Error(), wantErr):
		t.Fatalf("error does not contain %q:\n%v", wantErr, err)
	default:
		t.Logf("refused: %v", err)
	}
}

func withCallee(name string, mutate func(*hcpv1.Callee)) *hcpv1.Callee {
	c := &hcpv1.Callee{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: hcpv1.CalleeSpec{
			Capabilities: []hcpv1.Capability{{Name: "cvd.read-telemetry", RiskLevel: hcpv1.RiskR1, DataClassification: hcpv1.DataT1}},
			Harness:      hcpv1.HarnessSpec{Template: corev1PodTemplate("ghcr.io/hcp-io/hcp-sample-callee:latest")},
		},
	}
	if mutate != nil {
		mutate(c)
	}
	return c
}

func withCaller(name string, mutate func(*hcpv1.Caller)) *hcpv1.Caller {
	c := &hcpv1.Caller{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if mutate != nil {
		mutate(c)
	}
	return c
}

func withPolicy(name string, mutate func(*hcpv1.CapabilityPolicy)) *hcpv1.CapabilityPolicy {
	p := &hcpv1.CapabilityPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: hcpv1.CapabilityPolicySpec{Rules: []hcpv1.PolicyRule{{
			Name: "alpha", Callers: hcpv1.CallerMatch{IDs: []string{"alpha"}}, Capabilities: []string{"cvd.*"}, MaxRiskLevel: hcpv1.RiskR3,
		}}},
	}
	if mutate != nil {
		mutate(p)
	}
	return p
}

func corev1PodTemplate(image string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "harness", Image: image}}}}
}

// TestKEDASample: config/samples/keda/scaledobject.yaml scales the sample
// Callee through its /scale subresource on the depth of that Callee's
// command queue in its vhost, with the credentials of its
// TriggerAuthentication.
func TestKEDASample(t *testing.T) {
	callee := &hcpv1.Callee{}
	raw, err := os.ReadFile(filepath.Join(repoRoot, "config/samples/hcp_v1alpha1_callee.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, callee); err != nil {
		t.Fatal(err)
	}
	raw, err = os.ReadFile(filepath.Join(repoRoot, "config/samples/keda/scaledobject.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]*unstructured.Unstructured{}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("%v in\n%s", err, doc)
		}
		objs[u.GetKind()] = u
	}
	so, auth, secret := objs["ScaledObject"], objs["TriggerAuthentication"], objs["Secret"]
	if so == nil || auth == nil || secret == nil {
		t.Fatalf("want a ScaledObject, a TriggerAuthentication and a Secret, got %v", objs)
	}
	str := func(u *unstructured.Unstructured, path ...string) string {
		v, _, _ := unstructured.NestedString(u.Object, path...)
		return v
	}
	if str(so, "spec", "scaleTargetRef", "apiVersion") != hcpv1.GroupVersion.String() || str(so, "spec", "scaleTargetRef", "kind") != "Callee" ||
		str(so, "spec", "scaleTargetRef", "name") != callee.Name {
		t.Errorf("scaleTargetRef %v, want the sample Callee %s", so.Object["spec"], callee.Name)
	}
	triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	if len(triggers) != 1 {
		t.Fatalf("%d triggers, want 1", len(triggers))
	}
	tr := &unstructured.Unstructured{Object: triggers[0].(map[string]any)}
	if str(tr, "type") != "rabbitmq" || str(tr, "metadata", "queueName") != topology.CommandQueue(callee.ID()) ||
		str(tr, "metadata", "vhostName") != callee.Spec.Broker.Vhost || str(tr, "authenticationRef", "name") != auth.GetName() {
		t.Errorf("trigger %v, want rabbitmq on %s in %s via %s", tr.Object, topology.CommandQueue(callee.ID()), callee.Spec.Broker.Vhost, auth.GetName())
	}
	refs, _, _ := unstructured.NestedSlice(auth.Object, "spec", "secretTargetRef")
	if len(refs) != 1 || refs[0].(map[string]any)["name"] != secret.GetName() || refs[0].(map[string]any)["parameter"] != "host" {
		t.Errorf("TriggerAuthentication %v, want host from Secret %s", refs, secret.GetName())
	}
}
