//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// brokerTopology reads the broker through its management API: the vhost's
// queues with exactly their arguments, the exchanges, exactly the
// bindings, the two users without tags and their permissions, and one
// consumer on each queue (the sidecars are connected).
func (r *samplesRun) brokerTopology(t *testing.T) {
	b := r.broker
	eventually(t, time.Minute, "the sidecars consuming (one consumer per queue)", func(context.Context) error {
		for _, q := range []string{topology.CommandQueue(calleeID), topology.EventQueue(callerID)} {
			info, err := b.Queue(r.vhost, q)
			if err != nil {
				return fmt.Errorf("queue %s: %w", q, err)
			}
			if info.Consumers != 1 {
				return fmt.Errorf("queue %s has %d consumers", q, info.Consumers)
			}
		}
		return nil
	})

	// Expected declaration: quorum queues, and a single active consumer
	// on the event queue, and the dead-letter route. The limits are each queue's
	// policy (they can change on a live queue): the sample's, passed
	// through, plus the operator's fixed choices (DESIGN section 3):
	// reject-publish on a length-limited command queue; on the event
	// queue the sample's TTL, the default length limit and drop-head.
	cq := r.callee.Spec.CommandQueue
	ttl, err := task.ParseDuration(string(r.caller.Spec.EventQueue.MessageTTL))
	if err != nil {
		t.Fatal(err)
	}
	// Each routes its dead letters to its own dead-letter queue through
	// the default exchange (resource.DeadLetterArguments): no Binding.
	withDeadLetters := func(queue string, args map[string]any) map[string]any {
		for k, v := range resource.DeadLetterArguments(queue) {
			args[k] = v
		}
		return args
	}
	wantQueues := map[string]map[string]any{
		topology.CommandQueue(calleeID): withDeadLetters(topology.CommandQueue(calleeID), map[string]any{"x-queue-type": "quorum"}),
		topology.EventQueue(callerID):   withDeadLetters(topology.EventQueue(callerID), map[string]any{"x-queue-type": "quorum", "x-single-active-consumer": true}),
		// The dead-letter queues (resource/deadletter.go).
		topology.DeadLetterQueue(topology.CommandQueue(calleeID)): {"x-queue-type": "quorum"},
		topology.DeadLetterQueue(topology.EventQueue(callerID)):   {"x-queue-type": "quorum"},
	}
	wantPolicies := map[string]map[string]any{
		"hcp-limits." + topology.CommandQueue(calleeID): {"max-length": float64(*cq.MaxLength), "delivery-limit": float64(*cq.DeliveryLimit), "overflow": "reject-publish",
			resource.PolicyDeadLetterExchange: topology.DeadLetterExchange},
		// The sample's TTL is the default: the vhost's default policy.
		resource.DefaultEventLimitsPolicyName: {"message-ttl": float64(ttl.Milliseconds()), "max-length": float64(100000), "overflow": "drop-head",
			resource.PolicyDeadLetterExchange: topology.DeadLetterExchange},
		resource.DefaultCommandLimitsPolicyName: {resource.PolicyDeadLetterExchange: topology.DeadLetterExchange},
		resource.DeadLetterLimitsPolicyName:     {"max-length": float64(resource.DefaultDeadLetterMaxLength), "overflow": "drop-head"},
	}
	pols, err := b.API.ListPoliciesIn(r.vhost)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pols {
		if want, ok := wantPolicies[p.Name]; ok {
			if got := map[string]any(p.Definition); !reflect.DeepEqual(got, want) {
				t.Errorf("policy %s: definition %v, want %v", p.Name, got, want)
			}
			delete(wantPolicies, p.Name)
		}
	}
	if len(wantPolicies) > 0 {
		t.Errorf("limits policies missing: %v", wantPolicies)
	}
	qs, err := b.Queues(r.vhost)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, q := range qs {
		lines = append(lines, fmt.Sprintf("queue %s type=%s durable=%t auto_delete=%v arguments=%v", q.Name, q.Type, q.Durable, q.AutoDelete, q.Arguments))
		want, ok := wantQueues[q.Name]
		if !ok {
			t.Errorf("unexpected queue %s in vhost %s", q.Name, r.vhost)
			continue
		}
		delete(wantQueues, q.Name)
		if q.Type != "quorum" || !q.Durable || bool(q.AutoDelete) {
			t.Errorf("queue %s: type %s durable %t auto_delete %v", q.Name, q.Type, q.Durable, q.AutoDelete)
		}
		if !reflect.DeepEqual(q.Arguments, want) {
			t.Errorf("queue %s arguments %v, want exactly %v", q.Name, q.Arguments, want)
		}
	}
	for q := range wantQueues {
		t.Errorf("queue %s missing from vhost %s", q, r.vhost)
	}

	xs, err := b.Exchanges(r.vhost)
	if err != nil {
		t.Fatal(err)
	}
	wantX := map[string]string{topology.CommandsExchange: "direct", topology.EventsExchange: "topic", topology.DeadLetterExchange: topology.DeadLetterExchangeType}
	for _, x := range xs {
		if x.Name == "" || strings.HasPrefix(x.Name, "amq.") {
			continue
		}
		lines = append(lines, fmt.Sprintf("exchange %s type=%s durable=%t", x.Name, x.Type, x.Durable))
		typ, ok := wantX[x.Name]
		if !ok {
			t.Errorf("unexpected exchange %s", x.Name)
			continue
		}
		delete(wantX, x.Name)
		if x.Type != typ || !x.Durable || bool(x.AutoDelete) {
			t.Errorf("exchange %s: type %s durable %t auto_delete %v, want %s, durable", x.Name, x.Type, x.Durable, x.AutoDelete, typ)
		}
	}
	for x := range wantX {
		t.Errorf("exchange %s missing", x)
	}

	bindings, err := r.bindings()
	if err != nil {
		t.Fatal(err)
	}
	lines = append(lines, bindings...)
	if want := []string{
		fmt.Sprintf("binding %s -> %s [%s]", topology.CommandsExchange, topology.CommandQueue(calleeID), topology.CommandRoutingKey(calleeID)),
		fmt.Sprintf("binding %s -> %s [%s]", topology.EventsExchange, topology.EventQueue(callerID), topology.EventBindingKey(callerID)),
	}; !slices.Equal(bindings, want) {
		t.Errorf("bindings %v, want exactly %v", bindings, want)
	}

	calleeUser := topology.Username(topology.RoleCallee, r.vhost, calleeID)
	callerUser := topology.Username(topology.RoleCaller, r.vhost, callerID)
	ps, err := b.Permissions(r.vhost)
	if err != nil {
		t.Fatal(err)
	}
	wantP := map[string]topology.Permissions{calleeUser: topology.CalleePermissions(calleeID), callerUser: topology.CallerPermissions(callerID)}
	for _, p := range ps {
		lines = append(lines, fmt.Sprintf("permission %s configure=%q write=%q read=%q", p.User, p.Configure, p.Write, p.Read))
		want, ok := wantP[p.User]
		if !ok {
			if p.User != b.Username { // the topology operator's management user
				t.Errorf("unexpected permission on %s for %s", r.vhost, p.User)
			}
			continue
		}
		delete(wantP, p.User)
		if got := (topology.Permissions{Configure: p.Configure, Write: p.Write, Read: p.Read}); got != want {
			t.Errorf("permissions of %s: %+v, want %+v", p.User, got, want)
		}
	}
	for u := range wantP {
		t.Errorf("no permissions on %s for %s", r.vhost, u)
	}
	for _, u := range []string{calleeUser, callerUser} {
		info, err := b.API.GetUser(u)
		if err != nil {
			t.Errorf("user %s: %v", u, err)
			continue
		}
		lines = append(lines, fmt.Sprintf("user %s tags=%v", u, info.Tags))
		if len(info.Tags) != 0 {
			t.Errorf("user %s has tags %v (management access)", u, info.Tags)
		}
	}
	slices.Sort(lines)
	t.Logf("broker %s, vhost %s:\n%s", b.ManagementURL, r.vhost, indent(strings.Join(lines, "\n")))
}

// bindings are the vhost's bindings as "binding SOURCE -> QUEUE [KEY]",
// sorted, the default exchange's left out.
func (r *samplesRun) bindings() ([]string, error) {
	names, err := r.broker.BindingNames(r.vhost)
	for i := range names {
		names[i] = "binding " + names[i]
	}
	return names, err
}

func (r *samplesRun) exchangeNames() ([]string, error) {
	xs, err := r.broker.Exchanges(r.vhost)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, x := range xs {
		if x.Name != "" && !strings.HasPrefix(x.Name, "amq.") {
			names = append(names, x.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}
