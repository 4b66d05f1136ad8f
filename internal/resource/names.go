package resource

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Field manager and label values the operator uses.
const (
	// FieldManager is the field manager of every write the operator makes.
	FieldManager = "hcp-operator"
	// LabelPartOf is app.kubernetes.io/part-of.
	LabelPartOf = "app.kubernetes.io/part-of"
	// PartOfValue is the value of LabelPartOf.
	PartOfValue = "hcp"
	// LabelComponent is app.kubernetes.io/component: callee or caller.
	LabelComponent = "app.kubernetes.io/component"
	// LabelInstance is app.kubernetes.io/instance: the Callee or Caller name.
	LabelInstance = "app.kubernetes.io/instance"
	// LabelTopologyOperator must be on every Secret the topology operator
	// reads; the manager's Secret cache is restricted to it too.
	LabelTopologyOperator = "rabbitmq.com/topology-operator"
	// TopologyOperatorLabelValue is the value of LabelTopologyOperator.
	TopologyOperatorLabelValue = "true"
)

// maxNameLength keeps child names well inside the 253 characters of a DNS
// subdomain, leaving room for the suffixes ReplicaSets and Pods add.
const maxNameLength = 200

// Subject is the Callee or Caller whose children are built.
type Subject struct {
	Role      topology.Role
	Name      string
	Namespace string
	UID       types.UID
	// ID is the callee or caller id in effect.
	ID string
}

// ForCallee returns the Subject of a Callee.
func ForCallee(c *hcpv1alpha1.Callee) Subject {
	return Subject{Role: topology.RoleCallee, Name: c.Name, Namespace: c.Namespace, UID: c.UID, ID: c.ID()}
}

// ForCaller returns the Subject of a Caller.
func ForCaller(c *hcpv1alpha1.Caller) Subject {
	return Subject{Role: topology.RoleCaller, Name: c.Name, Namespace: c.Namespace, UID: c.UID, ID: c.ID()}
}

// Kind is the API kind of the subject: Callee or Caller.
func (s Subject) Kind() string {
	if s.Role == topology.RoleCallee {
		return "Callee"
	}
	return "Caller"
}

// GroupVersionKind of the subject.
func (s Subject) GroupVersionKind() schema.GroupVersionKind {
	return hcpv1alpha1.GroupVersion.WithKind(s.Kind())
}

// OwnerReference is the controller reference children carry.
func (s Subject) OwnerReference() metav1.OwnerReference {
	gvk := s.GroupVersionKind()
	return metav1.OwnerReference{
		APIVersion:         gvk.GroupVersion().String(),
		Kind:               gvk.Kind,
		Name:               s.Name,
		UID:                s.UID,
		Controller:         new(true),
		BlockOwnerDeletion: new(true),
	}
}

// LabelKey is the label naming the subject on its children: hcp.io/callee
// or hcp.io/caller.
func (s Subject) LabelKey() string {
	if s.Role == topology.RoleCallee {
		return hcpv1alpha1.LabelCallee
	}
	return hcpv1alpha1.LabelCaller
}

// Labels are set on every child of the subject.
func (s Subject) Labels() map[string]string {
	return map[string]string{
		hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue,
		LabelPartOf:                PartOfValue,
		LabelComponent:             string(s.Role),
		LabelInstance:              LabelValue(s.Name),
		s.LabelKey():               LabelValue(s.Name),
	}
}

// SelectorLabels select the subject's harness pods. They never change for
// the life of the Deployment (its selector is immutable).
func (s Subject) SelectorLabels() map[string]string {
	return map[string]string{
		hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue,
		s.LabelKey():               LabelValue(s.Name),
	}
}

// meta is the ObjectMeta of a child named name.
func (s Subject) meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:            name,
		Namespace:       s.Namespace,
		Labels:          s.Labels(),
		OwnerReferences: []metav1.OwnerReference{s.OwnerReference()},
	}
}

