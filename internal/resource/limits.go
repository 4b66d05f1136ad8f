package resource

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Live limits.
//
// RabbitMQ cannot change the declaration arguments of a queue, and the
// topology operator's admission webhook refuses any change of a Queue's
// spec.arguments. So HCP queues are declared with no limit arguments, and
// their TTL, length limits, overflow and delivery limit are a RabbitMQ
// policy. A policy's definition can change at any time; the broker applies
// it to the live queue, messages included.
//
// Caller event queues with the default limits share one policy per vhost
// (DefaultEventLimitsPolicy, a shared object like the exchanges); a queue
// whose limits differ has a policy of its own (LimitsPolicy), whose
// pattern matches exactly that queue, at a higher priority. One policy per
// queue would make the broker quadratic: on every policy change RabbitMQ
// matches every queue of the vhost against every policy of the vhost
// (rabbit_policy:update_matched_objects), and at 2,000 queues with 1,000
// policies creating or deleting the harnesses kept a broker core busy for
// minutes (docs/performance.md).
//
// A normal policy, not an operator policy: RabbitMQ (3.10 to 3.12) does
// not accept overflow in an operator policy, and an operator policy is
// the platform team's guardrail, which merges with ours (the stricter
// value of each limit wins). Only one normal policy applies to a queue, the
// one of highest priority: ours has LimitsPolicyPriority, above the
// default 0 of vhost-wide policies.

// Policy definition keys (the queue arguments without their x- prefix).
const (
	PolicyMaxLength      = "max-length"
	PolicyMaxLengthBytes = "max-length-bytes"
	PolicyDeliveryLimit  = "delivery-limit"
	PolicyOverflow       = "overflow"
	PolicyMessageTTL     = "message-ttl"
)

// LimitsPolicyPriority is the priority of a queue's limits policy: above
// the default (0) of vhost-wide policies, so that ours applies to HCP
// queues. A policy with a higher priority that matches an HCP queue
// replaces ours on it entirely (RabbitMQ applies one policy per queue).
const LimitsPolicyPriority = 100

// policyApplyToQueues restricts a policy to queues (classic and quorum).
const policyApplyToQueues = "queues"

// CalleeQueueLimits is the policy definition of hcp.cmd.{calleeID}: the
// configured limits, and overflow reject-publish whenever a length limit is
// set (a caller learns of a full queue from its publisher confirm instead
// of the oldest command being dropped), and the dead-letter exchange
// (deadletter.go). No TTL (L1).
func CalleeQueueLimits(q hcpv1alpha1.CommandQueueSpec) map[string]any {
	def := map[string]any{PolicyDeadLetterExchange: topology.DeadLetterExchange}
	if q.MaxLength != nil {
		def[PolicyMaxLength] = *q.MaxLength
	}
	if q.MaxLengthBytes != nil {
		def[PolicyMaxLengthBytes] = *q.MaxLengthBytes
	}
	if q.DeliveryLimit != nil {
		def[PolicyDeliveryLimit] = int64(*q.DeliveryLimit)
	}
	if q.MaxLength != nil || q.MaxLengthBytes != nil {
		def[PolicyOverflow] = OverflowRejectPublish
	}
	return def
}

// CallerQueueLimits is the policy definition of hcp.evt.{callerID}:
// message-ttl in milliseconds (default PT24H), max-length (default
// 100000), max-length-bytes when set, overflow (default drop-head), and the
// dead-letter exchange (deadletter.go).
func CallerQueueLimits(q hcpv1alpha1.EventQueueSpec) (map[string]any, error) {
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
	def := map[string]any{
		PolicyMessageTTL:         ttl.Milliseconds(),
		PolicyMaxLength:          maxLen,
		PolicyOverflow:           overflow,
		PolicyDeadLetterExchange: topology.DeadLetterExchange,
	}
	if q.MaxLengthBytes != nil {
		def[PolicyMaxLengthBytes] = *q.MaxLengthBytes
	}
	return def, nil
}

// DefaultLimitsPolicyPriority is the priority of a vhost's default event
// limits policy: below a queue's own (LimitsPolicyPriority), which
// replaces it, and above the default 0 of vhost-wide policies.
const DefaultLimitsPolicyPriority = LimitsPolicyPriority - 1

// DefaultEventLimitsPolicyName is the broker-side name of a vhost's default
// event limits policy.
const DefaultEventLimitsPolicyName = "hcp-limits." + topology.EventQueuePrefix + "*"

// DefaultEventLimits is the policy definition of an event queue whose
// Caller sets no limits (CallerQueueLimits of an empty spec).
func DefaultEventLimits() map[string]any {
	def, err := CallerQueueLimits(hcpv1alpha1.EventQueueSpec{})
	if err != nil {
		panic(fmt.Sprintf("the default event queue limits: %v", err)) // constants: cannot fail
	}
	return def
}

