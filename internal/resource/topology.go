package resource

import (
	"encoding/json"
	"fmt"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Queue argument names.
const (
	ArgMaxLength      = "x-max-length"
	ArgMaxLengthBytes = "x-max-length-bytes"
	ArgDeliveryLimit  = "x-delivery-limit"
	ArgOverflow       = "x-overflow"
	ArgMessageTTL     = "x-message-ttl"
	// ArgSingleActiveConsumer keeps one consumer of an event queue active at
	// a time: with two caller replicas (or during a rolling update) the events
	// of a session must not be split between consumers, or per-session order
	// and dedup (held in one sidecar) would break.
	ArgSingleActiveConsumer = "x-single-active-consumer"

	OverflowRejectPublish = "reject-publish"
	OverflowDropHead      = "drop-head"

	// QueueTypeQuorum is the only queue type HCP uses.
	QueueTypeQuorum = "quorum"

	// DefaultEventQueueMaxLength applies when a Caller sets no maxLength
	// (the CRD defaults it too).
	DefaultEventQueueMaxLength int64 = 100000
)

// sharedMeta is the metadata of a per-vhost object: not owned by any one
// Callee or Caller, labelled with its vhost key.
func sharedMeta(name, namespace, key string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:      name,
		Namespace: namespace,
		Labels: map[string]string{
			hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue,
			LabelPartOf:                PartOfValue,
			hcpv1alpha1.LabelVhostKey:  key,
		},
	}
}

// Vhost is the Vhost object of a broker's vhost in namespace, for subjects
// that ask the operator to create it. deletionPolicy is retain unless every
// subject sharing it asked for delete (the caller decides).
func Vhost(namespace string, b Broker, deletionPolicy string) *topologyv1beta1.Vhost {
	return &topologyv1beta1.Vhost{
		ObjectMeta: sharedMeta(VhostObjectName(b.Key()), namespace, b.Key()),
		Spec: topologyv1beta1.VhostSpec{
			Name:                     b.Vhost,
			RabbitmqClusterReference: b.Reference,
			DeletionPolicy:           deletionPolicy,
		},
	}
}

// Exchanges are the shared hcp.commands (direct) and hcp.events (topic)
// exchanges of a broker's vhost, as objects in namespace.
func Exchanges(namespace string, b Broker) (commands, events *topologyv1beta1.Exchange) {
	cn, en := ExchangeNames(b.Key())
	mk := func(objName, name, typ string) *topologyv1beta1.Exchange {
		return &topologyv1beta1.Exchange{
			ObjectMeta: sharedMeta(objName, namespace, b.Key()),
			Spec: topologyv1beta1.ExchangeSpec{
				Name:                     name,
				Vhost:                    b.Vhost,
				Type:                     typ,
				Durable:                  true,
				RabbitmqClusterReference: b.Reference,
			},
		}
	}
	return mk(cn, topology.CommandsExchange, topology.CommandsExchangeType),
		mk(en, topology.EventsExchange, topology.EventsExchangeType)
}

// CalleeQueueArguments are the arguments of hcp.cmd.{calleeID}: the
// configured limits, and x-overflow reject-publish whenever a length limit
// is set (a caller learns of a full queue from its publisher confirm
// instead of the oldest command being dropped). No TTL (L1).
func CalleeQueueArguments(q hcpv1alpha1.CommandQueueSpec) map[string]any {
	args := map[string]any{}
	if q.MaxLength != nil {
		args[ArgMaxLength] = *q.MaxLength
	}
	if q.MaxLengthBytes != nil {
		args[ArgMaxLengthBytes] = *q.MaxLengthBytes
	}
	if q.DeliveryLimit != nil {
		args[ArgDeliveryLimit] = int64(*q.DeliveryLimit)
	}
	if q.MaxLength != nil || q.MaxLengthBytes != nil {
		args[ArgOverflow] = OverflowRejectPublish
	}
	return args
}

