package controller

import (
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// Options configure the Callee and Caller reconcilers.
type Options struct {
	// DefaultBroker is used when a Callee or Caller names no broker
	// (--default-connection-secret); nil means none.
	DefaultBroker *resource.DefaultBroker
	// SidecarImage is the hcp-sidecar image (--sidecar-image).
	SidecarImage string
	// CalleeSidecarClusterRole is the ClusterRole each callee sidecar is
	// granted in its namespace (--callee-sidecar-cluster-role; the install
	// ships it: resource.CalleeSidecarClusterRole); empty means
	// resource.DefaultCalleeSidecarClusterRole.
	CalleeSidecarClusterRole string
	// SidecarTracing switches on the sidecars' span export
	// (--sidecar-otlp-endpoint, --sidecar-otlp-protocol).
	SidecarTracing resource.SidecarTracing
	// WatchNamespaces restricts the manager to these namespaces; empty
	// means all.
	WatchNamespaces []string
	// FirstStatusWait is how long a new Callee or Caller may go without a
	// status while its first rollout only waits (statusPace.holdFirst;
	// DefaultFirstStatusWait); 0 writes every wait at once.
	FirstStatusWait time.Duration
}

// AddToScheme registers every type the manager uses: core Kubernetes, the
// hcp.io API and the topology operator's v1beta1.
func AddToScheme(s *runtime.Scheme) error {
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, hcpv1alpha1.AddToScheme, topologyv1beta1.AddToScheme} {
		if err := add(s); err != nil {
			return err
		}
	}
	return nil
}

// The controllers, by the name they carry in logs and in the controller
// label of controller-runtime's metrics, and the kind each reconciles.
const (
	ControllerCallee           = "callee"
	ControllerCaller           = "caller"
	ControllerCapabilityPolicy = "capabilitypolicy"
	ControllerHCPSession       = "hcpsession"
)

var controllerKinds = map[string]string{
	ControllerCallee:           "Callee",
	ControllerCaller:           "Caller",
	ControllerCapabilityPolicy: "CapabilityPolicy",
	ControllerHCPSession:       "HCPSession",
}