// DefaultEventLimitsPolicy is the shared Policy of a broker's vhost, in
// namespace (the shared topology's home) and reaching the broker through
// ref, that gives every Caller event queue (hcp.evt.*) the default limits.
func DefaultEventLimitsPolicy(namespace string, b Broker, ref topologyv1beta1.RabbitmqClusterReference) *topologyv1beta1.Policy {
	return &topologyv1beta1.Policy{
		ObjectMeta: sharedMeta(DefaultEventLimitsObjectName(b.Key()), namespace, b.Key()),
		Spec: topologyv1beta1.PolicySpec{
			Name:                     DefaultEventLimitsPolicyName,
			Vhost:                    b.Vhost,
			Pattern:                  "^" + regexp.QuoteMeta(topology.EventQueuePrefix),
			ApplyTo:                  policyApplyToQueues,
			Priority:                 DefaultLimitsPolicyPriority,
			Definition:               RawJSON(DefaultEventLimits()),
			RabbitmqClusterReference: ref,
		},
	}
}

// LimitsPolicyName is the broker-side name of the policy of queue.
func LimitsPolicyName(queue string) string { return "hcp-limits." + queue }

// LimitsPolicyPattern matches exactly queue and nothing else.
func LimitsPolicyPattern(queue string) string { return "^" + regexp.QuoteMeta(queue) + "$" }

// LimitsPolicy is the Policy carrying the subject's queue limits def; nil
// when def is empty (no limits: no policy).
func LimitsPolicy(s Subject, b Broker, def map[string]any) *topologyv1beta1.Policy {
	if len(def) == 0 {
		return nil
	}
	return &topologyv1beta1.Policy{
		ObjectMeta: s.meta(s.BaseName()),
		Spec: topologyv1beta1.PolicySpec{
			Name:                     LimitsPolicyName(s.QueueName()),
			Vhost:                    b.Vhost,
			Pattern:                  LimitsPolicyPattern(s.QueueName()),
			ApplyTo:                  policyApplyToQueues,
			Priority:                 LimitsPolicyPriority,
			Definition:               RawJSON(def),
			RabbitmqClusterReference: b.Reference,
		},
	}
}

// CalleeLimitsPolicy is the Policy of hcp.cmd.{calleeID}, nil without
// limits (the vhost's DefaultCommandLimitsPolicy gives it its dead-letter
// exchange).
func CalleeLimitsPolicy(c *hcpv1alpha1.Callee, b Broker) *topologyv1beta1.Policy {
	def := CalleeQueueLimits(c.Spec.CommandQueue)
	if isDefaultCommandLimits(def) {
		return nil
	}
	return LimitsPolicy(ForCallee(c), b, def)
}

// CallerLimitsPolicy is the Policy of hcp.evt.{callerID}: nil when its
// limits are the defaults, which the vhost's DefaultEventLimitsPolicy
// gives it.
func CallerLimitsPolicy(c *hcpv1alpha1.Caller, b Broker) (*topologyv1beta1.Policy, error) {
	def, err := CallerQueueLimits(c.Spec.EventQueue)
	if err != nil {
		return nil, err
	}
	if reflect.DeepEqual(def, DefaultEventLimits()) {
		return nil, nil
	}
	return LimitsPolicy(ForCaller(c), b, def), nil
}

// PinnedLimit is a limit a queue's declaration argument holds against its
// policy: the queue was declared by an earlier version of the operator
// with its limits as arguments, which can never change.
type PinnedLimit struct {
	// Key is the policy key (max-length, ...).
	Key string
	// Argument is the queue's declaration argument; Policy what the spec
	// asks for (nil: nothing).
	Argument, Policy any
}

func (p PinnedLimit) String() string {
	if p.Policy == nil {
		return fmt.Sprintf("x-%s=%v (the spec sets none)", p.Key, p.Argument)
	}
	return fmt.Sprintf("x-%s=%v (the spec asks for %v)", p.Key, p.Argument, p.Policy)
}

// PinnedLimits compares a live queue's declaration arguments with the
// limits its policy gives and returns the limits that do not take effect
// as asked, by RabbitMQ's rule for quorum queues when both an argument and
// a policy set a key (rabbit_quorum_queue, RabbitMQ 3.10 to 4.x): the lower
// of the two numbers for max-length, max-length-bytes, delivery-limit and
// message-ttl; the policy for overflow. So an argument pins a limit when
// it is lower than what is asked, or when nothing is asked. Sorted by key.
func PinnedLimits(args, limits map[string]any) []PinnedLimit {
	var out []PinnedLimit
	for _, key := range []string{PolicyDeliveryLimit, PolicyMaxLength, PolicyMaxLengthBytes, PolicyMessageTTL} {
		a, ok := number(args["x-"+key])
		if !ok {
			continue
		}
		p, asked := number(limits[key])
		if !asked || a < p {
			pin := PinnedLimit{Key: key, Argument: args["x-"+key]}
			if asked {
				pin.Policy = limits[key]
			}
			out = append(out, pin)
		}
	}
	slices.SortFunc(out, func(a, b PinnedLimit) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// LimitArguments are the limit arguments among a queue's declaration
// arguments (those a policy could give): what an earlier version declared.
func LimitArguments(args map[string]any) []string {
	var out []string
	for _, key := range []string{PolicyDeliveryLimit, PolicyMaxLength, PolicyMaxLengthBytes, PolicyMessageTTL, PolicyOverflow} {
		if _, ok := args["x-"+key]; ok {
			out = append(out, "x-"+key)
		}
	}
	return slices.Sorted(slices.Values(out))
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case int64:
		return float64(n), true
	case int:
		return float64(n), true
	case int32:
		return float64(n), true
	}
	return 0, false
}
