//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// The chaos faults (chaos_test.go runs them). Each runs against fresh
// sessions on the Callee lab-cvd scaled to its replicas; localOnly faults
// act on the local stack's processes (hack/local-stack.sh), on its real
// node.

var faults = []fault{
	{name: "callee sidecar SIGKILL", smoke: true, replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod, _ []string) {
		r.stack(t, "kill", podRef(owner), sidecarContainer, "KILL")
	}},
	{name: "callee sidecar OOM-killed at its memory limit", smoke: true, replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod, _ []string) {
		r.stack(t, "oom", podRef(owner), sidecarContainer)
		r.waitOOMKilled(t, owner, sidecarContainer)
	}},
	{name: "callee app SIGKILL", replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod, _ []string) {
		r.stack(t, "kill", podRef(owner), owner.Spec.Containers[0].Name, "KILL")
	}},
	{name: "callee pod deleted (2 replicas)", smoke: true, replicas: 2, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod, _ []string) {
		if err := r.c.Delete(t.Context(), owner); err != nil {
			t.Fatal(err)
		}
	}},
	// Both ends of the stream replaced at once: the callee pod drains its
	// sessions to the other replica while the caller pod drains its
	// positions, and the new caller pod starts from what the old one
	// wrote. Proves the two hand-overs need nothing from each other.
	{name: "caller pod and owning callee pod deleted together (2 replicas)", smoke: true, replicas: 2, localOnly: true, callerMoves: true, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod, _ []string) {
		for _, p := range []*corev1.Pod{owner, r.callerPod} {
			if err := r.c.Delete(t.Context(), p); err != nil {
				t.Fatal(err)
			}
		}
	}},
	{name: "callee pod lost: frozen, then force-deleted (2 replicas)", replicas: 2, localOnly: true, minRecovery: 50 * time.Second, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod, _ []string) {
		// As a node that vanished: the pod's processes stop at once (no
		// drain, no last status write), then the pod object goes.
		ref := podRef(owner)
		r.stack(t, "kill", ref, sidecarContainer, "STOP")
		r.stack(t, "kill", ref, owner.Spec.Containers[0].Name, "STOP")
		if err := r.c.Delete(t.Context(), owner, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
	}},
	// A partition between one pod and the API server only: the owner
	// cannot renew its Lease, store a checkpoint or write a status, but
	// still reaches the broker, so nothing but its own fence stops it
	// from publishing. Proves the fence closes before another replica
	// may take over (no session goes on sooner than minRecovery, the
	// checker sees no overlap and no stale epoch), and that the healed
	// owner (its Lease renews first, its watch reports the takeover
	// after) publishes nothing more for the sessions it lost.
	{name: "callee owner cut off from the API server only for 90 s, broker reachable (2 replicas)", replicas: 2, localOnly: true,
		minRecovery: 50 * time.Second, settle: 20 * time.Second, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod, _ []string) {
			r.stack(t, "cut-api", podRef(owner), "90")
		}},
	// A process paused past its Lease that then runs on as if nothing
	// happened (a stop-the-world pause, a stalled VM): proves that the
	// resumed sidecar learns it lost its sessions before it publishes
	// anything for them (no (session, sequence) with two bodies, no
	// overlapping steps), and that the other replica waited for the
	// fence.
	{name: "owning callee sidecar paused (SIGSTOP) for twice its Lease, then resumed (2 replicas)", replicas: 2, localOnly: true,
		minRecovery: 50 * time.Second, settle: 20 * time.Second, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod, _ []string) {
			r.pauseOwnerSidecar(t, owner)
		}},
	// A pod gone from the API while its processes run on: a node cut off
	// from the control plane whose pods were force-deleted. Its Lease goes
	// with the pod (owner reference) and its service account token stops
	// working (a bound token names the pod), so it can neither renew nor
	// learn of the takeover: it must stop by its own Lease. Proves that
	// another replica waits a Lease duration after it saw the loss, and
	// that the zombie, still running when the other replica took over,
	// publishes nothing the checker could see.
	{name: "owning callee pod deleted from the API while its processes run on (zombie, 2 replicas)", replicas: 2, localOnly: true,
		minRecovery: 50 * time.Second, settle: 20 * time.Second, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod, ids []string) {
			r.zombieOwner(t, owner, ids)
		}},
	{name: "Callee rolling update (template change, 2 replicas)", replicas: 2, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod, _ []string) {
		r.patchCallee(t, fmt.Sprintf(`{"spec":{"harness":{"template":{"metadata":{"annotations":{"chaos.hcp.io/rollout":%q}}}}}}`, time.Now().Format(time.RFC3339Nano)))
	}},
	// A crash in the middle of a hand-over: the pod that just claimed a
	// drained session (its epoch raised, its harness resuming from the
	// checkpoint, its write-ahead log young) loses its sidecar, and, in a
	// rolling update, may be next to drain. The receiver rather than the
	// draining pod: a drain takes well under a second (see the rolling
	// update's recovery), so a kill aimed at the draining sidecar lands
	// after the hand-over nearly always and tests nothing new, and inside
	// it would be the lost-pod fault again; the receiver is hit while it
	// holds the session. Proves the restarted receiver resumes the session
	// from its log and checkpoint, once.
	{name: "Callee rolling update, the sidecar receiving a hand-over SIGKILLed (2 replicas)", smoke: true, replicas: 2, localOnly: true, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod, ids []string) {
		r.killHandoverReceiver(t, owner, ids)
	}},
	{name: "operator upgrade changing the sidecar (2 replicas)", replicas: 2, localOnly: true, callerMoves: true, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod, _ []string) {
		r.upgradeSidecarImage(t)
	}},
	{name: "caller sidecar SIGKILL", replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod, _ []string) {
		r.stack(t, "kill", podRef(r.callerPod), sidecarContainer, "KILL")
	}},
	{name: "caller pod moved", replicas: 1, callerMoves: true, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod, _ []string) {
		if err := r.c.Delete(t.Context(), r.callerPod); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "broker restart", replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod, _ []string) {
		if r.cfg.rmqNodes != nil { // every node of the cluster
			r.rabbitmqClusterCmd(t, "restart")
			return
		}
		for _, args := range [][]string{{"stop_app"}, {"start_app"}} {
			if out, err := exec.CommandContext(t.Context(), "rabbitmqctl", args...).CombinedOutput(); err != nil {
				t.Fatalf("rabbitmqctl %s: %v\n%s", args[0], err, out)
			}
		}
	}},
	{name: "API server unavailable for 30 s", replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod, _ []string) {
		r.stack(t, "freeze", "kube-apiserver", "30")
	}},
	// An API server outage longer than the fence while the sessions
	// complete: the harnesses finish their last step during the outage
	// (no checkpoints to wait for), the sidecar cannot record the
	// outcome, fences itself after 50 s, and has to get the completion
	// out once the API server is back. Proves no completion is lost and
	// no completed task runs again: every session ends COMPLETED at the
	// app, in its HCPSession and on the wire.
	{name: "API server unavailable for 120 s across the sessions' completion", replicas: 1, localOnly: true,
		task: completionTask, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod, ids []string) {
			r.stack(t, "freeze", "kube-apiserver", "120")
			r.lastStepsRan(t, ids, completionTask.steps)
			r.reconnectCaller(t)
		}},
	// The broker as production runs it (HCP_E2E_RABBITMQ_CLUSTER=1): node 1
	// holds every sidecar's connections and leads the quorum queues.
	// Killed, its clients reconnect to the next node in their list and
	// the queues elect leaders on the other two; it rejoins 30 s later.
	{name: "broker node killed, restarted 30 s later (3-node cluster)", replicas: 1, localOnly: true, cluster: true,
		inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod, _ []string) {
			r.brokerNodeFault(t, "kill", "start", 30*time.Second)
		}},
	// Partitioned from the other two for 60 s: it notices within its net
	// tick (15 s), pauses as the minority and drops its clients, which go
	// on with the majority; healed, it resumes and resyncs.
	{name: "broker node partitioned from the others for 60 s (3-node cluster, pause_minority)", replicas: 1, localOnly: true, cluster: true,
		inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod, _ []string) {
			r.brokerNodeFault(t, "partition", "heal", 60*time.Second)
		}},
}

