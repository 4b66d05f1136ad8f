package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CalleeSpec declares a callee harness: what it can do, where it listens and
// how its pods run.
type CalleeSpec struct {
	// calleeID is the callee's protocol id (routing key of its command queue
	// hcp.cmd.{calleeID}). Defaults to metadata.name; immutable.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`
	CalleeID string `json:"calleeID,omitempty"`

	// broker the callee connects to. Immutable but for broker.tls: moving a
	// live callee to another broker or vhost would strand its sessions;
	// recreate it instead.
	// +optional
	// +kubebuilder:default={vhost: "/hcp"}
	// +kubebuilder:validation:XValidation:rule="has(self.rabbitmqClusterReference) == has(oldSelf.rabbitmqClusterReference) && (!has(self.rabbitmqClusterReference) || self.rabbitmqClusterReference == oldSelf.rabbitmqClusterReference) && has(self.vhost) == has(oldSelf.vhost) && (!has(self.vhost) || self.vhost == oldSelf.vhost) && (has(self.createVhost) && self.createVhost) == (has(oldSelf.createVhost) && oldSelf.createVhost) && has(self.vhostDeletionPolicy) == has(oldSelf.vhostDeletionPolicy) && (!has(self.vhostDeletionPolicy) || self.vhostDeletionPolicy == oldSelf.vhostDeletionPolicy)",message="spec.broker is immutable except spec.broker.tls; delete and recreate the Callee to move it"
	Broker BrokerSpec `json:"broker,omitempty"`

	// capabilities the callee offers. A task naming any other capability is
	// rejected with reason unknown_capability.
	// +required
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Capabilities []Capability `json:"capabilities"`

	// commandQueue sets the limits of the quorum queue hcp.cmd.{calleeID}.
	// Commands carry no TTL (L1): they wait as long as the callee exists.
	// +optional
	CommandQueue CommandQueueSpec `json:"commandQueue,omitempty"`

	// harness describes the callee's pods. Required: a callee without a
	// harness cannot execute anything.
	// +required
	Harness HarnessSpec `json:"harness"`

	// sidecar tunes the injected hcp-sidecar.
	// +optional
	Sidecar SidecarSpec `json:"sidecar,omitempty"`

	// sessions sets session limits and housekeeping.
	// +optional
	// +kubebuilder:default={}
	Sessions SessionsSpec `json:"sessions,omitempty"`
}

// Capability is one thing a callee can do, with its L3 safety
// characteristics.
type Capability struct {
	// name of the capability, as named by task_submit.capability.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?$`
	Name string `json:"name"`

	// description for humans and for callers discovering capabilities.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Description string `json:"description,omitempty"`

	// riskLevel is the capability's base risk: a task is never assessed below it.
	// +required
	RiskLevel RiskLevel `json:"riskLevel"`

	// dataClassification is the most sensitive data class the capability may
	// handle; tasks declaring a higher class are rejected.
	// +required
	DataClassification DataClass `json:"dataClassification"`

	// maxDuration caps a session of this capability (ISO 8601); a task asking
	// for longer is rejected, a session running longer fails with "timeout".
	// +optional
	MaxDuration ISO8601Duration `json:"maxDuration,omitempty"`

	// inputSchema is a JSON Schema describing task_submit.inputs, published
	// for callers. The sidecar checks that inputs is an object; the harness
	// validates the contents.
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	InputSchema *apiextensionsv1.JSON `json:"inputSchema,omitempty"`

	// safetyEnvelope describes the physical and logical limits execution must
	// stay within (free-form; passed to the harness with every task).
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	SafetyEnvelope *apiextensionsv1.JSON `json:"safetyEnvelope,omitempty"`
}

// CommandQueueSpec sets the limits of a callee's command queue.
type CommandQueueSpec struct {
	// maxLength is x-max-length: the most commands the queue holds. New
	// commands beyond it are refused (x-overflow reject-publish), so a caller
	// learns of it through its publisher confirm instead of losing the oldest
	// command silently.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxLength *int64 `json:"maxLength,omitempty"`

	// maxLengthBytes is x-max-length-bytes.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxLengthBytes *int64 `json:"maxLengthBytes,omitempty"`

	// deliveryLimit is x-delivery-limit: a command returned to the queue
	// this many times is taken out of it by the broker, into the Callee's
	// dead-letter queue hcp.dlq.cmd.{calleeID} (where the command queue
	// dead-letters, as does a command the sidecar rejects without
	// requeue). The sidecar answers first: a
	// task_submit it could not process by then is rejected to its caller
	// (reason internal).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	DeliveryLimit *int32 `json:"deliveryLimit,omitempty"`
}

