package resource

import (
	"reflect"
	"regexp"
	"testing"

	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Each harness has a dead-letter queue bound to the vhost's hcp.dlx with
// the keys of its own messages only, and every queue of the vhost (command,
// event, a Callee's own limits policy) dead-letters to hcp.dlx.
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