// waitOOMKilled waits until the kubelet reports that the pod's container
// (a native sidecar: an init container) was OOM-killed and restarted in
// place: the same pod, a higher restart count, last state OOMKilled.
func (r *samplesRun) waitOOMKilled(t *testing.T, pod *corev1.Pod, container string) {
	t.Helper()
	status := func(p *corev1.Pod) *corev1.ContainerStatus {
		for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			if cs.Name == container {
				return &cs
			}
		}
		return nil
	}
	var before int32
	if cs := status(pod); cs != nil {
		before = cs.RestartCount
	}
	eventually(t, time.Minute, fmt.Sprintf("pod %s container %s restarted after an OOM kill", pod.Name, container), func(ctx context.Context) error {
		p := &corev1.Pod{}
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil {
			return err
		}
		cs := status(p)
		if cs == nil {
			return fmt.Errorf("no status of container %s", container)
		}
		if cs.RestartCount <= before || cs.LastTerminationState.Terminated == nil {
			return fmt.Errorf("restart count %d (was %d), last state %+v", cs.RestartCount, before, cs.LastTerminationState)
		}
		if reason := cs.LastTerminationState.Terminated.Reason; reason != "OOMKilled" {
			t.Fatalf("container %s ended with reason %q (exit %d), want OOMKilled", container, reason, cs.LastTerminationState.Terminated.ExitCode)
		}
		return nil
	})
	t.Logf("pod %s: container %s was OOMKilled by the kernel and restarted in place", pod.Name, container)
}

