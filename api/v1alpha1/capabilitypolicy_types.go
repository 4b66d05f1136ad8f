package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CapabilityPolicySpec says which callers may invoke which capabilities of
// the selected callees, within which limits. Policies are default deny: a
// task is admitted only when some rule of some policy selecting the callee
// admits it; when several rules admit it, the tightest limits apply.
type CapabilityPolicySpec struct {
	// calleeSelector selects Callees in the policy's namespace by label. An
	// empty selector selects every Callee in the namespace.
	// +required
	CalleeSelector metav1.LabelSelector `json:"calleeSelector"`

	// rules of the policy; a task must be admitted by at least one.
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(r, !has(r.name) || self.exists_one(s, has(s.name) && s.name == r.name))",message="rule names must be unique within a policy"
	Rules []PolicyRule `json:"rules"`
}

// PolicyRule admits some callers to some capabilities within limits.
type PolicyRule struct {
	// name of the rule, for status and audit logs.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name,omitempty"`

	// callers the rule admits.
	// +required
	Callers CallerMatch `json:"callers"`

	// capabilities the rule admits: capability names, where '*' matches any
	// run of characters (for example "synthesis.*" or "*").
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9._*-]+$`
	Capabilities []string `json:"capabilities"`

	// maxRiskLevel is the highest assessed risk the rule admits.
	// +required
	MaxRiskLevel RiskLevel `json:"maxRiskLevel"`

	// dataClassifications the rule admits; omitted admits every class the
	// capability itself may handle.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=4
	DataClassifications []DataClass `json:"dataClassifications,omitempty"`

	// maxDuration is the longest session the rule admits (ISO 8601).
	// +optional
	MaxDuration ISO8601Duration `json:"maxDuration,omitempty"`

	// maxConcurrentSessions caps the non-terminal sessions of one caller on
	// one callee: the rule admits a new task only while the caller has fewer
	// sessions on the callee than this, counting all of them (sessions do not
	// record which rule admitted them).
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxConcurrentSessions *int32 `json:"maxConcurrentSessions,omitempty"`
}

// CallerMatch selects callers by id or by label.
// +kubebuilder:validation:XValidation:rule="(has(self.ids) && size(self.ids) > 0) || has(self.selector)",message="set callers.ids or callers.selector"
type CallerMatch struct {
	// ids are caller ids ("*" admits every caller).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:Pattern=`^(\*|[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?)$`
	IDs []string `json:"ids,omitempty"`

	// selector selects Callers in the policy's namespace by label.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}

// CapabilityPolicyStatus is the observed state of a CapabilityPolicy.
type CapabilityPolicyStatus struct {
	// observedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: RulesMatched, Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// matchedCallees are the ids of the Callees the policy selects.
	// +optional
	// +listType=set
	MatchedCallees []string `json:"matchedCallees,omitempty"`

	// matchedCallers are the ids of the Callers the policy's rules admit, as
	// far as they exist as Caller objects in the namespace.
	// +optional
	// +listType=set
	MatchedCallers []string `json:"matchedCallers,omitempty"`
}

// CapabilityPolicy admits callers to callee capabilities (the L3 policy gate).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=hcppolicy;cappol,categories=hcp
// +kubebuilder:printcolumn:name="Callees",type=string,JSONPath=`.status.matchedCallees`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="RulesMatched")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CapabilityPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   CapabilityPolicySpec   `json:"spec"`
	Status CapabilityPolicyStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// CapabilityPolicyList contains a list of CapabilityPolicy.
type CapabilityPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CapabilityPolicy `json:"items"`
}

func init() {
	SchemeBuilder.Register(&CapabilityPolicy{}, &CapabilityPolicyList{})
}