// SessionsSpec sets session limits and housekeeping for a callee.
type SessionsSpec struct {
	// defaultMaxDuration applies when neither the task nor the capability
	// sets a max duration.
	// +optional
	// +kubebuilder:default="PT1H"
	DefaultMaxDuration ISO8601Duration `json:"defaultMaxDuration,omitempty"`

	// abortTimeout bounds cleanup after an abort: a session still ABORTING
	// after it is closed as ABORTED by the sidecar.
	// +optional
	// +kubebuilder:default="PT30S"
	AbortTimeout ISO8601Duration `json:"abortTimeout,omitempty"`

	// statusUpdateInterval is the most often an HCPSession status is written
	// while a session runs (its progress); state changes are written at once.
	// +optional
	// +kubebuilder:default="PT1S"
	StatusUpdateInterval ISO8601Duration `json:"statusUpdateInterval,omitempty"`

	// statusWritesPerSecond is each sidecar replica's budget of HCPSession
	// writes (status and state label, all its sessions together; a token
	// bucket with bursts of twice as many). State changes go first; progress
	// beyond the budget is coalesced further. Read when a sidecar starts.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=50
	StatusWritesPerSecond *int32 `json:"statusWritesPerSecond,omitempty"`

	// ttlAfterFinished deletes HCPSessions this long after they reached a
	// terminal state.
	// +optional
	// +kubebuilder:default="P1D"
	TTLAfterFinished ISO8601Duration `json:"ttlAfterFinished,omitempty"`

	// ownerLeaseDuration is how long a replica's sessions wait, after its
	// last sign of life (the renewal of its pod's Lease), before another
	// replica takes them over; a session with no checkpoint to resume from
	// then fails with reason harness_lost. The owner stops publishing a
	// sixth of it before it expires. Read when a sidecar starts; at least
	// PT15S.
	// +optional
	// +kubebuilder:default="PT60S"
	OwnerLeaseDuration ISO8601Duration `json:"ownerLeaseDuration,omitempty"`

	// ttlAfterRejected deletes HCPSessions of rejected tasks this long after
	// the rejection, so that a flood of refused submits does not fill etcd.
	// The record only has to outlive redeliveries of the task_submit (a
	// duplicate then gets the original reply); one the callee sees after it
	// is decided again.
	// +optional
	// +kubebuilder:default="PT10M"
	TTLAfterRejected ISO8601Duration `json:"ttlAfterRejected,omitempty"`

	// maxConcurrent caps sessions running at once on this callee (all
	// replicas); tasks beyond it are rejected with concurrency_limit.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxConcurrent *int32 `json:"maxConcurrent,omitempty"`
}

// CalleeStatus is the observed state of a Callee.
type CalleeStatus struct {
	// observedGeneration is the generation the status describes; 0 (the
	// default) until the operator first writes the status, so that a new
	// object reads as not yet observed (kstatus: InProgress).
	// +kubebuilder:default=0
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: TopologyReady, HarnessReady, Ready, and
	// SidecarUpdatePending while spec.sidecar.updatePolicy OnDrain holds a
	// sidecar update back.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// calleeID in effect (spec.calleeID or metadata.name).
	// +optional
	CalleeID string `json:"calleeID,omitempty"`

	// vhost in effect.
	// +optional
	Vhost string `json:"vhost,omitempty"`

	// commandQueue is the name of the callee's command queue.
	// +optional
	CommandQueue string `json:"commandQueue,omitempty"`

	// username is the callee's broker user (the AMQP user_id of its events).
	// +optional
	Username string `json:"username,omitempty"`

	// credentialsSecret holds the callee's broker credentials.
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`

	// tokenPublicKey is the PEM Ed25519 public key that verifies this
	// callee's session tokens.
	// +optional
	TokenPublicKey string `json:"tokenPublicKey,omitempty"`

	// replicas is the number of harness pods.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// readyReplicas is the number of harness pods ready.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// selector selects the harness pods (label selector syntax), for the
	// /scale subresource: kubectl scale, HorizontalPodAutoscalers, KEDA.
	// +optional
	Selector string `json:"selector,omitempty"`

	// activeSessions counts this callee's HCPSessions not in a terminal state.
	// +optional
	ActiveSessions int32 `json:"activeSessions,omitempty"`
}

// ConditionSidecarUpdatePending is on a Callee whose spec.sidecar.updatePolicy
// is OnDrain while a changed sidecar waits for its active sessions to end;
// it is removed once the new sidecar is rolled out.
const ConditionSidecarUpdatePending = "SidecarUpdatePending"

// ReasonSessionsActive: the sidecar update waits for active sessions.
const ReasonSessionsActive = "SessionsActive"

// Callee is a callee harness: a program that executes HCP tasks, deployed
// with the hcp-sidecar and given its own command queue and broker user.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.harness.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=hcpcallee;hcpce,categories=hcp
// +kubebuilder:printcolumn:name="ID",type=string,JSONPath=`.status.calleeID`
// +kubebuilder:printcolumn:name="Queue",type=string,JSONPath=`.status.commandQueue`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Active",type=integer,JSONPath=`.status.activeSessions`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Vhost",type=string,JSONPath=`.status.vhost`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="has(self.spec.calleeID) || self.metadata.name.matches('^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$')",message="metadata.name is not a valid callee id (lowercase letters, digits, '-' and '_', at most 63): set spec.calleeID",fieldPath=`.spec.calleeID`
// +kubebuilder:validation:XValidation:rule="(has(self.spec.calleeID) ? self.spec.calleeID : self.metadata.name) == (has(oldSelf.spec.calleeID) ? oldSelf.spec.calleeID : oldSelf.metadata.name)",message="spec.calleeID is immutable",fieldPath=`.spec.calleeID`
type Callee struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec CalleeSpec `json:"spec"`

	// status is the observed state, written by the operator;
	// {observedGeneration: 0} until its first write (see observedGeneration).
	// +kubebuilder:default={}
	Status CalleeStatus `json:"status,omitempty"`
}

// ID returns the callee id in effect: spec.calleeID or metadata.name.
func (c *Callee) ID() string {
	if c.Spec.CalleeID != "" {
		return c.Spec.CalleeID
	}
	return c.Name
}

// +kubebuilder:object:root=true

// CalleeList contains a list of Callee.
type CalleeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Callee `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Callee{}, &CalleeList{})
}
