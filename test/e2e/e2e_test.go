//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/internal/testbed"
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
	r.recordSteps(t)
	if img := r.cfg.callerImage; img != "" && r.caller.Spec.Harness != nil {
		r.caller.Spec.Harness.Template.Spec.Containers[0].Image = img
	}
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

// brokerTopology reads the broker through its management API: the vhost's
// queues with exactly their arguments, the exchanges, exactly the
// bindings, the two users without tags and their permissions, and one
// consumer on each queue (the sidecars are connected).
func (r *samplesRun) brokerTopology(t *testing.T) {
	b := r.broker
	eventually(t, time.Minute, "the sidecars consuming (one consumer per queue)", func(context.Context) error {
		for _, q := range []string{topology.CommandQueue(calleeID), topology.EventQueue(callerID)} {
			info, err := b.Queue(r.vhost, q)
			if err != nil {
				return fmt.Errorf("queue %s: %w", q, err)
			}
			if info.Consumers != 1 {
				return fmt.Errorf("queue %s has %d consumers", q, info.Consumers)
			}
		}
		return nil
	})

	// Expected declaration: quorum queues, and a single active consumer
	// on the event queue, nothing else. The limits are each queue's
	// policy (they can change on a live queue): the sample's, passed
	// through, plus the operator's fixed choices (DESIGN section 3):
	// reject-publish on a length-limited command queue; on the event
	// queue the sample's TTL, the default length limit and drop-head.
	cq := r.callee.Spec.CommandQueue
	ttl, err := task.ParseDuration(string(r.caller.Spec.EventQueue.MessageTTL))
	if err != nil {
		t.Fatal(err)
	}
	wantQueues := map[string]map[string]any{
		topology.CommandQueue(calleeID): {"x-queue-type": "quorum"},
		topology.EventQueue(callerID):   {"x-queue-type": "quorum", "x-single-active-consumer": true},
		// The dead-letter queues (resource/deadletter.go).
		topology.DeadLetterQueue(topology.CommandQueue(calleeID)): {"x-queue-type": "quorum"},
		topology.DeadLetterQueue(topology.EventQueue(callerID)):   {"x-queue-type": "quorum"},
	}
	wantPolicies := map[string]map[string]any{
		"hcp-limits." + topology.CommandQueue(calleeID): {"max-length": float64(*cq.MaxLength), "delivery-limit": float64(*cq.DeliveryLimit), "overflow": "reject-publish",
			resource.PolicyDeadLetterExchange: topology.DeadLetterExchange},
		// The sample's TTL is the default: the vhost's default policy.
		resource.DefaultEventLimitsPolicyName: {"message-ttl": float64(ttl.Milliseconds()), "max-length": float64(100000), "overflow": "drop-head",
			resource.PolicyDeadLetterExchange: topology.DeadLetterExchange},
		resource.DefaultCommandLimitsPolicyName: {resource.PolicyDeadLetterExchange: topology.DeadLetterExchange},
		resource.DeadLetterLimitsPolicyName:     {"max-length": float64(resource.DefaultDeadLetterMaxLength), "overflow": "drop-head"},
	}
	pols, err := b.API.ListPoliciesIn(r.vhost)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pols {
		if want, ok := wantPolicies[p.Name]; ok {
			if got := map[string]any(p.Definition); !reflect.DeepEqual(got, want) {
				t.Errorf("policy %s: definition %v, want %v", p.Name, got, want)
			}
			delete(wantPolicies, p.Name)
		}
	}
	if len(wantPolicies) > 0 {
		t.Errorf("limits policies missing: %v", wantPolicies)
	}
	qs, err := b.Queues(r.vhost)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, q := range qs {
		lines = append(lines, fmt.Sprintf("queue %s type=%s durable=%t auto_delete=%v arguments=%v", q.Name, q.Type, q.Durable, q.AutoDelete, q.Arguments))
		want, ok := wantQueues[q.Name]
		if !ok {
			t.Errorf("unexpected queue %s in vhost %s", q.Name, r.vhost)
			continue
		}
		delete(wantQueues, q.Name)
		if q.Type != "quorum" || !q.Durable || bool(q.AutoDelete) {
			t.Errorf("queue %s: type %s durable %t auto_delete %v", q.Name, q.Type, q.Durable, q.AutoDelete)
		}
		if !reflect.DeepEqual(q.Arguments, want) {
			t.Errorf("queue %s arguments %v, want exactly %v", q.Name, q.Arguments, want)
		}
	}
	for q := range wantQueues {
		t.Errorf("queue %s missing from vhost %s", q, r.vhost)
	}

	xs, err := b.Exchanges(r.vhost)
	if err != nil {
		t.Fatal(err)
	}
	wantX := map[string]string{topology.CommandsExchange: "direct", topology.EventsExchange: "topic", topology.DeadLetterExchange: topology.DeadLetterExchangeType}
	for _, x := range xs {
		if x.Name == "" || strings.HasPrefix(x.Name, "amq.") {
			continue
		}
		lines = append(lines, fmt.Sprintf("exchange %s type=%s durable=%t", x.Name, x.Type, x.Durable))
		typ, ok := wantX[x.Name]
		if !ok {
			t.Errorf("unexpected exchange %s", x.Name)
			continue
		}
		delete(wantX, x.Name)
		if x.Type != typ || !x.Durable || bool(x.AutoDelete) {
			t.Errorf("exchange %s: type %s durable %t auto_delete %v, want %s, durable", x.Name, x.Type, x.Durable, x.AutoDelete, typ)
		}
	}
	for x := range wantX {
		t.Errorf("exchange %s missing", x)
	}

	bindings, err := r.bindings()
	if err != nil {
		t.Fatal(err)
	}
	lines = append(lines, bindings...)
	if want := []string{
		fmt.Sprintf("binding %s -> %s [%s]", topology.CommandsExchange, topology.CommandQueue(calleeID), topology.CommandRoutingKey(calleeID)),
		fmt.Sprintf("binding %s -> %s [%s]", topology.DeadLetterExchange, topology.DeadLetterQueue(topology.CommandQueue(calleeID)), topology.CommandDeadLetterKey(calleeID)),
		fmt.Sprintf("binding %s -> %s [%s]", topology.DeadLetterExchange, topology.DeadLetterQueue(topology.EventQueue(callerID)), topology.EventDeadLetterKey(callerID)),
		fmt.Sprintf("binding %s -> %s [%s]", topology.EventsExchange, topology.EventQueue(callerID), topology.EventBindingKey(callerID)),
	}; !slices.Equal(bindings, want) {
		t.Errorf("bindings %v, want exactly %v", bindings, want)
	}

	calleeUser := topology.Username(topology.RoleCallee, r.vhost, calleeID)
	callerUser := topology.Username(topology.RoleCaller, r.vhost, callerID)
	ps, err := b.Permissions(r.vhost)
	if err != nil {
		t.Fatal(err)
	}
	wantP := map[string]topology.Permissions{calleeUser: topology.CalleePermissions(calleeID), callerUser: topology.CallerPermissions(callerID)}
	for _, p := range ps {
		lines = append(lines, fmt.Sprintf("permission %s configure=%q write=%q read=%q", p.User, p.Configure, p.Write, p.Read))
		want, ok := wantP[p.User]
		if !ok {
			if p.User != b.Username { // the topology operator's management user
				t.Errorf("unexpected permission on %s for %s", r.vhost, p.User)
			}
			continue
		}
		delete(wantP, p.User)
		if got := (topology.Permissions{Configure: p.Configure, Write: p.Write, Read: p.Read}); got != want {
			t.Errorf("permissions of %s: %+v, want %+v", p.User, got, want)
		}
	}
	for u := range wantP {
		t.Errorf("no permissions on %s for %s", r.vhost, u)
	}
	for _, u := range []string{calleeUser, callerUser} {
		info, err := b.API.GetUser(u)
		if err != nil {
			t.Errorf("user %s: %v", u, err)
			continue
		}
		lines = append(lines, fmt.Sprintf("user %s tags=%v", u, info.Tags))
		if len(info.Tags) != 0 {
			t.Errorf("user %s has tags %v (management access)", u, info.Tags)
		}
	}
	slices.Sort(lines)
	t.Logf("broker %s, vhost %s:\n%s", b.ManagementURL, r.vhost, indent(strings.Join(lines, "\n")))
}

