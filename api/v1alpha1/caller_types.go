package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CallerSpec declares a caller harness: a program that submits HCP tasks and
// consumes their event streams.
type CallerSpec struct {
	// callerID is the caller's protocol id (its event queue is
	// hcp.evt.{callerID}, bound with {callerID}.#). Defaults to metadata.name;
	// immutable.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`
	CallerID string `json:"callerID,omitempty"`

	// broker the caller connects to. Immutable but for broker.tls.
	// +optional
	// +kubebuilder:default={vhost: "/hcp"}
	// +kubebuilder:validation:XValidation:rule="has(self.rabbitmqClusterReference) == has(oldSelf.rabbitmqClusterReference) && (!has(self.rabbitmqClusterReference) || self.rabbitmqClusterReference == oldSelf.rabbitmqClusterReference) && has(self.vhost) == has(oldSelf.vhost) && (!has(self.vhost) || self.vhost == oldSelf.vhost) && (has(self.createVhost) && self.createVhost) == (has(oldSelf.createVhost) && oldSelf.createVhost) && has(self.vhostDeletionPolicy) == has(oldSelf.vhostDeletionPolicy) && (!has(self.vhostDeletionPolicy) || self.vhostDeletionPolicy == oldSelf.vhostDeletionPolicy)",message="spec.broker is immutable except spec.broker.tls; delete and recreate the Caller to move it"
	Broker BrokerSpec `json:"broker,omitempty"`

	// eventQueue sets TTL and limits of the quorum queue hcp.evt.{callerID}.
	// +optional
	// +kubebuilder:default={}
	EventQueue EventQueueSpec `json:"eventQueue,omitempty"`

	// consumer tunes the event consumer.
	// +optional
	// +kubebuilder:default={}
	Consumer ConsumerSpec `json:"consumer,omitempty"`

	// (A pointer, so that a Caller this version's clients write carries no
	// empty delivery: {} that an older CRD would refuse.)

	// delivery sets how the sidecar gives up on events its app refuses.
	// +optional
	// +kubebuilder:default={}
	Delivery *DeliverySpec `json:"delivery,omitempty"`

	// harness, when set, deploys the caller app with the hcp-sidecar in
	// caller mode. Without it the Caller is external: the operator issues its
	// broker credentials Secret for a program outside the cluster.
	// +optional
	Harness *HarnessSpec `json:"harness,omitempty"`

	// sidecar tunes the injected hcp-sidecar (with a harness only).
	// updatePolicy OnDrain is for Callees: a caller sidecar resumes every
	// stream from its durable positions, so its updates roll at once.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.updatePolicy) || self.updatePolicy == 'Immediate'",message="updatePolicy OnDrain applies to Callees only: a caller sidecar's update rolls at once"
	Sidecar SidecarSpec `json:"sidecar,omitempty"`
}

// EventQueueSpec sets the event queue's TTL and length limits.
// +kubebuilder:validation:XValidation:rule="!has(self.maxLengthBytes) || self.maxLengthBytes > 0",message="maxLengthBytes must be positive"
type EventQueueSpec struct {
	// messageTTL is x-message-ttl: events not consumed within it are stale
	// and discarded (L1 recommends 24 hours).
	// +optional
	// +kubebuilder:default="PT24H"
	MessageTTL ISO8601Duration `json:"messageTTL,omitempty"`

	// maxLength is x-max-length.
	// +optional
	// +kubebuilder:default=100000
	// +kubebuilder:validation:Minimum=1
	MaxLength *int64 `json:"maxLength,omitempty"`

	// maxLengthBytes is x-max-length-bytes.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxLengthBytes *int64 `json:"maxLengthBytes,omitempty"`

	// overflow is x-overflow: drop-head (default, L1: discard the oldest) or
	// reject-publish (the callee's publish is nacked and it retries).
	// +optional
	// +kubebuilder:default=drop-head
	// +kubebuilder:validation:Enum=drop-head;reject-publish
	Overflow string `json:"overflow,omitempty"`
}

// ConsumerSpec tunes the caller's event consumer.
type ConsumerSpec struct {
	// prefetch is basic.qos prefetch_count (L1: 1–100, recommended 10).
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Prefetch int32 `json:"prefetch,omitempty"`

	// appMaxBatch is how many events of a session, when ready together, the
	// sidecar hands to the app in one request. Above 1 the app must serve
	// /hcp/v1/events/batch (docs/harness-api.md, "Batch delivery"). At 1
	// (the default) the sidecar POSTs each event to /hcp/v1/events until
	// the app offers batches itself (answer header HCP-Batch-Max), then
	// batches of up to what it offers. The prefetch bounds what is ready at
	// once.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	AppMaxBatch int32 `json:"appMaxBatch,omitempty"`
	// AppStream sends every delivery to the app over one long-lived
	// full-duplex POST /hcp/v1/events/stream (docs/harness-api.md, "Stream
	// delivery") from the first message on. Off (the default), the sidecar
	// sends requests until the app offers the stream itself (answer header
	// HCP-Stream: 1).
	// +optional
	AppStream bool `json:"appStream,omitempty"`
}

