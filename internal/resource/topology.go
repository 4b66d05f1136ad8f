package resource

import (
	"encoding/json"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
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

// Vhost is the Vhost object of a broker's vhost, kept in namespace (the
// shared topology's home, see SharedTopology) and reaching the broker
// through ref. deletionPolicy is retain unless every subject sharing it
// asked for delete (the caller decides).
func Vhost(namespace string, b Broker, ref topologyv1beta1.RabbitmqClusterReference, deletionPolicy string) *topologyv1beta1.Vhost {
	return &topologyv1beta1.Vhost{
		ObjectMeta: sharedMeta(VhostObjectName(b.Key()), namespace, b.Key()),
		Spec: topologyv1beta1.VhostSpec{
			Name:                     b.Vhost,
			RabbitmqClusterReference: ref,
			DeletionPolicy:           deletionPolicy,
		},
	}
}

// Exchanges are the shared hcp.commands (direct) and hcp.events (topic)
// exchanges of a broker's vhost, as objects in namespace reaching the
// broker through ref.
func Exchanges(namespace string, b Broker, ref topologyv1beta1.RabbitmqClusterReference) (commands, events *topologyv1beta1.Exchange) {
	cn, en := ExchangeNames(b.Key())
	mk := func(objName, name, typ string) *topologyv1beta1.Exchange {
		return &topologyv1beta1.Exchange{
			ObjectMeta: sharedMeta(objName, namespace, b.Key()),
			Spec: topologyv1beta1.ExchangeSpec{
				Name:                     name,
				Vhost:                    b.Vhost,
				Type:                     typ,
				Durable:                  true,
				RabbitmqClusterReference: ref,
			},
		}
	}
	return mk(cn, topology.CommandsExchange, topology.CommandsExchangeType),
		mk(en, topology.EventsExchange, topology.EventsExchangeType)
}

// CalleeQueueArguments are the limits of hcp.cmd.{calleeID} as queue
// declaration arguments (CalleeQueueLimits with the x- prefix). The
// operator no longer declares its queues with them (arguments are
// immutable; the limits are a policy, see LimitsPolicy); benchmarks that
// declare an equivalent queue by hand still use them.
func CalleeQueueArguments(q hcpv1alpha1.CommandQueueSpec) map[string]any {
	return asArguments(CalleeQueueLimits(q), nil)
}

// CallerQueueArguments are the limits of hcp.evt.{callerID} as queue
// declaration arguments, plus the declaration arguments the queue always
// has (CallerQueueDeclaration): what an equivalent queue declared by hand
// carries.
func CallerQueueArguments(q hcpv1alpha1.EventQueueSpec) (map[string]any, error) {
	limits, err := CallerQueueLimits(q)
	if err != nil {
		return nil, err
	}
	return asArguments(limits, CallerQueueDeclaration()), nil
}

// CalleeQueueDeclaration is what hcp.cmd.{calleeID} is declared with
// besides its type (quorum) and durability: nothing. Every limit is a
// policy, so that it can change on a live queue.
func CalleeQueueDeclaration() map[string]any { return map[string]any{} }

// CallerQueueDeclaration is what hcp.evt.{callerID} is declared with
// besides its type and durability: x-single-active-consumer, the one
// setting a policy cannot give.
func CallerQueueDeclaration() map[string]any {
	return map[string]any{ArgSingleActiveConsumer: true}
}

func asArguments(limits, base map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range limits {
		out["x-"+k] = v
	}
	return out
}

// RawJSON encodes v as a RawExtension (map keys sorted).
func RawJSON(v any) *runtime.RawExtension {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of strings and integers always encode
	}
	return &runtime.RawExtension{Raw: raw}
}

// Queue is the subject's quorum queue with declaration arguments args
// (none: no arguments field at all).
func Queue(s Subject, b Broker, args map[string]any) *topologyv1beta1.Queue {
	q := &topologyv1beta1.Queue{
		ObjectMeta: s.meta(s.BaseName()),
		Spec: topologyv1beta1.QueueSpec{
			Name:                     s.QueueName(),
			Vhost:                    b.Vhost,
			Type:                     QueueTypeQuorum,
			Durable:                  new(true),
			RabbitmqClusterReference: b.Reference,
			DeletionPolicy:           DeletionPolicyDelete,
		},
	}
	if len(args) > 0 {
		q.Spec.Arguments = RawJSON(args)
	}
	return q
}

// CalleeQueue is hcp.cmd.{calleeID}, declared without limits (see
// CalleeLimitsPolicy) and with its dead-letter routing
// (DeadLetterArguments).
func CalleeQueue(c *hcpv1alpha1.Callee, b Broker) *topologyv1beta1.Queue {
	s := ForCallee(c)
	return Queue(s, b, withDeadLetters(s, CalleeQueueDeclaration()))
}

// CallerQueue is hcp.evt.{callerID}, declared with
// x-single-active-consumer (see CallerLimitsPolicy) and its dead-letter
// routing (DeadLetterArguments). The error is the limits' (an unparsable
// messageTTL), so that a Caller with one gets no queue either.
func CallerQueue(c *hcpv1alpha1.Caller, b Broker) (*topologyv1beta1.Queue, error) {
	if _, err := CallerQueueLimits(c.Spec.EventQueue); err != nil {
		return nil, err
	}
	s := ForCaller(c)
	return Queue(s, b, withDeadLetters(s, CallerQueueDeclaration())), nil
}

// withDeadLetters adds the subject's DeadLetterArguments to args.
func withDeadLetters(s Subject, args map[string]any) map[string]any {
	for k, v := range DeadLetterArguments(s.QueueName()) {
		args[k] = v
	}
	return args
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