// CallerQueueArguments are the arguments of hcp.evt.{callerID}:
// x-message-ttl in milliseconds (default PT24H), x-max-length (default
// 100000), x-max-length-bytes when set, x-overflow (default drop-head), and
// x-single-active-consumer.
func CallerQueueArguments(q hcpv1alpha1.EventQueueSpec) (map[string]any, error) {
	ttl := topology.DefaultEventMessageTTL
	if q.MessageTTL != "" {
		d, err := task.ParseDuration(string(q.MessageTTL))
		if err != nil {
			return nil, fmt.Errorf("spec.eventQueue.messageTTL: %w", err)
		}
		ttl = d
	}
	maxLen := DefaultEventQueueMaxLength
	if q.MaxLength != nil {
		maxLen = *q.MaxLength
	}
	overflow := q.Overflow
	if overflow == "" {
		overflow = OverflowDropHead
	}
	args := map[string]any{
		ArgMessageTTL: ttl.Milliseconds(),
		ArgMaxLength:  maxLen,
		ArgOverflow:   overflow,

		ArgSingleActiveConsumer: true,
	}
	if q.MaxLengthBytes != nil {
		args[ArgMaxLengthBytes] = *q.MaxLengthBytes
	}
	return args, nil
}

// RawJSON encodes v as a RawExtension (map keys sorted).
func RawJSON(v any) *runtime.RawExtension {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of strings and integers always encode
	}
	return &runtime.RawExtension{Raw: raw}
}

// Queue is the subject's quorum queue with arguments args.
func Queue(s Subject, b Broker, args map[string]any) *topologyv1beta1.Queue {
	return &topologyv1beta1.Queue{
		ObjectMeta: s.meta(s.BaseName()),
		Spec: topologyv1beta1.QueueSpec{
			Name:                     s.QueueName(),
			Vhost:                    b.Vhost,
			Type:                     QueueTypeQuorum,
			Durable:                  new(true),
			Arguments:                RawJSON(args),
			RabbitmqClusterReference: b.Reference,
			DeletionPolicy:           DeletionPolicyDelete,
		},
	}
}

// CalleeQueue is hcp.cmd.{calleeID}.
func CalleeQueue(c *hcpv1alpha1.Callee, b Broker) *topologyv1beta1.Queue {
	return Queue(ForCallee(c), b, CalleeQueueArguments(c.Spec.CommandQueue))
}

// CallerQueue is hcp.evt.{callerID}.
func CallerQueue(c *hcpv1alpha1.Caller, b Broker) (*topologyv1beta1.Queue, error) {
	args, err := CallerQueueArguments(c.Spec.EventQueue)
	if err != nil {
		return nil, err
	}
	return Queue(ForCaller(c), b, args), nil
}

// Binding binds the subject's queue: hcp.cmd.{id} to hcp.commands with key
// {id}; hcp.evt.{id} to hcp.events with key {id}.#.
func Binding(s Subject, b Broker) *topologyv1beta1.Binding {
	source, key := topology.CommandsExchange, topology.CommandRoutingKey(s.ID)
	if s.Role == topology.RoleCaller {
		source, key = topology.EventsExchange, topology.EventBindingKey(s.ID)
	}
	return &topologyv1beta1.Binding{
		ObjectMeta: s.meta(s.BaseName()),
		Spec: topologyv1beta1.BindingSpec{
			Vhost:                    b.Vhost,
			Source:                   source,
			Destination:              s.QueueName(),
			DestinationType:          "queue",
			RoutingKey:               key,
			RabbitmqClusterReference: b.Reference,
		},
	}
}

// User is the subject's broker user, with the credentials the operator
// generated imported from the credentials Secret (so the username is the
// documented {role}.{id}@{vhost}). No tags: no management access.
func User(s Subject, b Broker) *topologyv1beta1.User {
	return &topologyv1beta1.User{
		ObjectMeta: s.meta(s.BaseName()),
		Spec: topologyv1beta1.UserSpec{
			RabbitmqClusterReference: b.Reference,
			ImportCredentialsSecret:  &corev1.LocalObjectReference{Name: s.CredentialsSecretName()},
		},
	}
}

// Permission grants the subject's user exactly the permissions of DESIGN
// section 3 on the vhost. It names the user by username rather than by
// userReference: with a userReference the topology operator makes the User
// the Permission's controller, which would take it from the Callee/Caller.
func Permission(s Subject, b Broker) *topologyv1beta1.Permission {
	p := topology.PermissionsFor(s.Role, s.ID)
	return &topologyv1beta1.Permission{
		ObjectMeta: s.meta(s.BaseName()),
		Spec: topologyv1beta1.PermissionSpec{
			User:  s.Username(b.Vhost),
			Vhost: b.Vhost,
			Permissions: topologyv1beta1.VhostPermissions{
				Configure: p.Configure,
				Write:     p.Write,
				Read:      p.Read,
			},
			RabbitmqClusterReference: b.Reference,
		},
	}
}