// BaseName is the name of the subject's Queue, Binding, User, Permission,
// Deployment, ServiceAccount, and a caller's Role and RoleBinding: hcp-callee-N or
// hcp-caller-N.
func (s Subject) BaseName() string {
	return truncateName("hcp-"+string(s.Role)+"-"+s.Name, maxNameLength)
}

// CredentialsSecretName is the Secret with the subject's broker credentials.
func (s Subject) CredentialsSecretName() string {
	return truncateName(s.BaseName(), maxNameLength-len("-credentials")) + "-credentials"
}

// SidecarRoleBindingName is the RoleBinding that grants a callee's
// ServiceAccount the callee sidecars' ClusterRole (CalleeRoleBinding).
func (s Subject) SidecarRoleBindingName() string {
	return truncateName(s.BaseName(), maxNameLength-len("-sidecar")) + "-sidecar"
}

// LegacyTokenSecretName is the Secret that held a callee's session-token
// keys before they moved into its credentials Secret (WithTokenKeys): read
// once to adopt the keys, emptied once no pod mounts it.
func (s Subject) LegacyTokenSecretName() string {
	return truncateName(s.BaseName(), maxNameLength-len("-token")) + "-token"
}

// Username is the subject's broker username ({role}.{id}@{vhost}).
func (s Subject) Username(vhost string) string {
	return topology.Username(s.Role, vhost, s.ID)
}

// QueueName is the subject's AMQP queue: hcp.cmd.{id} or hcp.evt.{id}.
func (s Subject) QueueName() string {
	if s.Role == topology.RoleCallee {
		return topology.CommandQueue(s.ID)
	}
	return topology.EventQueue(s.ID)
}

// ExchangeNames are the names of the shared Exchange objects of a vhost key
// in a namespace: hcp-commands-KEY and hcp-events-KEY.
func ExchangeNames(key string) (commands, events string) {
	return "hcp-commands-" + key, "hcp-events-" + key
}

// DefaultEventLimitsObjectName is the name of the default event limits
// Policy object of a vhost key.
func DefaultEventLimitsObjectName(key string) string { return "hcp-limits-events-" + key }

// DeadLetterExchangeObjectName is the name of the shared dead-letter
// Exchange object of a vhost key.
func DeadLetterExchangeObjectName(key string) string { return "hcp-dlx-" + key }

// DefaultCommandLimitsObjectName is the name of the default command queue
// Policy object of a vhost key.
func DefaultCommandLimitsObjectName(key string) string { return "hcp-limits-commands-" + key }

// DeadLetterLimitsObjectName is the name of the dead-letter queue Policy
// object of a vhost key.
func DeadLetterLimitsObjectName(key string) string { return "hcp-limits-dlq-" + key }

// VhostObjectName is the name of the Vhost object of a vhost key.
func VhostObjectName(key string) string { return "hcp-vhost-" + key }

// LabelValue makes s a valid label value: unchanged when it fits in 63
// characters, else cut and suffixed with a hash of the whole.
func LabelValue(s string) string { return truncateName(s, 63) }

func truncateName(s string, max int) string {
	if len(s) <= max {
		return s
	}
	h := shortHash(s, 8)
	cut := s[:max-len(h)-1]
	for len(cut) > 0 && !isAlnum(cut[len(cut)-1]) {
		cut = cut[:len(cut)-1]
	}
	return cut + "-" + h
}

func isAlnum(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') }

func shortHash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:n]
}

// HashSecretData hashes a Secret's data (keys sorted) so that a change of
// content, but not of metadata, changes the pods' config hash. Nothing of
// the content can be recovered from it.
func HashSecretData(data map[string][]byte) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(data)) {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write(data[k])
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// hashJSON hashes v's JSON encoding (map keys are sorted by encoding/json).
func hashJSON(v ...any) string {
	h := sha256.New()
	enc := json.NewEncoder(h)
	for _, x := range v {
		if err := enc.Encode(x); err != nil {
			// Only API types reach here; they always encode.
			panic(err)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// SidecarCommand is the sidecar binary's path in the operator image (see the
// Dockerfile: one image, /manager and /hcp-sidecar).
const SidecarCommand = "/hcp-sidecar"
