package resource

import (
	"encoding/json"
	"reflect"
	"regexp"
	"testing"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"

	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Each harness has a dead-letter queue. A queue declared now routes its
// dead letters to it through the default exchange; one declared before
// dead-letters to the vhost's hcp.dlx (every policy of the vhost: command,
// event, a Callee's own limits policy), where a Binding with the keys of
// its own messages only routes them to it.
func TestDeadLetterTopology(t *testing.T) {
	callee, caller := sampleCallee(), sampleCaller()
	cb, rb := sampleBroker(t, callee.Spec.Broker), sampleBroker(t, caller.Spec.Broker)
	for _, tc := range []struct {
		s          Subject
		b          Broker
		queue, key string
	}{
		{ForCallee(callee), cb, "hcp.dlq.cmd.lab-cvd", "lab-cvd"},
		{ForCaller(caller), rb, "hcp.dlq.evt.alpha", "alpha.*.*"},
	} {
		q := DeadLetterQueue(tc.s, tc.b)
		if q.Spec.Name != tc.queue || q.Spec.Type != QueueTypeQuorum || q.Spec.Arguments != nil || q.Name != tc.s.BaseName()+"-dlq" ||
			!metav1IsControlledBy(q, tc.s.UID) || q.Spec.Vhost != tc.b.Vhost {
			t.Errorf("dead-letter queue %+v %+v", q.ObjectMeta, q.Spec)
		}
		bd := DeadLetterBinding(tc.s, tc.b)
		if bd.Spec.Source != topology.DeadLetterExchange || bd.Spec.Destination != tc.queue || bd.Spec.RoutingKey != tc.key ||
			bd.Name != q.Name || !metav1IsControlledBy(bd, tc.s.UID) {
			t.Errorf("dead-letter binding %+v %+v", bd.ObjectMeta, bd.Spec)
		}
	}
	// Queues declared now route their dead letters themselves, through
	// the default exchange to their own dead-letter queue: no Binding.
	cq, err := CallerQueue(caller, rb)
	if err != nil {
		t.Fatal(err)
	}
	for q, dlq := range map[*topologyv1beta1.Queue]string{CalleeQueue(callee, cb): "hcp.dlq.cmd.lab-cvd", cq: "hcp.dlq.evt.alpha"} {
		args := map[string]any{}
		if err := json.Unmarshal(q.Spec.Arguments.Raw, &args); err != nil {
			t.Fatal(err)
		}
		if args[ArgDeadLetterExchange] != "" || args[ArgDeadLetterRoutingKey] != dlq || NeedsDeadLetterBinding(args) {
			t.Errorf("queue %s: arguments %v; want its dead letters routed to %s by the default exchange", q.Spec.Name, args, dlq)
		}
	}
	if !NeedsDeadLetterBinding(map[string]any{}) || !NeedsDeadLetterBinding(map[string]any{ArgSingleActiveConsumer: true}) {
		t.Error("a queue declared before DeadLetterArguments needs its dead-letter Binding")
	}
	x := DeadLetterExchange("hcp-system", rb, rb.Reference)
	if x.Spec.Name != "hcp.dlx" || x.Spec.Type != "topic" || !x.Spec.Durable || x.Namespace != "hcp-system" || len(x.OwnerReferences) != 0 {
		t.Errorf("dead-letter exchange %+v %+v", x.ObjectMeta, x.Spec)
	}
	p := DefaultCommandLimitsPolicy("hcp-system", cb, cb.Reference)
	if got := policyDefinition(t, p); !reflect.DeepEqual(got, map[string]any{"dead-letter-exchange": "hcp.dlx"}) || p.Spec.Pattern != `^hcp\.cmd\.` ||
		p.Spec.Priority != DefaultLimitsPolicyPriority {
		t.Errorf("default command policy %+v: %v", p.Spec, got)
	}
	d := DeadLetterLimitsPolicy("hcp-system", cb, cb.Reference)
	if got := policyDefinition(t, d); !reflect.DeepEqual(got, map[string]any{"max-length": float64(DefaultDeadLetterMaxLength), "overflow": "drop-head"}) ||
		d.Spec.Pattern != `^hcp\.dlq\.` {
		t.Errorf("dead-letter policy %+v: %v", d.Spec, got)
	}
	// The patterns of the event and command policies never reach a
	// dead-letter queue (it would dead-letter to itself).
	for _, pol := range []string{DefaultEventLimitsPolicy("n", rb, rb.Reference).Spec.Pattern, p.Spec.Pattern} {
		if matched(t, pol, "hcp.dlq.evt.alpha") || matched(t, pol, "hcp.dlq.cmd.lab-cvd") {
			t.Errorf("policy pattern %s matches a dead-letter queue", pol)
		}
	}
}

func matched(t *testing.T, pattern, s string) bool {
	t.Helper()
	re, err := regexp.Compile(pattern)
	if err != nil {
		t.Fatal(err)
	}
	return re.MatchString(s)
}
