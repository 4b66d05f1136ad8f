//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// The samples' ids (config/samples).
const (
	calleeID = "lab-cvd"
	callerID = "alpha"
	// synthesis is the sample capability the sample policy admits.
	synthesis = "cvd.run-synthesis"
	// bakeout is added to the sample Callee and admitted by no rule of the
	// sample policy ("cvd.*"): a task for it is not_authorized.
	bakeout = "maint.bakeout"
	// concurrency replaces the samples' session limits (the policy admits
	// one session at a time, the Callee runs two) so that sessions can run
	// concurrently.
	concurrency = 10
	// The sidecar's local API and the sample caller app's port in the
	// caller pod.
	sidecarPort = 9090
	appPort     = 8080
)

// TestHCP is the whole product on a cluster, in order: install from the
// chart, the samples Ready, their topology on the broker, concurrent
// sessions, rejections, task_submits stamped at other precisions, an
// abort, a timeout, and the broker cleaned up as the Callee and then the
// Caller go. Each step needs the previous ones.
func TestHCP(t *testing.T) {
	s := newSuite(t)
	t.Logf("run %s: samples in namespace %s, manager (release %s) in %s, vhost %s; broker %s (pods: %s)",
		s.id, s.ns, release, s.opNS, s.vhost, s.cfg.managementURL, s.cfg.amqpURL)
	s.install(t)
	s.dumpOnFailure(t)

	r := &samplesRun{suite: s, parent: t}
	for _, step := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"SamplesReady", r.samplesReady},
		{"Node", r.node},
		{"NetworkPolicy", r.networkPolicy},
		{"BrokerTopology", r.brokerTopology},
		{"ConcurrentSessions", r.concurrentSessions},
		{"Rejections", r.rejections},
		{"Timestamps", r.timestamps},
		{"Abort", r.abort},
		{"Timeout", r.timeout},
		{"Chaos", r.chaos},
		{"DeleteCallee", r.deleteCallee},
		{"DeleteCaller", r.deleteCaller},
	} {
		start := time.Now()
		ok := t.Run(step.name, step.f)
		record(step.name, time.Since(start))
		if !ok {
			t.Fatalf("step %s failed; the later steps need it", step.name)
		}
	}
}

// samplesRun is the state the steps share.
type samplesRun struct {
	*suite
	// parent is TestHCP's T: pod clients live as long as it.
	parent *testing.T

	callee *hcpv1alpha1.Callee
	caller *hcpv1alpha1.Caller
	policy *hcpv1alpha1.CapabilityPolicy

	calleePod, callerPod *corev1.Pod
	// sidecar is the caller sidecar's local API; app is the sample caller
	// app (GET /received).
	sidecar *samplecaller.Client
	app     *http.Client
	// stopCallerForward ends the port-forward behind sidecar and app when
	// the chaos step opened it (connectCaller).
	stopCallerForward func()
	history           *history
	// stepLog is the file on the node where the sample harness records
	// every step it executes (observe_test.go); "" on an existing cluster.
	stepLog string
	// receiptLog is the file on the node where the sample caller apps
	// record every message they acknowledge; "" on an existing cluster.
	receiptLog string
}

// loadSample decodes config/samples/<file> into obj.
func loadSample(t *testing.T, file string, obj any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(cfg.root, "config", "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		t.Fatalf("config/samples/%s: %v", file, err)
	}
}

// samplesReady applies the samples (Callee lab-cvd, Caller alpha,
// CapabilityPolicy materials-lab) in the run's namespace with kubectl
// apply --server-side and waits until they are Ready with their harness
// pods running. Changes to the samples: the run's vhost (declared by the
// operator, deleted with the last user), session limits that allow
// concurrent sessions, and one more capability that the policy does not
// admit.
func (r *samplesRun) samplesReady(t *testing.T) {
	ctx := t.Context()
	r.callee, r.caller, r.policy = &hcpv1alpha1.Callee{}, &hcpv1alpha1.Caller{}, &hcpv1alpha1.CapabilityPolicy{}
	loadSample(t, "hcp_v1alpha1_callee.yaml", r.callee)
	loadSample(t, "hcp_v1alpha1_caller.yaml", r.caller)
	loadSample(t, "hcp_v1alpha1_capabilitypolicy.yaml", r.policy)
	if r.callee.Name != calleeID || r.caller.Name != callerID {
		t.Fatalf("the samples are Callee %s and Caller %s; the suite expects %s and %s", r.callee.Name, r.caller.Name, calleeID, callerID)
	}
	broker := hcpv1alpha1.BrokerSpec{Vhost: r.vhost, CreateVhost: true, VhostDeletionPolicy: "delete"}
	r.callee.Namespace, r.caller.Namespace, r.policy.Namespace = r.ns, r.ns, r.ns
	r.callee.Spec.Broker, r.caller.Spec.Broker = broker, broker
	r.callee.Spec.Capabilities = append(r.callee.Spec.Capabilities, hcpv1alpha1.Capability{
		Name: bakeout, Description: "Bake out the reactor chamber (maintenance).",
		RiskLevel: hcpv1alpha1.RiskR2, DataClassification: hcpv1alpha1.DataT1, MaxDuration: "PT1H",
	})
	r.callee.Spec.Sessions.MaxConcurrent = new(int32(concurrency))
	for i := range r.policy.Spec.Rules {
		r.policy.Spec.Rules[i].MaxConcurrentSessions = new(int32(concurrency))
	}
	if img := r.cfg.calleeImage; img != "" {
		r.callee.Spec.Harness.Template.Spec.Containers[0].Image = img
	}
	if img := r.cfg.callerImage; img != "" && r.caller.Spec.Harness != nil {
		r.caller.Spec.Harness.Template.Spec.Containers[0].Image = img
	}
	r.recordOnNode(t)
	var manifests []byte
	for _, o := range []client.Object{r.callee, r.caller, r.policy} {
		y, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		manifests = append(append(manifests, "---\n"...), y...)
	}
	out, err := r.apply(ctx, manifests, "-n", r.ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl apply --server-side -n %s:\n%s", r.ns, indent(out))

	eventually(t, readyTimeout, "Callee, Caller and CapabilityPolicy Ready", func(ctx context.Context) error {
		for _, o := range []client.Object{r.callee, r.caller, r.policy} {
			if err := r.c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
				return err
			}
		}
		for _, x := range []struct {
			what  string
			conds []metav1.Condition
		}{{"Callee " + calleeID, r.callee.Status.Conditions}, {"Caller " + callerID, r.caller.Status.Conditions}, {"CapabilityPolicy " + r.policy.Name, r.policy.Status.Conditions}} {
			if !meta.IsStatusConditionTrue(x.conds, hcpv1alpha1.ConditionReady) {
				return fmt.Errorf("%s: %s; pods: %s", x.what, conditions(x.conds), r.podsSummary(ctx, r.ns))
			}
		}
		return nil
	})
	out, _ = r.kubectl(ctx, nil, "get", "callees,callers,capabilitypolicies", "-n", r.ns, "-o", "wide")
	t.Logf("kubectl get callees,callers,capabilitypolicies:\n%s", indent(out))

	// What status says matches the design's names.
	cs := r.callee.Status
	if cs.CalleeID != calleeID || cs.Vhost != r.vhost || cs.CommandQueue != topology.CommandQueue(calleeID) ||
		cs.Username != topology.Username(topology.RoleCallee, r.vhost, calleeID) || cs.CredentialsSecret == "" ||
		!strings.Contains(cs.TokenPublicKey, "BEGIN PUBLIC KEY") || cs.ReadyReplicas != 1 {
		t.Errorf("Callee status: %+v", cs)
	}
	if ks := r.caller.Status; ks.EventQueue != topology.EventQueue(callerID) || ks.CredentialsSecret == "" {
		t.Errorf("Caller status: %+v", ks)
	}
	if ps := r.policy.Status; !slices.Equal(ps.MatchedCallees, []string{calleeID}) || !slices.Equal(ps.MatchedCallers, []string{callerID}) {
		t.Errorf("CapabilityPolicy status: matchedCallees %v matchedCallers %v, want [%s] [%s]", ps.MatchedCallees, ps.MatchedCallers, calleeID, callerID)
	}

	r.calleePod = r.readyPod(t, "hcp.io/callee="+calleeID)
	r.callerPod = r.readyPod(t, "hcp.io/caller="+callerID)
	for _, p := range []*corev1.Pod{r.calleePod, r.callerPod} {
		var names []string
		for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			names = append(names, c.Name+"="+c.Image)
		}
		t.Logf("pod %s (IP %s): %s", p.Name, p.Status.PodIP, strings.Join(names, " "))
		// The sidecar is a native sidecar: the first init container, restarted
		// always, so it starts before and stops after the harness.
		init := p.Spec.InitContainers
		if len(p.Spec.Containers) != 1 || len(init) == 0 || init[0].Name != "hcp-sidecar" ||
			init[0].RestartPolicy == nil || *init[0].RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("pod %s: containers %v, want the harness and the injected native hcp-sidecar", p.Name, names)
		}
	}
	hc := r.podHTTP(r.parent, r.callerPod, sidecarPort, appPort)
	r.sidecar = samplecaller.NewClient(fmt.Sprintf("http://127.0.0.1:%d", sidecarPort))
	r.sidecar.HTTP = hc
	r.app = hc
	// The sidecar's local API and the app answer in the pod.
	eventually(t, 30*time.Second, "the caller sidecar's API and the app answer", func(ctx context.Context) error {
		if err := r.get(ctx, fmt.Sprintf("http://127.0.0.1:%d/hcp/v1/tasks", sidecarPort), nil); err != nil {
			return err
		}
		_, err := r.received(ctx)
		return err
	})
	r.history = r.watchSessions(r.parent)
}