func (r *samplesRun) patchCallee(t *testing.T, patch string) {
	t.Helper()
	cl := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: calleeID}}
	if err := r.c.Patch(t.Context(), cl, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatalf("patching Callee %s with %s: %v", calleeID, patch, err)
	}
}

// upgradeSidecarImage does what an operator upgrade that changes the
// injected sidecar does: the manager restarts with another --sidecar-image
// (the local stack maps every tag to the same binary) and rolls the
// harness pods.
func (r *samplesRun) upgradeSidecarImage(t *testing.T) {
	t.Helper()
	var deps appsv1.DeploymentList
	if err := r.c.List(t.Context(), &deps, client.InNamespace(r.opNS)); err != nil {
		t.Fatal(err)
	}
	for i := range deps.Items {
		d := &deps.Items[i]
		if !isManager(d) {
			continue
		}
		args := d.Spec.Template.Spec.Containers[0].Args
		for j, a := range args {
			if img, ok := strings.CutPrefix(a, "--sidecar-image="); ok {
				repo, _, _ := strings.Cut(img, "@")
				if k := strings.LastIndex(repo, ":"); k > strings.LastIndex(repo, "/") {
					repo = repo[:k]
				}
				next := repo + ":chaos-" + strconv.FormatInt(time.Now().Unix(), 10)
				// The same image under a new tag, as a release would push
				// it: the node has no registry, so it is tagged there.
				r.stack(t, "ctr", "images", "tag", img, next)
				args[j] = "--sidecar-image=" + next
				t.Logf("manager %s: %s → %s", d.Name, a, args[j])
			}
		}
		if err := r.c.Update(t.Context(), d); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no manager Deployment in %s", r.opNS)
}

// completionTask has no checkpoints: a checkpoint is stored in the API
// server before the harness goes on, so with checkpoints a session would
// wait for the API server instead of completing during its outage. What
// is left after the warm-up (14 s) ends well within the 120 s.
var completionTask = chaosTask{steps: 60, stepMS: 250}

func podRef(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }
