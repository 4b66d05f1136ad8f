package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	amqp "github.com/rabbitmq/amqp091-go"
	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// TestSharedTopologyOutlivesATenant: two tenant namespaces use one vhost,
// one through the manager's default broker (a Secret in the operator's
// namespace), the other through its own connection Secret. Shared objects
// an earlier version left in a tenant namespace are adopted without the
// broker's exchanges ever being deleted. Deleting one tenant's objects as
// its namespace deletion would leaves the exchanges, the other tenant's
// bindings and its TopologyReady alone; deleting the last user removes the
// shared topology (the vhost is retained, as asked).
func TestSharedTopologyOutlivesATenant(t *testing.T) {
	broker, env, vhost := startBed(t, "hcp-shared-")
	c := env.Client
	ctx := t.Context()
	home, nsA, nsB := env.CreateNamespace(t, "hcp-operator-"), env.CreateNamespace(t, "tenant-a-"), env.CreateNamespace(t, "tenant-b-")

	// The default broker, as the chart makes it: in the operator's
	// namespace, open to every namespace.
	def, err := testbed.CreateConnectionSecret(ctx, c, home, "rmq-default")
	if err != nil {
		t.Fatal(err)
	}
	def.Annotations = map[string]string{resource.AllowedNamespacesAnnotation: "*"}
	if err := c.Update(ctx, def); err != nil {
		t.Fatal(err)
	}
	// Tenant B brings its own Secret for the same broker.
	if _, err := testbed.CreateConnectionSecret(ctx, c, nsB, "rmq"); err != nil {
		t.Fatal(err)
	}
	mto := testbed.StartTopologyOperator(t, env.Kubeconfig, home)
	lists := []client.ObjectList{&hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}, &topologyv1beta1.VhostList{},
		&topologyv1beta1.ExchangeList{}, &topologyv1beta1.QueueList{}, &topologyv1beta1.BindingList{}, &topologyv1beta1.PolicyList{}}
	for _, ns := range []string{home, nsA, nsB} {
		testbed.DumpOnFailure(t, testbed.Dump{Client: c, Namespace: ns, Operators: []*testbed.TopologyOperator{mto}, Broker: broker, Vhosts: []string{vhost}, Lists: lists})
	}

	defRef := topologyv1beta1.RabbitmqClusterReference{Namespace: home, ConnectionSecret: &corev1.LocalObjectReference{Name: "rmq-default"}}
	b, err := resource.BrokerFromConnectionSecret(defRef, hcpv1alpha1.BrokerSpec{Vhost: vhost}, def)
	if err != nil {
		t.Fatal(err)
	}
	key := b.Key()

	// What an earlier version made in tenant A: the vhost and the
	// exchanges as objects in the tenant's namespace.
	legacyCmd, legacyEvt := resource.Exchanges(nsA, b, defRef)
	legacyVhost := resource.Vhost(nsA, b, defRef, resource.DeletionPolicyDelete)
	if err := c.Create(ctx, legacyVhost); err != nil {
		t.Fatal(err)
	}
	testbed.WaitForTopologyReady(t, c, legacyVhost, readyTimeout)
	// The topology operator and the test act as the broker's admin user.
	if _, err := broker.API.UpdatePermissionsIn(vhost, broker.Username, rabbithole.Permissions{Configure: ".*", Write: ".*", Read: ".*"}); err != nil {
		t.Fatal(err)
	}
	for _, o := range []client.Object{legacyCmd, legacyEvt} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		testbed.WaitForTopologyReady(t, c, o, readyTimeout)
	}
	// A witness: a binding of hcp.commands nobody re-declares. Deleting
	// the exchange on the broker, even for a moment, deletes it.
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
	if _, err := ch.QueueDeclare("witness", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("witness", "witness", "hcp.commands", false, nil); err != nil {
		t.Fatal(err)
	}

	startManager(t, env, controller.Options{DefaultBroker: &resource.DefaultBroker{Namespace: home, Name: "rmq-default"}, SidecarImage: "ghcr.io/hcp-io/hcp-operator:it"})
	lab := &hcpv1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Namespace: nsA, Name: "lab"},
		Spec: hcpv1alpha1.CalleeSpec{
			Broker:       hcpv1alpha1.BrokerSpec{Vhost: vhost, CreateVhost: true},
			Capabilities: []hcpv1alpha1.Capability{{Name: "cvd.run", RiskLevel: hcpv1alpha1.RiskR2, DataClassification: hcpv1alpha1.DataT2}},
			Harness: hcpv1alpha1.HarnessSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "harness", Image: "example.com/harness:1"}},
			}}},
		},
	}
	beta := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: "beta"}, Spec: hcpv1alpha1.CallerSpec{Broker: hcpv1alpha1.BrokerSpec{
		Vhost: vhost, CreateVhost: true, VhostDeletionPolicy: "delete",
		RabbitmqClusterReference: &hcpv1alpha1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: "rmq"}},
	}}}
	for _, o := range []client.Object{lab, beta} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	testbed.Eventually(t, readyTimeout, "both tenants' topology ready", func(ctx context.Context) error {
		return errors.Join(topologyReady(ctx, c, lab), topologyReady(ctx, c, beta))
	})
	if lab.Labels[hcpv1alpha1.LabelVhostKey] != key {
		t.Fatalf("vhost key %q, want %q", lab.Labels[hcpv1alpha1.LabelVhostKey], key)
	}

	// The shared objects are in the operator's namespace only; the legacy
	// ones are gone without having deleted anything on the broker.
	testbed.Eventually(t, readyTimeout, "the legacy objects adopted", func(ctx context.Context) error {
		for _, o := range []client.Object{legacyVhost, legacyCmd, legacyEvt} {
			if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err == nil {
				return fmt.Errorf("legacy %T %s/%s still exists (finalizers %v)", o, o.GetNamespace(), o.GetName(), o.GetFinalizers())
			}
		}
		return nil
	})
	sharedIn := func(ns string) []string {
		var xs topologyv1beta1.ExchangeList
		var vs topologyv1beta1.VhostList
		if err := c.List(ctx, &xs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if err := c.List(ctx, &vs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, x := range xs.Items {
			names = append(names, "Exchange "+x.Name)
		}
		for _, v := range vs.Items {
			names = append(names, "Vhost "+v.Name)
		}
		slices.Sort(names)
		return names
	}
	cmdName, evtName := resource.ExchangeNames(key)
	if got, want := sharedIn(home), []string{"Exchange " + cmdName, "Exchange " + resource.DeadLetterExchangeObjectName(key), "Exchange " + evtName,
		"Vhost " + resource.VhostObjectName(key)}; !slices.Equal(got, want) {
		t.Errorf("operator namespace holds %v, want %v", got, want)
	}
	for _, ns := range []string{nsA, nsB} {
		if got := sharedIn(ns); len(got) != 0 {
			t.Errorf("tenant namespace %s holds shared objects %v", ns, got)
		}
	}
	bindings := func() []string {
		names, err := broker.BindingNames(vhost)
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	want := []string{"hcp.commands -> hcp.cmd.lab [lab]", "hcp.commands -> witness [witness]", "hcp.events -> hcp.evt.beta [beta.#]"}
	if got := bindings(); !slices.Equal(got, want) {
		t.Fatalf("broker bindings after adoption %v, want %v (the witness binding goes only if hcp.commands was deleted)", got, want)
	}
	t.Logf("after adoption: operator namespace %s holds %v; broker bindings %v", home, sharedIn(home), bindings())

	// Tenant B goes as its namespace would go: its Caller and every
	// object in the namespace at once (its connection Secret after its
	// topology objects: the topology operator cannot delete an object
	// whose connection Secret is gone, see docs/operations.md).
	deleteAllIn := func(ns string, lists ...client.ObjectList) {
		for _, l := range lists {
			if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			items, _ := meta.ExtractList(l)
			for _, it := range items {
				if err := c.Delete(ctx, it.(client.Object)); client.IgnoreNotFound(err) != nil {
					t.Fatal(err)
				}
			}
		}
	}
	deleteAllIn(nsB, &hcpv1alpha1.CallerList{}, &topologyv1beta1.QueueList{}, &topologyv1beta1.BindingList{}, &topologyv1beta1.UserList{},
		&topologyv1beta1.PermissionList{}, &topologyv1beta1.PolicyList{}, &topologyv1beta1.ExchangeList{}, &topologyv1beta1.VhostList{})
	testbed.Eventually(t, readyTimeout, "tenant B's objects gone from the API and the broker", func(ctx context.Context) error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(beta), beta); err == nil {
			return fmt.Errorf("Caller beta still exists: %s", condition(beta.Status.Conditions, hcpv1alpha1.ConditionReady))
		}
		var qs topologyv1beta1.QueueList
		if err := c.List(ctx, &qs, client.InNamespace(nsB)); err != nil || len(qs.Items) > 0 {
			return fmt.Errorf("queues left in %s: %d (%v)", nsB, len(qs.Items), err)
		}
		if _, err := broker.Queue(vhost, "hcp.evt.beta"); !testbed.IsNotFound(err) {
			return fmt.Errorf("queue hcp.evt.beta: %v", err)
		}
		return nil
	})
	deleteAllIn(nsB, &corev1.SecretList{})
	if err := c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsB}}); err != nil {
		t.Fatal(err)
	}

	// The exchanges, tenant A's binding and its readiness are untouched.
	if got, want := bindings(), []string{"hcp.commands -> hcp.cmd.lab [lab]", "hcp.commands -> witness [witness]"}; !slices.Equal(got, want) {
		t.Errorf("broker bindings after tenant B went: %v, want %v", got, want)
	}
	names, err := exchangeNames(broker, vhost)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"hcp.commands", "hcp.dlx", "hcp.events"}) {
		t.Errorf("broker exchanges after tenant B went: %v", names)
	}
	if err := topologyReady(ctx, c, lab); err != nil {
		t.Errorf("tenant A after tenant B went: %v", err)
	}
	for _, n := range []string{cmdName, evtName} {
		x := &topologyv1beta1.Exchange{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: home, Name: n}, x); err != nil || !x.DeletionTimestamp.IsZero() {
			t.Errorf("shared Exchange %s/%s: %v (deletionTimestamp %v)", home, n, err, x.DeletionTimestamp)
		}
	}
	// A command still reaches tenant A's queue.
	if err := ch.PublishWithContext(ctx, "hcp.commands", "lab", true, false, amqp.Publishing{Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the command routed to hcp.cmd.lab", func(context.Context) error {
		q, err := broker.Queue(vhost, "hcp.cmd.lab")
		if err != nil {
			return err
		}
		if q.Messages != 1 {
			return fmt.Errorf("hcp.cmd.lab holds %d messages", q.Messages)
		}
		return nil
	})
	t.Logf("after tenant B went: broker exchanges %v, bindings %v, Callee lab %s", names, bindings(), condition(lab.Status.Conditions, hcpv1alpha1.ConditionTopologyReady))

	// The last user goes: the shared topology goes; the vhost stays
	// (tenant A did not ask for its deletion).
	if _, err := ch.QueueDelete("witness", false, false, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, lab); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, readyTimeout, "the shared exchanges removed, the vhost retained", func(ctx context.Context) error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(lab), lab); err == nil {
			return fmt.Errorf("Callee lab still exists: %s", condition(lab.Status.Conditions, hcpv1alpha1.ConditionReady))
		}
		if got := sharedIn(home); len(got) > 0 {
			return fmt.Errorf("shared objects left in %s: %v", home, got)
		}
		names, err := exchangeNames(broker, vhost)
		if err != nil {
			return err
		}
		if len(names) > 0 {
			return fmt.Errorf("broker exchanges left: %v", names)
		}
		_, err = broker.API.GetVhost(vhost)
		return err
	})
}
