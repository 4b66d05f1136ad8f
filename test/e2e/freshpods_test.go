//go:build e2e

package e2e

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// freshPods replaces the callee and caller pods a container of which has
// restarted (an earlier run's kill), so that every run of a fault starts
// from pods that never restarted, as a production pod that crashes once.
// The kubelet's crash-loop back-off grows with each restart of a container
// (10 s, 20 s, 40 s, … up to 5 min) and is forgotten only after 10 min of
// running: the fifth SIGKILL of one sidecar waited 80 s, and an OOM kill
// after five restarts was not restarted within the minute its check
// allows. A run would measure that back-off, not the fault.
func (r *samplesRun) freshPods(t *testing.T, calleeReplicas int32) {
	t.Helper()
	ctx := t.Context()
	var callee, caller bool
	for _, x := range []struct {
		label, id string
		hit       *bool
	}{{"hcp.io/callee", calleeID, &callee}, {"hcp.io/caller", callerID, &caller}} {
		pods := &corev1.PodList{}
		if err := r.c.List(ctx, pods, client.InNamespace(r.ns), client.MatchingLabels{x.label: x.id}); err != nil {
			t.Fatal(err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			n := restarts(p)
			if n == 0 || p.DeletionTimestamp != nil {
				continue
			}
			t.Logf("replacing pod %s before the run: its containers restarted %d times", p.Name, n)
			if err := r.c.Delete(ctx, p); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			*x.hit = true
		}
	}
	if callee {
		r.setCalleeReplicas(t, calleeReplicas)
	}
	if caller {
		r.refreshCaller(t)
		eventually(t, readyTimeout, "the new caller pod's app answers", func(ctx context.Context) error {
			_, err := r.received(ctx)
			return err
		})
	}
}

// restarts is the sum of the restart counts of p's containers, its native
// sidecar (an init container) included.
func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		n += s.RestartCount
	}
	return n
}

// logPods logs, for a failed run, every callee and caller container's log,
// and the previous run's of each that restarted (a fault's kill): the next
// run replaces those pods (freshPods), and the suite's dump at the end
// shows only the pods left then. A session stalled on a pod is explained
// by its sidecar's and its harness's logs now, not at the end.
func (r *samplesRun) logPods(t *testing.T) {
	ctx := context.WithoutCancel(t.Context())
	for _, label := range []string{"hcp.io/callee", "hcp.io/caller"} {
		pods := &corev1.PodList{}
		if err := r.c.List(ctx, pods, client.InNamespace(r.ns), client.HasLabels{label}); err != nil {
			t.Logf("listing the %s pods: %v", label, err)
			continue
		}
		for _, p := range pods.Items {
			for _, s := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
				if s.RestartCount > 0 {
					out, err := r.kubectl(ctx, nil, "logs", "--previous", "--tail=400", "-n", r.ns, p.Name, "-c", s.Name)
					t.Logf("pod %s container %s (restarted %d times), its previous run's log (%v):\n%s", p.Name, s.Name, s.RestartCount, err, indent(out))
				}
				out, err := r.kubectl(ctx, nil, "logs", "--tail=400", "-n", r.ns, p.Name, "-c", s.Name)
				t.Logf("pod %s container %s, its log (%v):\n%s", p.Name, s.Name, err, indent(out))
			}
		}
	}
}
