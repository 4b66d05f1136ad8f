//go:build e2e

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// node checks what a kubelet and a container runtime give the harness pods
// and that the project's images run as the chart says: the sidecar a
// native sidecar started before the harness, kubectl logs and exec, and,
// on the local stack's node, read off the kernel for the sidecar's
// process: a read-only root filesystem, the non-root user, no
// capabilities, no_new_privs and its memory limit as a cgroup limit.
func (r *samplesRun) node(t *testing.T) {
	ctx := t.Context()
	pod := r.calleePod
	var sidecar *corev1.Container
	for i, c := range pod.Spec.InitContainers {
		if c.Name == "hcp-sidecar" {
			sidecar = &pod.Spec.InitContainers[i]
		}
	}
	if sidecar == nil || sidecar.RestartPolicy == nil || *sidecar.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("pod %s: hcp-sidecar is not a native sidecar (an init container with restartPolicy Always)", pod.Name)
	}
	fresh := &corev1.Pod{}
	if err := r.c.Get(ctx, client.ObjectKeyFromObject(pod), fresh); err != nil {
		t.Fatal(err)
	}
	started := map[string]corev1.ContainerStatus{}
	for _, cs := range append(fresh.Status.InitContainerStatuses, fresh.Status.ContainerStatuses...) {
		started[cs.Name] = cs
	}
	sc, app := started["hcp-sidecar"], started[pod.Spec.Containers[0].Name]
	if sc.State.Running == nil || app.State.Running == nil {
		t.Fatalf("pod %s: sidecar %+v, harness %+v: want both running", pod.Name, sc.State, app.State)
	}
	if app.State.Running.StartedAt.Before(&sc.State.Running.StartedAt) && sc.RestartCount == 0 {
		t.Errorf("harness started at %s, before its sidecar (%s)", app.State.Running.StartedAt, sc.State.Running.StartedAt)
	}

	logs, err := r.kubectl(ctx, nil, "logs", "-n", pod.Namespace, pod.Name, "-c", "hcp-sidecar", "--tail=5")
	if err != nil || strings.TrimSpace(logs) == "" {
		t.Errorf("kubectl logs -c hcp-sidecar: %q, %v", logs, err)
	}
	// The app image has no shell: exec its binary with a flag it refuses;
	// only the binary, run inside the container, prints that refusal.
	_, err = r.kubectl(ctx, nil, "exec", "-n", r.callerPod.Namespace, r.callerPod.Name, "-c", r.callerPod.Spec.Containers[0].Name,
		"--", "/sample-caller", "submit", "--no-such-flag")
	if err == nil || !strings.Contains(err.Error(), "flag provided but not defined: -no-such-flag") {
		t.Errorf("kubectl exec /sample-caller submit --no-such-flag in the caller pod: %v; want the binary's refusal", err)
	}

	if r.cfg.existing {
		return
	}
	n := &corev1.Node{}
	if err := r.c.Get(ctx, client.ObjectKey{Name: fresh.Spec.NodeName}, n); err != nil {
		t.Fatal(err)
	}
	if rt := n.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(rt, "containerd://") {
		t.Errorf("node %s runs %q, want containerd", n.Name, rt)
	}
	pidOut, err := output(ctx, filepath.Join(r.cfg.root, "hack", "local-stack.sh"), "pid", pod.Namespace+"/"+pod.Name, "hcp-sidecar")
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(pidOut)
	status := procFields(t, "/proc/"+pid+"/status")
	for field, want := range map[string]string{"Uid": "65532", "CapEff": "0000000000000000", "NoNewPrivs": "1"} {
		if got := status[field]; got == "" || strings.Fields(got)[0] != want {
			t.Errorf("sidecar process %s: %s %q, want %s", pid, field, got, want)
		}
	}
	if opts := rootMountOptions(t, pid); !strings.Contains(","+opts+",", ",ro,") {
		t.Errorf("sidecar process %s: root filesystem mounted %q, want read-only", pid, opts)
	}
	limit := sidecar.Resources.Limits.Memory().Value()
	cg := memoryCgroup(t, pid)
	got, err := os.ReadFile(cg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != fmt.Sprint(limit) {
		t.Errorf("sidecar memory cgroup (%s): limit %s, want the pod spec's %d", cg, got, limit)
	}
	t.Logf("node %s (%s): sidecar pid %s uid 65532, no capabilities, no_new_privs, read-only root, memory limit %d in %s",
		n.Name, n.Status.NodeInfo.ContainerRuntimeVersion, pid, limit, cg)
}

// procFields reads a /proc/PID/status-like file: "Name:\tvalue" lines.
func procFields(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// rootMountOptions: the mount options of "/" as the process sees it
// (mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ...).
func rootMountOptions(t *testing.T, pid string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + pid + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[4] == "/" {
			return f[5]
		}
	}
	return ""
}

// memoryCgroup: the file holding the process's memory limit: cgroup v1's
// memory controller (memory.limit_in_bytes) or cgroup v2's unified
// hierarchy (memory.max).
func memoryCgroup(t *testing.T, pid string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var unified string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if strings.Contains(","+f[1]+",", ",memory,") {
			return filepath.Join("/sys/fs/cgroup/memory", f[2], "memory.limit_in_bytes")
		}
		if f[0] == "0" && f[1] == "" {
			unified = filepath.Join("/sys/fs/cgroup", f[2], "memory.max")
		}
	}
	if unified == "" {
		t.Fatalf("pid %s: no memory cgroup in /proc/%s/cgroup", pid, pid)
	}
	return unified
}