// readyPod waits for the one Ready pod with the label and returns it.
func (r *samplesRun) readyPod(t *testing.T, selector string) *corev1.Pod {
	t.Helper()
	sel, err := metav1.ParseToLabelSelector(selector)
	if err != nil {
		t.Fatal(err)
	}
	ls, _ := metav1.LabelSelectorAsSelector(sel)
	var pod *corev1.Pod
	eventually(t, readyTimeout, "a Ready pod "+selector, func(ctx context.Context) error {
		pods := &corev1.PodList{}
		if err := r.c.List(ctx, pods, client.InNamespace(r.ns), client.MatchingLabelsSelector{Selector: ls}); err != nil {
			return err
		}
		var ready []*corev1.Pod
		for i := range pods.Items {
			p := &pods.Items[i]
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
					ready = append(ready, p)
				}
			}
		}
		if len(ready) != 1 {
			return fmt.Errorf("%d Ready pods: %s", len(ready), r.podsSummary(ctx, r.ns))
		}
		pod = ready[0]
		return nil
	})
	return pod
}

func conditions(conds []metav1.Condition) string {
	if len(conds) == 0 {
		return "no conditions yet"
	}
	var parts []string
	for _, c := range conds {
		parts = append(parts, fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, ", ")
}

// get GETs url in the caller pod and decodes the JSON answer into out.
func (r *samplesRun) get(ctx context.Context, url string, out any) error {
	return getJSON(ctx, r.app, url, out)
}

// getJSON GETs url with hc and decodes the JSON answer into out.
func getJSON(ctx context.Context, hc *http.Client, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// received is what the sample caller app got (its GET /received).
func (r *samplesRun) received(ctx context.Context) (samplecaller.Snapshot, error) {
	var snap samplecaller.Snapshot
	err := r.get(ctx, fmt.Sprintf("http://127.0.0.1:%d/received", appPort), &snap)
	return snap, err
}

// submit submits a task through the caller sidecar and checks its answer:
// pending, with the session id the callee will derive.
func (r *samplesRun) submit(t *testing.T, capability, intent, inputs string, c samplecaller.Constraints) samplecaller.Task {
	t.Helper()
	if c.DataClassification == "" {
		c.DataClassification = string(task.T1)
	}
	tk, err := r.sidecar.Submit(t.Context(), samplecaller.SubmitRequest{
		CalleeID: calleeID, Capability: capability, Intent: intent, Inputs: json.RawMessage(inputs), Constraints: c,
	})
	if err != nil {
		t.Fatalf("POST /hcp/v1/tasks (%s): %v", capability, err)
	}
	if want := topology.SessionID(calleeID, callerID, tk.MessageID); tk.SessionID != want || tk.Status != "pending" {
		t.Fatalf("submit answered %+v, want status pending and session_id %s", tk, want)
	}
	return tk
}

// session reads an HCPSession.
func (r *samplesRun) session(ctx context.Context, id string) (*hcpv1alpha1.HCPSession, error) {
	hs := &hcpv1alpha1.HCPSession{}
	return hs, r.c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: id}, hs)
}
