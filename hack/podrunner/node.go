package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	leaseDuration     = 40 * time.Second
	leaseRenew        = 10 * time.Second
	nodeStatusRefresh = time.Minute
)

func (r *runner) nodeLabels() map[string]string {
	return map[string]string{
		corev1.LabelHostname:   r.o.nodeName,
		corev1.LabelOSStable:   runtime.GOOS,
		corev1.LabelArchStable: runtime.GOARCH,
		"hcp.io/pod-runner":    "true",
	}
}

func (r *runner) nodeStatus(now metav1.Time) corev1.NodeStatus {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    r.o.cpu,
		corev1.ResourceMemory: r.o.memory,
		corev1.ResourcePods:   *resource.NewQuantity(int64(r.o.maxPods), resource.DecimalSI),
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	machineID, _ := os.ReadFile("/etc/machine-id")
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: r.started}
	}
	return corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "memory is not enforced by the local pod runner"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "disk is not enforced by the local pod runner"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "pids are not enforced by the local pod runner"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "the local pod runner is posting ready status"),
		},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: r.hostIP},
			{Type: corev1.NodeHostName, Address: r.o.nodeName},
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(r.o.kubeletPort)}},
		NodeInfo: corev1.NodeSystemInfo{
			MachineID:               strings.TrimSpace(string(machineID)),
			KernelVersion:           unix.ByteSliceToString(uts.Release[:]),
			OSImage:                 "local processes (hcp-operator pod runner, no container runtime)",
			ContainerRuntimeVersion: "hcp-podrunner://" + r.o.kubernetesVersion,
			KubeletVersion:          r.o.kubernetesVersion,
			OperatingSystem:         runtime.GOOS,
			Architecture:            runtime.GOARCH,
		},
	}
}

// registerNode creates the Node, or takes over the one a previous run left.
func (r *runner) registerNode(ctx context.Context) error {
	now := metav1.Now()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: r.o.nodeName, Labels: r.nodeLabels()}}
	created, err := r.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": r.nodeLabels()}})
		if _, err := r.cs.CoreV1().Nodes().Patch(ctx, r.o.nodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("update node %s: %w", r.o.nodeName, err)
		}
	case err != nil:
		return fmt.Errorf("register node %s: %w", r.o.nodeName, err)
	default:
		r.log.Info("Registered node", "node", created.Name)
	}
	if err := r.updateNodeStatus(ctx, now); err != nil {
		return err
	}
	return r.renewLease(ctx)
}

func (r *runner) updateNodeStatus(ctx context.Context, now metav1.Time) error {
	patch, _ := json.Marshal(map[string]any{"status": r.nodeStatus(now)})
	_, err := r.cs.CoreV1().Nodes().PatchStatus(ctx, r.o.nodeName, patch)
	if err != nil {
		return fmt.Errorf("update node status: %w", err)
	}
	return nil
}

func (r *runner) renewLease(ctx context.Context) error {
	leases := r.cs.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, r.o.nodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err := r.cs.CoreV1().Nodes().Get(ctx, r.o.nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: r.o.nodeName, Namespace: corev1.NamespaceNodeLease,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &r.o.nodeName, LeaseDurationSeconds: new(int32(leaseDuration / time.Second)), RenewTime: &now},
		}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.HolderIdentity = &r.o.nodeName
	l.Spec.LeaseDurationSeconds = new(int32(leaseDuration / time.Second))
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// heartbeat keeps the Lease and the Ready condition fresh, so the node
// lifecycle controller does not taint the node and evict its pods.
func (r *runner) heartbeat(ctx context.Context) {
	lease := time.NewTicker(leaseRenew)
	status := time.NewTicker(nodeStatusRefresh)
	defer lease.Stop()
	defer status.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-lease.C:
			if err := r.renewLease(ctx); err != nil && ctx.Err() == nil {
				r.log.Error("Renewing the node lease failed", "err", err)
			}
		case <-status.C:
			if err := r.updateNodeStatus(ctx, metav1.Now()); err != nil && ctx.Err() == nil {
				r.log.Error("Updating the node status failed", "err", err)
			}
		}
	}
}