// bindings are the vhost's bindings as "binding SOURCE -> QUEUE [KEY]",
// sorted, the default exchange's left out.
func (r *samplesRun) bindings() ([]string, error) {
	names, err := r.broker.BindingNames(r.vhost)
	for i := range names {
		names[i] = "binding " + names[i]
	}
	return names, err
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

// finishedAtApp waits until the app has every session's end: the
// session_closed event (and, with terminal set, that message too).
func (r *samplesRun) finishedAtApp(t *testing.T, ids []string, terminal bool) samplecaller.Snapshot {
	t.Helper()
	var snap samplecaller.Snapshot
	eventually(t, sessionTimeout, fmt.Sprintf("%d sessions closed at the app", len(ids)), func(ctx context.Context) error {
		var err error
		if snap, err = r.received(ctx); err != nil {
			return err
		}
		for _, id := range ids {
			s := snap.Sessions[id]
			switch {
			case s == nil:
				return fmt.Errorf("session %s: nothing at the app yet", id)
			case s.FinalState == "" || (terminal && s.Terminal == ""):
				return fmt.Errorf("session %s not closed at the app yet: %d events, last sequence %d, terminal %q", id, s.Events, s.LastSequence, s.Terminal)
			}
		}
		return nil
	})
	return snap
}

// sessionMatches waits until the HCPSession is in state with lastSequence
// and eventCount equal to what the app received, and the caller's
// acknowledged sequence caught up (it is written coalesced, once a second
// at most), then returns it.
func (r *samplesRun) sessionMatches(t *testing.T, s *samplecaller.SessionLog, state hcpv1alpha1.SessionState) *hcpv1alpha1.HCPSession {
	t.Helper()
	var hs *hcpv1alpha1.HCPSession
	eventually(t, 30*time.Second, "HCPSession "+s.SessionID+" "+string(state)+" as the app saw it", func(ctx context.Context) error {
		var err error
		if hs, err = r.session(ctx, s.SessionID); err != nil {
			return err
		}
		st := hs.Status
		if st.State != state || st.LastSequence != s.LastSequence || st.EventCount != int64(s.Events) || st.CallerAckedSequence != st.LastSequence {
			return fmt.Errorf("state %s lastSequence %d eventCount %d callerAckedSequence %d; the app received %d events, last sequence %d",
				st.State, st.LastSequence, st.EventCount, st.CallerAckedSequence, s.Events, s.LastSequence)
		}
		return nil
	})
	return hs
}

// checkStream checks the order a session reached the app in: task_accepted;
// events with sequences 1..n, session_created and state_changed first;
// the terminal message (terminal, or none) just before the last event,
// session_closed with finalState. No duplicates, no gaps, no problems.
func checkStream(t *testing.T, s *samplecaller.SessionLog, terminal, finalState string) {
	t.Helper()
	if s == nil {
		t.Error("session missing at the app")
		return
	}
	var kinds []string
	for _, m := range s.Messages {
		if m.Type == "event" {
			kinds = append(kinds, fmt.Sprintf("%d:%s", m.Sequence, m.EventType))
		} else {
			kinds = append(kinds, m.Type)
		}
	}
	if len(s.Problems) != 0 || s.Duplicates != 0 || s.Deduplicated != 0 {
		t.Errorf("session %s: problems %q duplicates %d deduplicated %d", s.SessionID, s.Problems, s.Duplicates, s.Deduplicated)
	}
	for i, seq := range s.Sequences() {
		if seq != int64(i+1) {
			t.Errorf("session %s: event %d has sequence %d: %v", s.SessionID, i+1, seq, kinds)
			break
		}
	}
	n := len(s.Messages)
	ok := n >= 4 && s.Answer == "task_accepted" && s.Messages[0].Type == "task_accepted" &&
		s.Messages[1].EventType == "session_created" && s.Messages[2].EventType == "state_changed" &&
		s.Messages[n-1].EventType == "session_closed" && s.FinalState == finalState && s.Terminal == terminal &&
		s.LastSequence == int64(s.Events)
	if ok && terminal != "" {
		ok = s.Messages[n-2].Type == terminal
	}
	if !ok {
		t.Errorf("session %s: answer %q terminal %q (want %q) final state %q (want %q), the app received %v",
			s.SessionID, s.Answer, s.Terminal, terminal, s.FinalState, finalState, kinds)
	}
}

// count counts the session's events of one type.
func count(s *samplecaller.SessionLog, eventType string) int {
	n := 0
	for _, m := range s.Messages {
		if m.Type == "event" && m.EventType == eventType {
			n++
		}
	}
	return n
}

// concurrentSessions: several tasks submitted at once through the caller
// sidecar run concurrently on the callee and complete; the app receives
// each session completely, in order, exactly once, with the event count
// the task implies; each HCPSession ends COMPLETED with the same last
// sequence and event count, and went PENDING → RUNNING → COMPLETED.
func (r *samplesRun) concurrentSessions(t *testing.T) {
	const sessions, logEvery, checkpointEvery, stepMS = 5, 3, 4, 200
	type sub struct {
		task  samplecaller.Task
		steps int
	}
	subs := make([]sub, sessions)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range subs {
		steps := 6 + 2*i // different lengths, overlapping runs
		wg.Go(func() {
			in := fmt.Sprintf(`{"recipe":"s3://lab/recipes/e2e-%d.yaml","steps":%d,"step_ms":%d,"log_every":%d,"checkpoint_every":%d}`, i, steps, stepMS, logEvery, checkpointEvery)
			subs[i] = sub{r.submit(t, synthesis, fmt.Sprintf("e2e concurrent session %d", i), in, samplecaller.Constraints{DataClassification: "T2"}), steps}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	ids := make([]string, len(subs))
	for i, s := range subs {
		ids[i] = s.task.SessionID
	}
	snap := r.finishedAtApp(t, ids, true)
	t.Logf("%d sessions completed at the app in %s", sessions, time.Since(start).Round(time.Millisecond))

	overlap := maxOverlap(snap, ids)
	for _, sb := range subs {
		s := snap.Sessions[sb.task.SessionID]
		// session_created, state_changed to RUNNING, a progress per step,
		// the logs and checkpoints, state_changed to COMPLETED,
		// session_closed.
		want := 2 + sb.steps + sb.steps/logEvery + sb.steps/checkpointEvery + 2
		checkStream(t, s, "task_completed", string(hcpv1alpha1.SessionCompleted))
		if s.Events != want || count(s, "progress") != sb.steps {
			t.Errorf("session %s (%d steps): %d events (%d progress), want %d (%d progress)", s.SessionID, sb.steps, s.Events, count(s, "progress"), want, sb.steps)
		}
		if s.CalleeID != calleeID || s.TaskMessageID != sb.task.MessageID {
			t.Errorf("session %s: callee %q task %q at the app, want %q %q", s.SessionID, s.CalleeID, s.TaskMessageID, calleeID, sb.task.MessageID)
		}

		hs := r.sessionMatches(t, s, hcpv1alpha1.SessionCompleted)
		st, sp := hs.Status, hs.Spec
		if sp.CallerID != callerID || sp.CalleeID != calleeID || sp.Capability != synthesis || sp.TaskMessageID != sb.task.MessageID || sp.RiskLevel != hcpv1alpha1.RiskR3 {
			t.Errorf("HCPSession %s spec %+v", hs.Name, sp)
		}
		if st.Progress == nil || st.Progress.Percent == nil || *st.Progress.Percent != 100 || st.Result == nil ||
			st.StartedAt == nil || st.CompletedAt == nil || st.PodName != r.calleePod.Name {
			t.Errorf("HCPSession %s status incomplete (want progress 100, a result, times and pod %s): %+v", hs.Name, r.calleePod.Name, st)
		}
		if wantCk := fmt.Sprintf("ckpt-%03d", sb.steps/checkpointEvery*checkpointEvery); st.LastCheckpoint == nil || st.LastCheckpoint.ID != wantCk {
			t.Errorf("HCPSession %s lastCheckpoint %+v, want %s", hs.Name, st.LastCheckpoint, wantCk)
		}

		// The caller sidecar's own records.
		sv, err := r.sidecar.Session(t.Context(), s.SessionID)
		if err != nil || sv.LastSequence != s.LastSequence || !sv.Finished || !sv.Closed || sv.State != string(hcpv1alpha1.SessionCompleted) {
			t.Errorf("caller sidecar GET /hcp/v1/sessions/%s: %+v %v", s.SessionID, sv, err)
		}
		tv, err := r.sidecar.Task(t.Context(), sb.task.MessageID)
		if err != nil || tv.Status != "accepted" || !tv.DeliveredToApp || tv.RiskLevel != string(hcpv1alpha1.RiskR3) {
			t.Errorf("caller sidecar GET /hcp/v1/tasks/%s: %+v %v", sb.task.MessageID, tv, err)
		}

		// The HCPSession's states as a watch saw them.
		var states []hcpv1alpha1.SessionState
		for _, l := range r.history.of(s.SessionID) {
			if len(states) == 0 || states[len(states)-1] != l.State {
				states = append(states, l.State)
			}
		}
		if want := []hcpv1alpha1.SessionState{hcpv1alpha1.SessionPending, hcpv1alpha1.SessionRunning, hcpv1alpha1.SessionCompleted}; !isSubsequence(states, append([]hcpv1alpha1.SessionState{""}, want...)) ||
			len(states) == 0 || states[len(states)-1] != hcpv1alpha1.SessionCompleted {
			t.Errorf("HCPSession %s went through %q, want a subsequence of %q ending COMPLETED", s.SessionID, states, want)
		}
	}
	t.Logf("HCPSession %s as `kubectl get hcps -w` saw it:\n%s", ids[len(ids)-1], indent(formatHistory(r.history.of(ids[len(ids)-1]))))
	t.Logf("up to %d of the %d sessions streamed to the app at once", overlap, sessions)
	if overlap < 2 {
		t.Errorf("the sessions did not run concurrently (their event streams never overlapped at the app)")
	}
	out, _ := r.kubectl(t.Context(), nil, "get", "hcpsessions", "-n", r.ns)
	t.Logf("kubectl get hcpsessions:\n%s", indent(out))
}

// rejections: tasks the L3 gate refuses reach the app as task_rejected
// (and nothing else), with the reason code; the caller sidecar records the
// rejection; nothing is written for it but an Event on the Callee (reason
// TaskRejected) that names the task and the reason: no HCPSession.
func (r *samplesRun) rejections(t *testing.T) {
	cases := []struct {
		name, capability, dataClass string
		want                        task.ReasonCode
	}{
		{"capability not admitted by the policy", bakeout, "T1", task.ReasonNotAuthorized},
		{"data class above the policy", synthesis, "T3", task.ReasonDataClassExceedsPolicy},
		{"unknown capability", "cvd.no-such-thing", "T1", task.ReasonUnknownCapability},
	}
	tasks := make([]samplecaller.Task, len(cases))
	for i, c := range cases {
		tasks[i] = r.submit(t, c.capability, "e2e: "+c.name, `{"recipe":"s3://lab/recipes/never.yaml"}`, samplecaller.Constraints{DataClassification: c.dataClass})
	}
	var snap samplecaller.Snapshot
	eventually(t, sessionTimeout, "the rejections at the app", func(ctx context.Context) error {
		var err error
		if snap, err = r.received(ctx); err != nil {
			return err
		}
		for _, tk := range tasks {
			if s := snap.Sessions[tk.SessionID]; s == nil || s.Answer == "" {
				return fmt.Errorf("task %s (%s): no answer at the app yet", tk.MessageID, tk.Capability)
			}
		}
		return nil
	})
	for i, c := range cases {
		tk := tasks[i]
		s := snap.Sessions[tk.SessionID]
		if s.Answer != "task_rejected" || len(s.Messages) != 1 || s.Events != 0 || s.Terminal != "" || len(s.Problems) != 0 {
			t.Errorf("%s: the app saw %+v, want task_rejected alone", c.name, s)
		}
		tv, err := r.sidecar.Task(t.Context(), tk.MessageID)
		if err != nil || tv.Status != "rejected" || tv.ReasonCode != string(c.want) || !tv.DeliveredToApp {
			t.Errorf("%s: caller sidecar task %+v %v, want rejected %s delivered to the app", c.name, tv, err, c.want)
		}
		eventually(t, 30*time.Second, "Event TaskRejected for "+tk.MessageID, func(ctx context.Context) error {
			var evs corev1.EventList
			if err := r.c.List(ctx, &evs, client.InNamespace(r.ns)); err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.Reason == "TaskRejected" && e.InvolvedObject.Kind == "Callee" && e.InvolvedObject.Name == calleeID &&
					strings.Contains(e.Message, tk.MessageID) && strings.Contains(e.Message, string(c.want)) {
					return nil
				}
			}
			return fmt.Errorf("%s: no TaskRejected Event names task %s among %d", c.name, tk.MessageID, len(evs.Items))
		})
		if _, err := r.session(t.Context(), tk.SessionID); !apierrors.IsNotFound(err) {
			t.Errorf("%s: the rejected task has an HCPSession (%v); want none", c.name, err)
		}
		t.Logf("%s: task_rejected %s: %s", c.name, tv.ReasonCode, tv.Message)
	}
}

// abort: a long task RUNNING is aborted with `kubectl patch hcps ...
// abortRequested=true`; the callee sidecar tells the harness, the session
// ends ABORTED, and the app receives the events up to the abort and
// session_closed ABORTED, but no task_completed.
func (r *samplesRun) abort(t *testing.T) {
	const steps = 600 // 600 × 100 ms: a minute unless aborted
	tk := r.submit(t, synthesis, "e2e: aborted", fmt.Sprintf(`{"recipe":"s3://lab/recipes/long.yaml","steps":%d,"step_ms":100}`, steps), samplecaller.Constraints{})
	eventually(t, sessionTimeout, "the long session RUNNING with progress", func(ctx context.Context) error {
		hs, err := r.session(ctx, tk.SessionID)
		if err != nil {
			return err
		}
		if hs.Status.State != hcpv1alpha1.SessionRunning || hs.Status.LastSequence < 5 {
			return fmt.Errorf("state %s lastSequence %d", hs.Status.State, hs.Status.LastSequence)
		}
		return nil
	})
	patched := time.Now()
	out, err := r.kubectl(t.Context(), nil, "patch", "hcps", tk.SessionID, "-n", r.ns, "--type", "merge", "-p", `{"spec":{"abortRequested":true}}`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl patch hcps %s --type merge -p '{\"spec\":{\"abortRequested\":true}}': %s", tk.SessionID, strings.TrimSpace(out))

	snap := r.finishedAtApp(t, []string{tk.SessionID}, false)
	s := snap.Sessions[tk.SessionID]
	checkStream(t, s, "", string(hcpv1alpha1.SessionAborted))
	if p := count(s, "progress"); p >= steps {
		t.Errorf("the aborted task ran to its end (%d progress events)", p)
	}
	hs := r.sessionMatches(t, s, hcpv1alpha1.SessionAborted)
	if !meta.IsStatusConditionTrue(hs.Status.Conditions, hcpv1alpha1.ConditionAbortRequested) {
		t.Errorf("HCPSession %s: no AbortRequested=True condition: %s", hs.Name, conditions(hs.Status.Conditions))
	}
	if hs.Status.CompletedAt == nil || hs.Status.CompletedAt.Sub(patched) > 15*time.Second {
		t.Errorf("HCPSession %s ended at %v, more than 15s after the patch (%s)", hs.Name, hs.Status.CompletedAt, patched.Format(time.RFC3339))
	}
	t.Logf("aborted after %d events; HCPSession %s %s (%s: %s)", s.Events, hs.Name, hs.Status.State, hs.Status.Reason, hs.Status.Message)
}

// timeout: a task whose max_duration (PT3S) is shorter than its run
// (about 10 s) ends FAILED with reason timeout when its time is up; the app
// receives task_failed and session_closed FAILED.
func (r *samplesRun) timeout(t *testing.T) {
	const steps = 100 // 100 × 100 ms
	tk := r.submit(t, synthesis, "e2e: too slow", fmt.Sprintf(`{"recipe":"s3://lab/recipes/slow.yaml","steps":%d,"step_ms":100}`, steps),
		samplecaller.Constraints{MaxDuration: "PT3S"})
	snap := r.finishedAtApp(t, []string{tk.SessionID}, true)
	s := snap.Sessions[tk.SessionID]
	checkStream(t, s, "task_failed", string(hcpv1alpha1.SessionFailed))
	if p := count(s, "progress"); p >= steps {
		t.Errorf("the task ran to its end (%d progress events) despite max_duration PT3S", p)
	}
	hs := r.sessionMatches(t, s, hcpv1alpha1.SessionFailed)
	st := hs.Status
	if st.Reason != "timeout" || st.Error == nil || st.Error.Code != "timeout" || hs.Spec.MaxDuration != "PT3S" {
		t.Errorf("HCPSession %s: reason %q error %+v maxDuration %s, want timeout and PT3S", hs.Name, st.Reason, st.Error, hs.Spec.MaxDuration)
	}
	if st.StartedAt == nil || st.CompletedAt == nil {
		t.Fatalf("HCPSession %s: startedAt %v completedAt %v", hs.Name, st.StartedAt, st.CompletedAt)
	}
	// Both are whole seconds; the task would have taken 10 s.
	if d := st.CompletedAt.Sub(st.StartedAt.Time); d < 2*time.Second || d > 8*time.Second {
		t.Errorf("HCPSession %s ran %s (startedAt %s, completedAt %s), want about 3s", hs.Name, d, st.StartedAt, st.CompletedAt)
	}
	t.Logf("timed out after %d progress events: HCPSession %s %s (%s: %s)", count(s, "progress"), hs.Name, st.State, st.Reason, st.Message)
}

// deleteCallee: deleting the Callee removes its queue, user and
// permission from the broker, its harness, Secrets and HCPSessions from
// the cluster, and nothing the Caller still needs: the shared exchanges,
// the event queue and its binding, the caller's user.
func (r *samplesRun) deleteCallee(t *testing.T) {
	ctx := t.Context()
	if out, err := r.kubectl(ctx, nil, "delete", "callee", calleeID, "-n", r.ns, "--wait=false"); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("kubectl delete callee %s: %s", calleeID, strings.TrimSpace(out))
	}
	calleeUser := topology.Username(topology.RoleCallee, r.vhost, calleeID)
	callerUser := topology.Username(topology.RoleCaller, r.vhost, callerID)
	secrets := []string{r.callee.Status.CredentialsSecret}
	eventually(t, deleteTimeout, "the Callee, its topology, user, harness and sessions gone", func(ctx context.Context) error {
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(r.callee), &hcpv1alpha1.Callee{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Callee %s still exists (%v)", calleeID, err)
		}
		if _, err := r.broker.Queue(r.vhost, topology.CommandQueue(calleeID)); !testbed.IsNotFound(err) {
			return fmt.Errorf("queue %s still on the broker (%v)", topology.CommandQueue(calleeID), err)
		}
		if _, err := r.broker.API.GetUser(calleeUser); !testbed.IsNotFound(err) {
			return fmt.Errorf("user %s still on the broker (%v)", calleeUser, err)
		}
		ps, err := r.broker.Permissions(r.vhost)
		if err != nil {
			return err
		}
		for _, p := range ps {
			if p.User == calleeUser {
				return fmt.Errorf("permission of %s still on %s", calleeUser, r.vhost)
			}
		}
		deploys := &appsv1.DeploymentList{}
		if err := r.c.List(ctx, deploys, client.InNamespace(r.ns), client.MatchingLabels{"hcp.io/callee": calleeID}); err != nil {
			return err
		}
		pods := &corev1.PodList{}
		if err := r.c.List(ctx, pods, client.InNamespace(r.ns), client.MatchingLabels{"hcp.io/callee": calleeID}); err != nil {
			return err
		}
		if len(deploys.Items)+len(pods.Items) > 0 {
			return fmt.Errorf("%d harness Deployments and %d pods left", len(deploys.Items), len(pods.Items))
		}
		for _, name := range secrets {
			if err := r.c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: name}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("Secret %s still exists (%v)", name, err)
			}
		}
		hss := &hcpv1alpha1.HCPSessionList{}
		if err := r.c.List(ctx, hss, client.InNamespace(r.ns)); err != nil {
			return err
		}
		if n := len(hss.Items); n > 0 {
			return fmt.Errorf("%d HCPSessions of the deleted Callee left", n)
		}
		return nil
	})

	// What the Caller still uses stays.
	names, err := r.exchangeNames()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{topology.CommandsExchange, topology.DeadLetterExchange, topology.EventsExchange}; !slices.Equal(names, want) {
		t.Errorf("exchanges after deleting the Callee: %v, want %v (the Caller still uses them)", names, want)
	}
	bindings, err := r.bindings()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{
		fmt.Sprintf("binding %s -> %s [%s]", topology.DeadLetterExchange, topology.DeadLetterQueue(topology.EventQueue(callerID)), topology.EventDeadLetterKey(callerID)),
		fmt.Sprintf("binding %s -> %s [%s]", topology.EventsExchange, topology.EventQueue(callerID), topology.EventBindingKey(callerID)),
	}; !slices.Equal(bindings, want) {
		t.Errorf("bindings after deleting the Callee: %v, want %v", bindings, want)
	}
	if _, err := r.broker.API.GetUser(callerUser); err != nil {
		t.Errorf("the Caller's user %s: %v", callerUser, err)
	}
	if err := r.c.Get(ctx, client.ObjectKeyFromObject(r.caller), r.caller); err != nil || !meta.IsStatusConditionTrue(r.caller.Status.Conditions, hcpv1alpha1.ConditionReady) {
		t.Errorf("Caller %s after deleting the Callee: %v %s", callerID, err, conditions(r.caller.Status.Conditions))
	}
	t.Logf("left on the broker in %s: exchanges %v, %v", r.vhost, names, bindings)
}

// deleteCaller: with the last user of the vhost gone, the shared
// exchanges, the event queue, the caller's user and (deletionPolicy
// delete) the vhost leave the broker.
func (r *samplesRun) deleteCaller(t *testing.T) {
	ctx := t.Context()
	start := time.Now()
	if _, err := r.kubectl(ctx, nil, "delete", "caller", callerID, "-n", r.ns, "--wait=false"); err != nil {
		t.Fatal(err)
	}
	callerUser := topology.Username(topology.RoleCaller, r.vhost, callerID)
	// When each part went, for the log: the parts are removed by
	// different controllers.
	gone := map[string]time.Duration{}
	mark := func(what string) {
		if _, ok := gone[what]; !ok {
			gone[what] = time.Since(start).Round(100 * time.Millisecond)
		}
	}
	eventually(t, deleteTimeout, "the Caller, its user, the exchanges and the vhost gone", func(ctx context.Context) error {
		var left []string
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(r.caller), &hcpv1alpha1.Caller{}); !apierrors.IsNotFound(err) {
			left = append(left, fmt.Sprintf("Caller %s (%v)", callerID, err))
		} else {
			mark("Caller object")
		}
		if _, err := r.broker.API.GetUser(callerUser); !testbed.IsNotFound(err) {
			left = append(left, fmt.Sprintf("user %s (%v)", callerUser, err))
		} else {
			mark("broker user")
		}
		if names, err := r.exchangeNames(); err == nil && len(names) > 0 {
			left = append(left, fmt.Sprintf("exchanges %v", names))
		} else {
			mark("exchanges")
		}
		if _, err := r.broker.API.GetVhost(r.vhost); !testbed.IsNotFound(err) {
			left = append(left, fmt.Sprintf("vhost %s (%v)", r.vhost, err))
		} else {
			mark("vhost")
		}
		if len(left) > 0 {
			return fmt.Errorf("still there: %s", strings.Join(left, ", "))
		}
		return nil
	})
	t.Logf("gone after: %v", gone)
}

func (r *samplesRun) exchangeNames() ([]string, error) {
	xs, err := r.broker.Exchanges(r.vhost)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, x := range xs {
		if x.Name != "" && !strings.HasPrefix(x.Name, "amq.") {
			names = append(names, x.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}