// DeliverySpec sets how the caller sidecar gives up on an event its app
// refuses (docs/reliability.md, "Dead letters").
type DeliverySpec struct {
	// maxAttempts is how many times the app may refuse one event (an answer
	// other than 2xx, or none within the sidecar's app timeout) before the
	// sidecar moves it to the Caller's dead-letter queue hcp.dlq.evt.{callerID}
	// and goes on with the session: the next event the app gets announces it
	// in lost (reason dead_lettered). An app that cannot be reached refuses
	// nothing: its events wait. Answers and results (task_accepted,
	// task_completed, ...) are retried until the app takes them.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxAttempts int32 `json:"maxAttempts,omitempty"`
}

// MaxAttempts is spec.delivery.maxAttempts, 0 when unset (the sidecar's
// default then applies).
func (s *CallerSpec) MaxAttempts() int32 {
	if s.Delivery == nil {
		return 0
	}
	return s.Delivery.MaxAttempts
}

// CallerStatus is the observed state of a Caller.
type CallerStatus struct {
	// observedGeneration is the generation the status describes; 0 (the
	// default) until the operator first writes the status, so that a new
	// object reads as not yet observed (kstatus: InProgress).
	// +kubebuilder:default=0
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: TopologyReady, HarnessReady, Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// callerID in effect (spec.callerID or metadata.name).
	// +optional
	CallerID string `json:"callerID,omitempty"`

	// vhost in effect.
	// +optional
	Vhost string `json:"vhost,omitempty"`

	// eventQueue is the name of the caller's event queue.
	// +optional
	EventQueue string `json:"eventQueue,omitempty"`

	// username is the caller's broker user (the AMQP user_id of its commands).
	// +optional
	Username string `json:"username,omitempty"`

	// credentialsSecret holds the caller's connection details: username,
	// password, vhost, and an amqp(s) URL when the broker address is known.
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`

	// external is true when the Caller has no harness and runs outside the
	// cluster with the credentials Secret.
	// +optional
	External bool `json:"external,omitempty"`

	// replicas is the number of caller harness pods.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// selector selects the harness pods (label selector syntax), for the
	// /scale subresource (a Caller with spec.harness only).
	// +optional
	Selector string `json:"selector,omitempty"`

	// readyReplicas is the number of caller harness pods ready.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// sessionNamespaces are the namespaces other than the Caller's own in
	// which the operator lets the caller sidecar's ServiceAccount get
	// HCPSessions by name and record its position in its own (a Role and
	// RoleBinding hcp-sessions.{namespace}.{name}
	// in each): those where a CapabilityPolicy names the caller id (or "*")
	// for a Callee on the Caller's vhost and broker, and those where
	// HCPSessions of the caller still exist. A sidecar that replaced
	// another pod verifies the sessions of Callees there with it
	// (docs/multi-tenancy.md, "Callers and Callees in different
	// namespaces"). With a harness only.
	// +optional
	// +listType=set
	SessionNamespaces []string `json:"sessionNamespaces,omitempty"`
}

// Caller is a caller harness (an agent or workflow that hands tasks to
// callees), given its own event queue and broker user.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.harness.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=hcpcaller;hcpcr,categories=hcp
// +kubebuilder:printcolumn:name="ID",type=string,JSONPath=`.status.callerID`
// +kubebuilder:printcolumn:name="Queue",type=string,JSONPath=`.status.eventQueue`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Secret",type=string,JSONPath=`.status.credentialsSecret`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="has(self.spec.callerID) || self.metadata.name.matches('^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$')",message="metadata.name is not a valid caller id (lowercase letters, digits, '-' and '_', at most 63): set spec.callerID",fieldPath=`.spec.callerID`
// +kubebuilder:validation:XValidation:rule="(has(self.spec.callerID) ? self.spec.callerID : self.metadata.name) == (has(oldSelf.spec.callerID) ? oldSelf.spec.callerID : oldSelf.metadata.name)",message="spec.callerID is immutable",fieldPath=`.spec.callerID`
type Caller struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec CallerSpec `json:"spec"`

	// status is the observed state, written by the operator;
	// {observedGeneration: 0} until its first write (see observedGeneration).
	// +kubebuilder:default={}
	Status CallerStatus `json:"status,omitempty"`
}

// ID returns the caller id in effect: spec.callerID or metadata.name.
func (c *Caller) ID() string {
	if c.Spec.CallerID != "" {
		return c.Spec.CallerID
	}
	return c.Name
}

// +kubebuilder:object:root=true

// CallerList contains a list of Caller.
type CallerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Caller `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Caller{}, &CallerList{})
}
