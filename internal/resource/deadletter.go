package resource

import (
	"reflect"
	"regexp"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Dead letters.
//
// What the broker drops from a command or event queue (a delivery limit, a
// message TTL, an overflow) and what a sidecar rejects without requeue
// (the caller sidecar an event its app refused spec.delivery.maxAttempts
// times, the callee sidecar a command it cannot process) goes to the
// harness's own dead-letter queue hcp.dlq.cmd.{calleeID} or
// hcp.dlq.evt.{callerID}, with RabbitMQ's x-death header saying where it
// came from (its original routing keys included).
//
// A queue declared by this version routes its dead letters without a
// Binding object: it is declared with x-dead-letter-exchange "" (the
// default exchange, which routes to the queue named by the key, with no
// binding) and x-dead-letter-routing-key hcp.dlq.{cmd|evt}.{id}
// (DeadLetterArguments). The declaration arguments fix that routing for
// the queue's life, which is what we want: the dead-letter queue's name is
// a function of the queue's own, so isolation (one harness never receives
// another's dead letters) holds by construction, and the routing cannot be
// lost with an exchange. RabbitMQ applies a queue's argument over a
// policy's value of the same key, so the policies' dead-letter-exchange
// below does not reach these queues.
//
// A queue declared by an earlier version (without those arguments: queue
// arguments never change) keeps the former routing: every command and
// event queue dead-letters, by policy, to the vhost's topic exchange
// hcp.dlx (topology.DeadLetterExchange) with its original routing key, and
// a Binding per harness (DeadLetterBinding, kept only for such a queue:
// NeedsDeadLetterBinding) routes to the dead-letter queue: {calleeID}, or
// {callerID}.*.* (event keys have three words, command keys one, so a
// caller and a callee with one id never share dead letters). The
// dead-letter queues have a shared policy of their own
// (DeadLetterLimitsPolicy). RabbitMQ dead-letters quorum queue messages at
// most once (its default strategy): a message dropped while the
// dead-letter queue cannot take it is gone.

// Dead-letter declaration arguments of a command or event queue.
const (
	ArgDeadLetterExchange   = "x-dead-letter-exchange"
	ArgDeadLetterRoutingKey = "x-dead-letter-routing-key"
)

// DeadLetterArguments are the declaration arguments that route the dead
// letters of queue (hcp.cmd.{id} or hcp.evt.{id}) to its dead-letter
// queue through the default exchange: no Binding needed.
func DeadLetterArguments(queue string) map[string]any {
	return map[string]any{ArgDeadLetterExchange: "", ArgDeadLetterRoutingKey: topology.DeadLetterQueue(queue)}
}

// NeedsDeadLetterBinding reports whether a queue declared with args (as
// declared: the live Queue's, or the desired one's for a new queue)
// dead-letters through hcp.dlx and so needs its harness's dead-letter
// Binding: a queue declared before DeadLetterArguments.
func NeedsDeadLetterBinding(args map[string]any) bool {
	_, direct := args[ArgDeadLetterRoutingKey]
	return !direct
}

// PolicyDeadLetterExchange is the policy key of a queue's dead-letter
// exchange.
const PolicyDeadLetterExchange = "dead-letter-exchange"

// DefaultDeadLetterMaxLength bounds each dead-letter queue: beyond it the
// oldest dead letters go first.
const DefaultDeadLetterMaxLength int64 = 100000

// DeadLetterExchange is the vhost's shared dead-letter exchange hcp.dlx, in
// namespace (the shared topology's home), reaching the broker through ref.
func DeadLetterExchange(namespace string, b Broker, ref topologyv1beta1.RabbitmqClusterReference) *topologyv1beta1.Exchange {
	return &topologyv1beta1.Exchange{
		ObjectMeta: sharedMeta(DeadLetterExchangeObjectName(b.Key()), namespace, b.Key()),
		Spec: topologyv1beta1.ExchangeSpec{
			Name:                     topology.DeadLetterExchange,
			Vhost:                    b.Vhost,
			Type:                     topology.DeadLetterExchangeType,
			Durable:                  true,
			RabbitmqClusterReference: ref,
		},
	}
}

// DeadLetterQueueObjectName is the name of a subject's dead-letter Queue
// and Binding objects.
func DeadLetterQueueObjectName(s Subject) string { return truncateName(s.BaseName(), 59) + "-dlq" }

// DeadLetterQueue is the subject's dead-letter queue, a quorum queue
// declared without arguments (its limits are DeadLetterLimitsPolicy).
func DeadLetterQueue(s Subject, b Broker) *topologyv1beta1.Queue {
	q := Queue(s, b, nil)
	q.Name = DeadLetterQueueObjectName(s)
	q.Spec.Name = topology.DeadLetterQueue(s.QueueName())
	return q
}

// DeadLetterBinding binds the subject's dead-letter queue to hcp.dlx with
// the keys of its own messages, for a queue declared before
// DeadLetterArguments (see the section comment).
func DeadLetterBinding(s Subject, b Broker) *topologyv1beta1.Binding {
	key := topology.CommandDeadLetterKey(s.ID)
	if s.Role == topology.RoleCaller {
		key = topology.EventDeadLetterKey(s.ID)
	}
	return &topologyv1beta1.Binding{
		ObjectMeta: s.meta(DeadLetterQueueObjectName(s)),
		Spec: topologyv1beta1.BindingSpec{
			Vhost:                    b.Vhost,
			Source:                   topology.DeadLetterExchange,
			Destination:              topology.DeadLetterQueue(s.QueueName()),
			DestinationType:          "queue",
			RoutingKey:               key,
			RabbitmqClusterReference: b.Reference,
		},
	}
}

// DefaultCommandLimitsPolicyName is the broker-side name of a vhost's
// default command queue policy.
const DefaultCommandLimitsPolicyName = "hcp-limits." + topology.CommandQueuePrefix + "*"

// DeadLetterLimitsPolicyName is the broker-side name of a vhost's
// dead-letter queue policy.
const DeadLetterLimitsPolicyName = "hcp-limits." + topology.DeadLetterQueuePrefix + "*"

// DefaultCommandLimits is the policy definition of a command queue whose
// Callee sets no limits: its dead-letter exchange only.
func DefaultCommandLimits() map[string]any {
	return CalleeQueueLimits(hcpv1alpha1.CommandQueueSpec{})
}

// DefaultCommandLimitsPolicy is the shared Policy of a broker's vhost that
// gives every command queue (hcp.cmd.*) without limits of its own its
// dead-letter exchange; a Callee with limits has its own policy
// (CalleeLimitsPolicy, which carries the exchange too), at a higher
// priority. Shared, like DefaultEventLimitsPolicy, so that a thousand
// Callees do not make a thousand policies.
func DefaultCommandLimitsPolicy(namespace string, b Broker, ref topologyv1beta1.RabbitmqClusterReference) *topologyv1beta1.Policy {
	return sharedPolicy(DefaultCommandLimitsObjectName(b.Key()), DefaultCommandLimitsPolicyName, topology.CommandQueuePrefix,
		DefaultLimitsPolicyPriority, DefaultCommandLimits(), namespace, b, ref)
}

// DeadLetterLimits is the policy definition of every dead-letter queue:
// DefaultDeadLetterMaxLength, oldest first out.
func DeadLetterLimits() map[string]any {
	return map[string]any{PolicyMaxLength: DefaultDeadLetterMaxLength, PolicyOverflow: OverflowDropHead}
}

// DeadLetterLimitsPolicy is the shared Policy of a broker's vhost that
// bounds every dead-letter queue (hcp.dlq.*).
func DeadLetterLimitsPolicy(namespace string, b Broker, ref topologyv1beta1.RabbitmqClusterReference) *topologyv1beta1.Policy {
	return sharedPolicy(DeadLetterLimitsObjectName(b.Key()), DeadLetterLimitsPolicyName, topology.DeadLetterQueuePrefix,
		LimitsPolicyPriority, DeadLetterLimits(), namespace, b, ref)
}

func sharedPolicy(objName, name, prefix string, priority int, def map[string]any, namespace string, b Broker, ref topologyv1beta1.RabbitmqClusterReference) *topologyv1beta1.Policy {
	return &topologyv1beta1.Policy{
		ObjectMeta: sharedMeta(objName, namespace, b.Key()),
		Spec: topologyv1beta1.PolicySpec{
			Name:                     name,
			Vhost:                    b.Vhost,
			Pattern:                  "^" + regexp.QuoteMeta(prefix),
			ApplyTo:                  policyApplyToQueues,
			Priority:                 priority,
			Definition:               RawJSON(def),
			RabbitmqClusterReference: ref,
		},
	}
}

// isDefaultCommandLimits reports whether def is what the vhost's default
// command policy gives.
func isDefaultCommandLimits(def map[string]any) bool {
	return reflect.DeepEqual(def, DefaultCommandLimits())
}
