package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// RiskLevel is the L3 risk level of a capability or task, from R1 (lowest)
// to R5 (highest).
// +kubebuilder:validation:Enum=R1;R2;R3;R4;R5
type RiskLevel string

// Risk levels, in increasing order.
const (
	RiskR1 RiskLevel = "R1"
	RiskR2 RiskLevel = "R2"
	RiskR3 RiskLevel = "R3"
	RiskR4 RiskLevel = "R4"
	RiskR5 RiskLevel = "R5"
)

// DataClass is the L3 sensitivity tag of data involved in a task, from T1
// (public) to T4 (most sensitive).
// +kubebuilder:validation:Enum=T1;T2;T3;T4
type DataClass string

// Data classes, in increasing order of sensitivity.
const (
	DataT1 DataClass = "T1"
	DataT2 DataClass = "T2"
	DataT3 DataClass = "T3"
	DataT4 DataClass = "T4"
)

// ISO8601Duration is a duration in ISO 8601 form limited to days, hours,
// minutes and seconds (for example PT72H, PT2H15M, P1DT12H, PT30S). Years,
// months and weeks are refused: their length is ambiguous.
// +kubebuilder:validation:Pattern=`^P([0-9]+D|([0-9]+D)?T([0-9]+H([0-9]+M)?([0-9]+(\.[0-9]+)?S)?|[0-9]+M([0-9]+(\.[0-9]+)?S)?|[0-9]+(\.[0-9]+)?S))$`
// +kubebuilder:validation:MaxLength=32
type ISO8601Duration string

// BrokerSpec says which RabbitMQ broker and vhost a harness uses.
type BrokerSpec struct {
	// rabbitmqClusterReference names the broker, exactly as the RabbitMQ
	// messaging-topology-operator understands it: a RabbitmqCluster by name, or
	// a connection Secret (keys uri, username, password; label
	// rabbitmq.com/topology-operator: "true"). Omitted: the manager's
	// configured default broker (flag --default-connection-secret).
	// +optional
	RabbitmqClusterReference *RabbitmqClusterReference `json:"rabbitmqClusterReference,omitempty"`

	// vhost is the AMQP virtual host holding the HCP exchanges and queues.
	// +optional
	// +kubebuilder:default="/hcp"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[^\s]+$`
	Vhost string `json:"vhost,omitempty"`

	// createVhost asks the operator to declare the vhost (a topology-operator
	// Vhost object). Without it the vhost must already exist on the broker.
	// +optional
	CreateVhost bool `json:"createVhost,omitempty"`

	// vhostDeletionPolicy applies to a vhost the operator created: retain
	// (default) keeps it on the broker when the last user goes; delete removes
	// it, and with it everything it holds.
	// +optional
	// +kubebuilder:default=retain
	// +kubebuilder:validation:Enum=retain;delete
	VhostDeletionPolicy string `json:"vhostDeletionPolicy,omitempty"`

	// tls makes the injected sidecar connect with AMQP over TLS (amqps://,
	// port 5671 unless the connection Secret's amqpURL names another) and
	// gives it the CA bundle and client certificate to use. Unlike the rest
	// of spec.broker it may change: it does not move the callee or caller
	// to another broker, and a change rolls the harness pods. For an
	// external Caller it only switches the credentials Secret's uri to
	// amqps; the program brings its own CA and certificate.
	// +optional
	TLS *BrokerTLS `json:"tls,omitempty"`
}

// BrokerTLS names the Secrets, in the object's namespace, that the sidecar
// uses for AMQP over TLS. The operator mounts them read-only into the
// hcp-sidecar container only (the harness containers do not see them) and
// rolls the harness pods when their content changes (cert-manager
// renewals included). The manager sees only Secrets labelled
// rabbitmq.com/topology-operator: "true" (its cache is restricted to that
// label), so both need it.
type BrokerTLS struct {
	// caSecret is a Secret whose key ca.crt holds the PEM CA bundle the
	// broker's certificate must chain to (a cert-manager Certificate's
	// Secret has one). Omitted: the roots in the sidecar image.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	CASecret string `json:"caSecret,omitempty"`

	// clientCertSecret is a Secret of type kubernetes.io/tls (keys tls.crt
	// and tls.key) with the client certificate for mutual TLS. The sidecar
	// still logs in with its username and password; the certificate adds
	// mutual TLS, it does not replace the password.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	ClientCertSecret string `json:"clientCertSecret,omitempty"`
}

// RabbitmqClusterReference mirrors the topology operator's reference type so
// that this API depends on core Kubernetes types only. Exactly one of name and
// connectionSecret is set.
// +kubebuilder:validation:XValidation:rule="has(self.name) != has(self.connectionSecret)",message="exactly one of name and connectionSecret must be set"
type RabbitmqClusterReference struct {
	// name of a RabbitmqCluster (rabbitmq/cluster-operator).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`

	// namespace of the RabbitmqCluster; defaults to the object's namespace.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// connectionSecret names a Secret in the object's namespace with keys uri
	// (the management API URL), username and password.
	// +optional
	ConnectionSecret *corev1.LocalObjectReference `json:"connectionSecret,omitempty"`
}

