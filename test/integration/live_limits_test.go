package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	amqp "github.com/rabbitmq/amqp091-go"
	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// TestLiveLimitsWithWebhooks: with the topology operator's admission
// webhooks on (a Queue's arguments can then never change), a Callee's
// length limit and a Caller's TTL change on the live queues, with
// messages in them: the new limit is the queue's effective policy, it
// takes effect (a publish beyond it is refused, one within it accepted),
// the Queue object is never updated, and the queue is the same one (its
// messages are all still there, in order). A queue an earlier version
// declared with its limits as arguments keeps them: raising the limit
// does not take effect (RabbitMQ applies the lower of argument and
// policy), and the Callee gets a Warning Event saying so.
func TestLiveLimitsWithWebhooks(t *testing.T) {
	broker, env, vhost := startBed(t, "hcp-limits-")
	c := env.Client
	ctx := t.Context()
	ns := env.CreateNamespace(t, "hcp-limits-")
	if _, err := testbed.CreateConnectionSecret(ctx, c, ns, "rmq"); err != nil {
		t.Fatal(err)
	}
	startTopologyOperatorWithWebhooks(t, env, ns)
	testbed.DumpOnFailure(t, testbed.Dump{Client: c, Namespace: ns, Broker: broker, Vhosts: []string{vhost},
		Lists: []client.ObjectList{&hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}, &topologyv1beta1.QueueList{}, &topologyv1beta1.PolicyList{}, &topologyv1beta1.ExchangeList{}}})

	brokerSpec := hcpv1alpha1.BrokerSpec{Vhost: vhost, CreateVhost: true, VhostDeletionPolicy: "delete"}
	newCallee := func(name string, maxLength int64) *hcpv1alpha1.Callee {
		return &hcpv1alpha1.Callee{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: hcpv1alpha1.CalleeSpec{
				Broker:       brokerSpec,
				Capabilities: []hcpv1alpha1.Capability{{Name: "cvd.run", RiskLevel: hcpv1alpha1.RiskR2, DataClassification: hcpv1alpha1.DataT2}},
				CommandQueue: hcpv1alpha1.CommandQueueSpec{MaxLength: new(maxLength)},
				Harness: hcpv1alpha1.HarnessSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "harness", Image: "example.com/harness:1"}},
				}}},
			},
		}
	}

	// A Callee as an earlier version left it: its queue declared with its
	// limits as arguments (the webhooks on: created, never to change).
	old := newCallee("old", 3)
	if err := c.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	oldQueue := &topologyv1beta1.Queue{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hcp-callee-old", Labels: map[string]string{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: hcpv1alpha1.GroupVersion.String(), Kind: "Callee", Name: old.Name, UID: old.UID, Controller: new(true), BlockOwnerDeletion: new(true)}}},
		Spec: topologyv1beta1.QueueSpec{Name: "hcp.cmd.old", Vhost: vhost, Type: "quorum", Durable: new(true), DeletionPolicy: "delete",
			Arguments:                resource.RawJSON(map[string]any{"x-max-length": 3, "x-overflow": "reject-publish"}),
			RabbitmqClusterReference: topologyv1beta1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: "rmq"}}},
	}
	vh := resource.Vhost(ns, resource.Broker{Vhost: vhost}, oldQueue.Spec.RabbitmqClusterReference, resource.DeletionPolicyDelete)
	vh.Name = "legacy-vhost"
	if err := c.Create(ctx, vh); err != nil {
		t.Fatal(err)
	}
	testbed.WaitForTopologyReady(t, c, vh, readyTimeout)
	// The test publishes and reads as the broker's admin user; so does the
	// topology operator.
	if _, err := broker.API.UpdatePermissionsIn(vhost, broker.Username, rabbithole.Permissions{Configure: ".*", Write: ".*", Read: ".*"}); err != nil {
		t.Fatal(err)
	}
	var conn *amqp.Connection
	testbed.Eventually(t, time.Minute, "connect to the broker", func(context.Context) error {
		var err error
		conn, err = amqp.Dial(broker.AMQPURI(broker.Username, broker.Password, vhost))
		return err
	})
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, oldQueue); err != nil {
		t.Fatal(err)
	}
	testbed.WaitForTopologyReady(t, c, oldQueue, readyTimeout)
	// The webhooks are on: a Queue's arguments cannot change.
	testbed.Eventually(t, readyTimeout, "the webhook refuses a change of queue arguments", func(ctx context.Context) error {
		probe := oldQueue.DeepCopy()
		if err := c.Get(ctx, client.ObjectKeyFromObject(probe), probe); err != nil {
			return err
		}
		probe.Spec.Arguments = resource.RawJSON(map[string]any{"x-max-length": 4, "x-overflow": "reject-publish"})
		err := c.Update(ctx, probe, client.DryRunAll)
		if err == nil || !strings.Contains(err.Error(), "queue arguments cannot be updated") {
			return fmt.Errorf("dry-run update of spec.arguments: %v", err)
		}
		t.Logf("the topology operator's webhook refuses an arguments change: %v", err)
		return nil
	})

	startManager(t, env, controller.Options{DefaultBroker: &resource.DefaultBroker{Namespace: ns, Name: "rmq"}, SidecarImage: "ghcr.io/hcp-io/hcp-operator:it"})
	lab := newCallee("lab", 1000)
	alpha := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alpha"}, Spec: hcpv1alpha1.CallerSpec{Broker: brokerSpec}}
	for _, o := range []client.Object{lab, alpha} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	allTopologyReady := func(ctx context.Context) error {
		var errs []error
		for _, o := range []client.Object{lab, alpha, old} {
			if err := topologyReady(ctx, c, o); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	testbed.Eventually(t, readyTimeout, "TopologyReady", allTopologyReady)

	// policy is the policy a queue's limits come from: the vhost's default
	// event limits while alpha keeps the defaults, else the queue's own.
	policy := func(queue string) string { return resource.LimitsPolicyName(queue) }
	effective := func(queue, key string, want int) func(context.Context) error {
		return func(ctx context.Context) error {
			q, err := getQueue(ctx, broker, vhost, queue)
			if err != nil {
				return err
			}
			got := q.EffectivePolicyDefinition[key]
			if f, ok := got.(float64); ok {
				got = int(f)
			}
			if q.Policy != policy(queue) || got != want {
				return fmt.Errorf("queue %s: policy %q effective_policy_definition %v, want %s=%v", queue, q.Policy, q.EffectivePolicyDefinition, key, want)
			}
			return nil
		}
	}
	policy = func(queue string) string {
		if queue == "hcp.evt.alpha" {
			return resource.DefaultEventLimitsPolicyName
		}
		return resource.LimitsPolicyName(queue)
	}
	testbed.Eventually(t, readyTimeout, "the limits policies apply", func(ctx context.Context) error {
		return errors.Join(effective("hcp.cmd.lab", "max-length", 1000)(ctx), effective("hcp.evt.alpha", "message-ttl", 86400000)(ctx), effective("hcp.cmd.old", "max-length", 3)(ctx))
	})
	q, err := getQueue(ctx, broker, vhost, "hcp.cmd.lab")
	if err != nil {
		t.Fatal(err)
	}
	// Its type and its dead-letter route (resource.DeadLetterArguments),
	// no limit: the limits are policies, so that they can change.
	want := map[string]any{"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "hcp.dlq.cmd.lab"}
	if len(q.Arguments) != len(want) || q.Arguments["x-queue-type"] != want["x-queue-type"] ||
		q.Arguments["x-dead-letter-exchange"] != want["x-dead-letter-exchange"] || q.Arguments["x-dead-letter-routing-key"] != want["x-dead-letter-routing-key"] {
		t.Errorf("hcp.cmd.lab declared with %v, want only %v", q.Arguments, want)
	}

	// A session's commands wait in the queue.
	publish := func(key, body string) bool {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "hcp.commands", key, true, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
		if err != nil {
			t.Fatal(err)
		}
		ok, err := conf.WaitContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for i := range 5 {
		if !publish("lab", fmt.Sprintf("m%d", i)) {
			t.Fatalf("m%d refused under max-length 1000", i)
		}
	}
	queueObj := &topologyv1beta1.Queue{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "hcp-callee-lab"}, queueObj); err != nil {
		t.Fatal(err)
	}
	generation, uid := queueObj.Generation, queueObj.UID

	// Lower the limit below what the queue holds: the broker applies it
	// at once; the next command is refused (reject-publish).
	setMaxLength := func(o *hcpv1alpha1.Callee, n int64) {
		testbed.Eventually(t, readyTimeout, fmt.Sprintf("set %s maxLength %d", o.Name, n), func(ctx context.Context) error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
				return err
			}
			o.Spec.CommandQueue.MaxLength = new(n)
			return c.Update(ctx, o)
		})
	}
	setMaxLength(lab, 3)
	testbed.Eventually(t, readyTimeout, "max-length 3 on the live queue", effective("hcp.cmd.lab", "max-length", 3))
	if publish("lab", "m5") {
		t.Error("a command was accepted beyond the lowered max-length")
	}
	// Raise it: accepted again.
	setMaxLength(lab, 10)
	testbed.Eventually(t, readyTimeout, "max-length 10 on the live queue", effective("hcp.cmd.lab", "max-length", 10))
	if !publish("lab", "m6") {
		t.Error("a command was refused under the raised max-length")
	}

	// The Caller's TTL too.
	testbed.Eventually(t, readyTimeout, "set alpha messageTTL", func(ctx context.Context) error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(alpha), alpha); err != nil {
			return err
		}
		alpha.Spec.EventQueue.MessageTTL = "PT1H"
		return c.Update(ctx, alpha)
	})
	// Its own policy now, above the default.
	policy = func(queue string) string { return resource.LimitsPolicyName(queue) }
	testbed.Eventually(t, readyTimeout, "message-ttl 3600000 on the live event queue", effective("hcp.evt.alpha", "message-ttl", 3600000))
	testbed.Eventually(t, readyTimeout, "TopologyReady after the changes", allTopologyReady)

	// Never an update of the Queue objects; the same queue, with its
	// messages in order.
	for _, name := range []string{"hcp-callee-lab", "hcp-caller-alpha", "hcp-callee-old"} {
		qo := &topologyv1beta1.Queue{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, qo); err != nil {
			t.Fatal(err)
		}
		if qo.Generation != 1 {
			t.Errorf("Queue %s at generation %d: its spec was updated", name, qo.Generation)
		}
		if name == "hcp-callee-lab" && qo.UID != uid {
			t.Errorf("Queue %s recreated", name)
		}
	}
	if generation != 1 {
		t.Errorf("Queue hcp-callee-lab was at generation %d before the changes", generation)
	}
	q, err = getQueue(ctx, broker, vhost, "hcp.cmd.lab")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("GET /api/queues/%s/hcp.cmd.lab: arguments %v policy %q operator_policy %q effective_policy_definition %v messages %d",
		vhost, q.Arguments, q.Policy, q.OperatorPolicy, q.EffectivePolicyDefinition, q.Messages)
	var bodies []string
	for {
		d, ok, err := ch.Get("hcp.cmd.lab", true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		bodies = append(bodies, string(d.Body))
	}
	if want := []string{"m0", "m1", "m2", "m3", "m4", "m6"}; !slices.Equal(bodies, want) {
		t.Errorf("hcp.cmd.lab held %v, want %v (the queue was not recreated, m5 was refused)", bodies, want)
	}

	// The earlier version's queue: its argument x-max-length=3 stays and
	// wins over a raised policy.
	setMaxLength(old, 10)
	testbed.Eventually(t, readyTimeout, "the policy asks for 10", effective("hcp.cmd.old", "max-length", 10))
	// A quorum queue rejects publishes once it is over its limit: with
	// a limit of 3 it takes 4 (with 10 it would take all 6).
	accepted := 0
	for i := range 6 {
		if publish("old", fmt.Sprintf("o%d", i)) {
			accepted++
		}
	}
	if accepted != 4 {
		t.Errorf("%d of 6 commands accepted by hcp.cmd.old, want 4 (over a limit of 3): its x-max-length=3 argument applies over the policy's 10", accepted)
	}
	testbed.Eventually(t, readyTimeout, "a Warning Event names the pinned limit", func(ctx context.Context) error {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == "old" && e.Reason == "QueueArgumentsPinLimits" && strings.Contains(e.Note, "x-max-length=3 (the spec asks for 10)") {
				t.Logf("Event %s %s: %s", e.Type, e.Reason, e.Note)
				return nil
			}
		}
		return fmt.Errorf("no QueueArgumentsPinLimits Event for Callee old among %d events", len(evs.Items))
	})
	if qo := (&topologyv1beta1.Queue{}); c.Get(ctx, client.ObjectKeyFromObject(oldQueue), qo) == nil && !rawEqualJSON(qo.Spec.Arguments.Raw, oldQueue.Spec.Arguments.Raw) {
		t.Errorf("the earlier version's Queue arguments changed: %s", qo.Spec.Arguments.Raw)
	}
}

func rawEqualJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}
