//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The chart's NetworkPolicies (networkPolicy.enabled), enforced on the
// local stack's node by kube-router's policy controller (hack/lib/netpol.sh).
// Two probe pods stand where a user's pods would: one in a namespace
// labelled as a metrics scraper's, one in a plain namespace. Each probe
// connects from inside its pod's network namespace (nsenter into the pod's
// sandbox, so the packets carry the pod's address) to the harness pod's
// sidecar metrics (9091) and harness port, and to the manager's metrics.
// Before the policies every port answers both probes (so what fails later
// fails because of them); with them, only the scraper reaches the metrics
// ports and nothing reaches the harness port. The policies stay for the
// rest of the run: every later step's sessions stream under them.

const (
	// scraperLabel is the chart's default networkPolicy.metricsNamespaceSelector.
	scraperLabel = "hcp.io/metrics-scraper"
	// connectTimeout bounds one probe; a dropped SYN waits it out.
	connectTimeout = 3 * time.Second
)

type probeTarget struct {
	what string
	pod  *corev1.Pod
	port int
	// scraperAllowed: the policies admit the scraper's namespace.
	scraperAllowed bool
}

func (r *samplesRun) networkPolicy(t *testing.T) {
	if r.cfg.existing {
		t.Skip("needs the local stack's node (nsenter into the probe pods); skipped on an existing cluster")
	}
	if os.Getenv("HCP_STACK_NETPOL") == "0" {
		t.Skip("HCP_STACK_NETPOL=0: the local stack runs no NetworkPolicy enforcer")
	}
	ctx := t.Context()
	scraper := r.probePod(t, "scraper", map[string]string{scraperLabel: "true"})
	other := r.probePod(t, "other", nil)
	manager := r.managerPod(t)
	targets := []probeTarget{
		{"the callee sidecar's metrics", r.calleePod, 9091, true},
		{"the callee harness's own port", r.calleePod, int(r.callee.Spec.Harness.Port), false},
		{"the manager's metrics", manager, 8443, true},
	}

	for _, tg := range targets {
		for _, p := range []*corev1.Pod{scraper, other} {
			if err := r.connect(ctx, p, tg); err != nil {
				t.Fatalf("before any NetworkPolicy, %s in %s cannot reach %s: %v", p.Name, p.Namespace, tg.what, err)
			}
		}
	}
	t.Logf("before the policies: both probes reach all %d ports", len(targets))

	r.applyNetworkPolicies(t)
	// kube-router applies a policy within seconds of seeing it.
	eventually(t, time.Minute, "the NetworkPolicies enforced", func(ctx context.Context) error {
		var wrong []string
		for _, tg := range targets {
			for _, p := range []*corev1.Pod{scraper, other} {
				want := p == scraper && tg.scraperAllowed
				if err := r.connect(ctx, p, tg); (err == nil) != want {
					wrong = append(wrong, fmt.Sprintf("%s → %s: reached %t, want %t (%v)", p.Namespace, tg.what, err == nil, want, err))
				}
			}
		}
		if len(wrong) > 0 {
			return errors.New(strings.Join(wrong, "; "))
		}
		return nil
	})
	t.Logf("with the policies: the scraper's namespace reaches the metrics ports only; the plain namespace reaches nothing")
}

// probePod runs a pod of the node's sandbox image (it only holds a network
// namespace) in a namespace of its own with the given labels, and waits
// until it runs.
func (r *samplesRun) probePod(t *testing.T, name string, nsLabels map[string]string) *corev1.Pod {
	t.Helper()
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns + "-np-" + name, Labels: map[string]string{"app.kubernetes.io/part-of": "hcp-e2e"}}}
	for k, v := range nsLabels {
		ns.Labels[k] = v
	}
	if err := r.c.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace %s: %v", ns.Name, err)
	}
	r.parent.Cleanup(func() {
		_ = r.c.Delete(context.Background(), ns)
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns.Name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "probe", Image: "localhost/hcp-local/pause:1", ImagePullPolicy: corev1.PullNever,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: new(false), RunAsNonRoot: new(true), RunAsUser: new(int64(65532)),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
			TerminationGracePeriodSeconds: new(int64(0)),
		},
	}
	if err := r.c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "probe pod "+ns.Name+"/probe running", func(ctx context.Context) error {
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
			return fmt.Errorf("phase %s, IP %q", pod.Status.Phase, pod.Status.PodIP)
		}
		return nil
	})
	return pod
}

// managerPod is the running manager pod.
func (r *samplesRun) managerPod(t *testing.T) *corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	if err := r.c.List(t.Context(), pods, client.InNamespace(r.opNS)); err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			return p
		}
	}
	t.Fatalf("no running manager pod in %s: %s", r.opNS, r.podsSummary(t.Context(), r.opNS))
	return nil
}

// connect opens a TCP connection from inside the probe pod's network
// namespace to the target's pod address and port: nil when it is accepted.
func (r *samplesRun) connect(ctx context.Context, from *corev1.Pod, to probeTarget) error {
	pid, err := output(ctx, filepath.Join(r.cfg.root, "hack", "local-stack.sh"), "pid", from.Namespace+"/"+from.Name, from.Spec.Containers[0].Name)
	if err != nil {
		return fmt.Errorf("the probe's pid: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout+2*time.Second)
	defer cancel()
	script := fmt.Sprintf("exec 3<>/dev/tcp/%s/%d", to.pod.Status.PodIP, to.port)
	cmd := exec.CommandContext(ctx, "nsenter", "-t", strings.TrimSpace(pid), "-n",
		"timeout", fmt.Sprintf("%.0f", connectTimeout.Seconds()), "bash", "-c", script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s:%d: %w %s", to.pod.Status.PodIP, to.port, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// applyNetworkPolicies renders the chart's NetworkPolicies for the run
// (scrapers: namespaces labelled scraperLabel, the chart's default) and
// applies them.
func (r *samplesRun) applyNetworkPolicies(t *testing.T) {
	t.Helper()
	args := append([]string{"template", release, filepath.Join(r.cfg.root, chartDir), "--namespace", r.opNS,
		"--show-only", "templates/networkpolicy.yaml"}, r.helmValues()...)
	args = append(args, "--set", "networkPolicy.enabled=true", "--set", "networkPolicy.harness.namespaces={"+r.ns+"}")
	out, err := exec.CommandContext(t.Context(), r.cfg.helm, args...).Output()
	if err != nil {
		t.Fatalf("helm template --show-only templates/networkpolicy.yaml: %v", err)
	}
	applied, err := r.apply(t.Context(), out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the chart's NetworkPolicies:\n%s", indent(applied))
}