// HarnessSpec describes the harness pods; the operator injects the
// hcp-sidecar container next to the user's containers.
type HarnessSpec struct {
	// replicas of the harness Deployment. Callee replicas are competing
	// consumers of the command queue; sessions survive replica loss through
	// HCPSession objects.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Replicas *int32 `json:"replicas,omitempty"`

	// port on which the harness container serves the local HCP HTTP API
	// (tasks for a callee, events for a caller app) on localhost.
	// +optional
	// +kubebuilder:default=8080
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`

	// template is the pod template of the harness: the user's container(s),
	// volumes, scheduling. The operator adds the hcp-sidecar as a native
	// sidecar (the first init container, restartPolicy Always), its volumes
	// and the ServiceAccount, and gives every container without a preStop
	// hook of its own one that drains the sidecar first. The drain must fit
	// in terminationGracePeriodSeconds (Kubernetes' default, 30, when
	// unset): raise it when the app needs longer to checkpoint.
	// +required
	Template corev1.PodTemplateSpec `json:"template"`

	// podDisruptionBudget, when set, gets the harness pods a
	// PodDisruptionBudget (named like the Deployment), so that evictions
	// (node drains, cluster autoscaler) take the replicas down a few at a
	// time. Each eviction still drains the pod's sessions to the other
	// replicas. Omitted: no PodDisruptionBudget (one the operator made
	// earlier is deleted).
	// +optional
	PodDisruptionBudget *PodDisruptionBudgetSpec `json:"podDisruptionBudget,omitempty"`
}

// PodDisruptionBudgetSpec is the part of a PodDisruptionBudget the user
// sets; the operator sets its selector to the harness pods. Exactly one of
// minAvailable and maxUnavailable.
// +kubebuilder:validation:XValidation:rule="has(self.minAvailable) != has(self.maxUnavailable)",message="set exactly one of minAvailable and maxUnavailable"
type PodDisruptionBudgetSpec struct {
	// minAvailable harness pods (a number, or a percentage of the
	// replicas) must stay up through voluntary disruptions.
	// +optional
	// +kubebuilder:validation:XIntOrString
	MinAvailable *intstr.IntOrString `json:"minAvailable,omitempty"`

	// maxUnavailable harness pods (a number, or a percentage of the
	// replicas) may be down at once through voluntary disruptions.
	// +optional
	// +kubebuilder:validation:XIntOrString
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// SidecarSpec tunes the injected hcp-sidecar container.
type SidecarSpec struct {
	// image overrides the sidecar image configured in the manager.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`

	// resources of the sidecar container. Defaults: requests 50m CPU, 64Mi
	// memory; limit 256Mi memory.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// prefetch is the AMQP basic.qos prefetch count of the sidecar's consumer.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Prefetch *int32 `json:"prefetch,omitempty"`

	// env adds environment variables to the sidecar container, after the
	// operator's own: the Go runtime's settings (GODEBUG, GOMEMLIMIT,
	// GOMAXPROCS), proxies, OTEL_* (these replace the operator's tracing
	// values). Names starting with HCP_ are the operator's contract with the
	// sidecar and are refused. docs/performance.md ("Choosing settings")
	// has a GODEBUG setting for sidecars that carry steady streams.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(e, !e.name.startsWith('HCP_'))",message="names starting with HCP_ are set by the operator"
	Env []corev1.EnvVar `json:"env,omitempty"`

	// logLevel of the sidecar.
	// +optional
	// +kubebuilder:default=info
	// +kubebuilder:validation:Enum=debug;info;error
	LogLevel string `json:"logLevel,omitempty"`

	// updatePolicy says when a changed sidecar container (a new operator
	// version or sidecar image, or a change of spec.sidecar) reaches running
	// pods. Immediate (the default): at once, through the Deployment's
	// rolling update; each old pod drains its sessions to the other
	// replicas as it goes. OnDrain (Callees only): while the Callee has
	// sessions that are not in a terminal state, the running pods keep
	// their sidecar and the Callee's SidecarUpdatePending condition says so;
	// the new sidecar rolls out once no session is active, or with the
	// next change of anything else in the pod template (that rolls the pods
	// anyway). Changes of the Secrets the sidecar reads always roll at once.
	// +optional
	// +kubebuilder:validation:Enum=Immediate;OnDrain
	UpdatePolicy SidecarUpdatePolicy `json:"updatePolicy,omitempty"`
}

// SidecarUpdatePolicy says when a changed sidecar reaches running pods.
type SidecarUpdatePolicy string

// Sidecar update policies.
const (
	// SidecarUpdateImmediate rolls a changed sidecar out at once.
	SidecarUpdateImmediate SidecarUpdatePolicy = "Immediate"
	// SidecarUpdateOnDrain holds a sidecar-only change while sessions are
	// active.
	SidecarUpdateOnDrain SidecarUpdatePolicy = "OnDrain"
)

// Artifact is a file or dataset produced by a task, referenced by URI.
type Artifact struct {
	// uri of the artifact (binary data is never inlined).
	// +required
	// +kubebuilder:validation:MaxLength=2048
	URI string `json:"uri"`
	// sha256 of the artifact's content, hex.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	SHA256 string `json:"sha256,omitempty"`
	// mediaType of the artifact.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	MediaType string `json:"mediaType,omitempty"`
	// size in bytes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Size int64 `json:"size,omitempty"`
}
