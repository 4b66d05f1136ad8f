package resource

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
)

// AnnotationSidecarHash on the pod template is the hash of the injected
// sidecar container. With hcp.io/config-hash (everything else) it tells a
// sidecar-only change from any other (spec.sidecar.updatePolicy).
const AnnotationSidecarHash = "hcp.io/sidecar-hash"

// DrainPath is the sidecar's drain endpoint on its probe port: it blocks
// until the sidecar has stopped taking tasks, had the app checkpoint and
// handed its sessions over (caller mode: recorded its positions), then
// answers 200. It answers 409 at once unless the sidecar's pod is being
// deleted.
const DrainPath = "/drain"

// DrainHook is the preStop hook the operator gives each harness container
// that has none of its own.
//
// The kubelet runs a container's preStop hook before it sends the container
// SIGTERM, and native sidecars get SIGTERM only after every regular
// container has exited. So on a pod deletion the sidecar drains while the
// app still runs (it must, to write its checkpoints), and the app is
// stopped only once its sessions are handed over. Without the hook the app
// would get SIGTERM at once, with sessions still on it.
//
// The port is a number: the kubelet resolves a named port of a hook
// against the ports of the hook's own container, and the probe port is
// declared on the sidecar. The host is left empty: the pod IP (the probe
// server listens on every address of the pod).
//
// Every container calls it; the drain is idempotent and the calls return
// together. When the pod is not being deleted (a container restarted after
// a failed liveness probe) the sidecar answers 409 and the hook returns at
// once.
//
// Time: the hook, the app's exit after SIGTERM and the sidecar's own exit
// share the pod's terminationGracePeriodSeconds (Kubernetes' default, 30,
// unless the template sets it; the operator leaves it alone). The kubelet
// counts the grace period from the deletion: whatever the drain takes is
// taken from the app's time to exit (the kubelet still gives it at least 2
// seconds). A drain that outlasts the grace period is cut short: the hook
// is abandoned, the app gets SIGTERM, and whatever is left is killed.
// Sessions of a pod killed before it handed them over are taken over by
// another replica from their last checkpoint. An app whose checkpoint
// takes long needs a longer terminationGracePeriodSeconds in the template.
func DrainHook() *corev1.LifecycleHandler {
	return &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{
		Path:   DrainPath,
		Port:   intstr.FromInt32(config.DefaultProbePort),
		Scheme: corev1.URISchemeHTTP,
	}}
}

// addDrainHooks gives each container without a preStop hook DrainHook. A
// container with its own hook keeps it: the operator does not know what it
// does, and the sidecar drains at the latest when its own SIGTERM comes.
func addDrainHooks(containers []corev1.Container) {
	for i := range containers {
		c := &containers[i]
		if c.Lifecycle == nil {
			c.Lifecycle = &corev1.Lifecycle{}
		}
		if c.Lifecycle.PreStop == nil {
			c.Lifecycle.PreStop = DrainHook()
		}
	}
}
