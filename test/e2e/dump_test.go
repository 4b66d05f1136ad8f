//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// logTailLines bounds each container log in a failure dump.
const logTailLines = 400

// dumpOnFailure prints, when the test has failed by the time it ends: the
// objects of both namespaces as YAML (hcp.io kinds, the topology operator's
// kinds, Deployments, Pods), the broker's vhost (queues, exchanges,
// bindings, permissions) and users, the namespaces' events, and the logs of
// every container (the manager's first), plus the topology operator's on
// the local stack. Register it after install: cleanups run last-registered
// first, so it runs before the teardown.
func (s *suite) dumpOnFailure(t *testing.T) {
	t.Helper()
	lists := func() []client.ObjectList {
		return []client.ObjectList{
			&hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}, &hcpv1alpha1.CapabilityPolicyList{}, &hcpv1alpha1.HCPSessionList{},
			&appsv1.DeploymentList{}, &corev1.PodList{},
			&topologyv1beta1.VhostList{}, &topologyv1beta1.ExchangeList{}, &topologyv1beta1.QueueList{}, &topologyv1beta1.BindingList{},
			&topologyv1beta1.UserList{}, &topologyv1beta1.PermissionList{},
		}
	}
	// Cleanups run in reverse: the logs print last, closest to the summary.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, ns := range []string{s.ns, s.opNS} {
			if out, err := s.kubectl(ctx, nil, "get", "events", "-n", ns, "--sort-by=.lastTimestamp"); err == nil {
				t.Logf("e2e dump: events in %s:\n%s", ns, indent(out))
			}
		}
		s.dumpLogs(t, ctx, s.opNS) // the manager
		s.dumpLogs(t, ctx, s.ns)   // harnesses and sidecars
		if s.cfg.stackLogs != "" {
			for _, name := range []string{"messaging-topology-operator", "kubelet", "containerd"} {
				t.Logf("e2e dump: %s log (last 150 lines):\n%s", name, indent(tailFile(filepath.Join(s.cfg.stackLogs, name+".log"), 150)))
			}
		}
	})
	testbed.DumpOnFailure(t, testbed.Dump{Client: s.c, Namespace: s.opNS, Lists: []client.ObjectList{&appsv1.DeploymentList{}, &corev1.PodList{}}})
	testbed.DumpOnFailure(t, testbed.Dump{Client: s.c, Namespace: s.ns, Lists: lists(), Broker: s.broker, Vhosts: []string{s.vhost}})
}

// dumpLogs prints the logs of every container of every pod in ns: the
// local stack node's files (every run of a container the kubelet still
// keeps: <namespace>_<pod>_<uid>/<container>/<restart>.log), or kubectl
// logs elsewhere.
func (s *suite) dumpLogs(t *testing.T, ctx context.Context, ns string) {
	if dir := os.Getenv("HCP_STACK_POD_LOGS"); s.cfg.stackLogs != "" && dir != "" {
		files, _ := filepath.Glob(filepath.Join(dir, ns+"_*", "*", "*.log"))
		for _, f := range files {
			t.Logf("e2e dump: container log %s (last %d lines):\n%s", f, logTailLines, indent(tailFile(f, logTailLines)))
		}
		if len(files) > 0 {
			return
		}
	}
	pods := &corev1.PodList{}
	if err := s.c.List(ctx, pods, client.InNamespace(ns)); err != nil {
		t.Logf("e2e dump: list pods in %s: %v", ns, err)
		return
	}
	for _, p := range pods.Items {
		for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			out, err := s.kubectl(ctx, nil, "logs", "-n", ns, p.Name, "-c", c.Name, fmt.Sprintf("--tail=%d", logTailLines))
			if err != nil {
				out += "\n" + err.Error()
			}
			t.Logf("e2e dump: kubectl logs %s/%s -c %s:\n%s", ns, p.Name, c.Name, indent(out))
		}
	}
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("… (%d lines before)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
