// Package integration runs the operator against a real RabbitMQ and the
// real messaging-topology-operator (both provided by internal/testbed): the
// topology a Callee and Callers produce on the broker, and what their
// generated users can and cannot do there.
package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	amqp "github.com/rabbitmq/amqp091-go"
	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

const readyTimeout = 2 * time.Minute

// startManager runs the operator in-process against env until the test ends;
// its log goes to a file printed when the test fails.
func startManager(t *testing.T, env *testbed.Env, opts controller.Options) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "manager.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logFile), zap.UseDevMode(true)))
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  controller.CacheOptions(opts),
		// Each test of the package runs its own manager in this process.
		Controller: config.Controller{SkipNameValidation: new(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := controller.Setup(ctx, mgr, opts); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
		_ = logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("hcp-operator manager log:\n%s", b)
		}
	})
}

// startBed starts what every test here runs against: the test RabbitMQ,
// an API server that knows the HCP kinds, and a vhost of the test's own,
// named vhostPrefix and six random hex digits, deleted when the test ends
// (registered before all the test starts later: deleted after it stopped).
func startBed(t *testing.T, vhostPrefix string) (*testbed.Broker, *testbed.Env, string) {
	t.Helper()
	broker := testbed.EnsureRabbitMQ(t)
	env := testbed.StartEnv(t, testbed.Options{AddToScheme: []func(*runtime.Scheme) error{hcpv1alpha1.AddToScheme}})
	vhost := "/" + testbed.RandomName(vhostPrefix)
	broker.CleanupVhost(t, vhost)
	return broker, env, vhost
}

// topologyReady reads o (a Callee or a Caller) again and says why its
// TopologyReady is not True for its current generation, if it is not.
func topologyReady(ctx context.Context, c client.Client, o client.Object) error {
	if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
		return err
	}
	var conds []metav1.Condition
	switch x := o.(type) {
	case *hcpv1alpha1.Callee:
		conds = x.Status.Conditions
	case *hcpv1alpha1.Caller:
		conds = x.Status.Conditions
	}
	if c := meta.FindStatusCondition(conds, hcpv1alpha1.ConditionTopologyReady); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != o.GetGeneration() {
		return fmt.Errorf("%s: TopologyReady %s", o.GetName(), condition(conds, hcpv1alpha1.ConditionTopologyReady))
	}
	return nil
}

func condition(conds []metav1.Condition, typ string) string {
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		return "<none>"
	}
	return fmt.Sprintf("%s (%s: %s)", c.Status, c.Reason, c.Message)
}

// TestTopologyAndPermissionsOnTheBroker: a Callee and two external
// Callers, reconciled by the operator and declared by the real topology
// operator, give real quorum queues with exactly the expected arguments and
// bindings, and users that can do exactly what DESIGN section 3 allows.
func TestTopologyAndPermissionsOnTheBroker(t *testing.T) {
	broker, env, vhost := startBed(t, "hcp-it-")
	c := env.Client
	ctx := t.Context()
	ns := env.CreateNamespace(t, "hcp-it-")
	if _, err := testbed.CreateConnectionSecret(ctx, c, ns, "rmq"); err != nil {
		t.Fatal(err)
	}
	mto := testbed.StartTopologyOperator(t, env.Kubeconfig, ns)
	// The manager's default broker: the Secret "rmq" in each object's namespace.
	startManager(t, env, controller.Options{DefaultBroker: &resource.DefaultBroker{Name: "rmq"}, SidecarImage: "ghcr.io/hcp-io/hcp-operator:it"})
	testbed.DumpOnFailure(t, testbed.Dump{
		Client: c, Namespace: ns, Operators: []*testbed.TopologyOperator{mto}, Broker: broker, Vhosts: []string{vhost},
		Lists: []client.ObjectList{&hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}, &topologyv1beta1.VhostList{},
			&topologyv1beta1.ExchangeList{}, &topologyv1beta1.QueueList{}, &topologyv1beta1.BindingList{},
			&topologyv1beta1.UserList{}, &topologyv1beta1.PermissionList{}},
	})

	brokerSpec := hcpv1alpha1.BrokerSpec{Vhost: vhost, CreateVhost: true, VhostDeletionPolicy: "delete"}
	callee := &hcpv1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lab"},
		Spec: hcpv1alpha1.CalleeSpec{
			Broker:       brokerSpec,
			Capabilities: []hcpv1alpha1.Capability{{Name: "cvd.run", RiskLevel: hcpv1alpha1.RiskR2, DataClassification: hcpv1alpha1.DataT2}},
			CommandQueue: hcpv1alpha1.CommandQueueSpec{MaxLength: new(int64(1000)), DeliveryLimit: new(int32(5))},
			Harness: hcpv1alpha1.HarnessSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "harness", Image: "example.com/harness:1"}},
			}}},
		},
	}
	alpha := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alpha"}, Spec: hcpv1alpha1.CallerSpec{Broker: brokerSpec}}
	beta := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "beta"}, Spec: hcpv1alpha1.CallerSpec{Broker: brokerSpec,
		EventQueue: hcpv1alpha1.EventQueueSpec{MessageTTL: "PT1H", MaxLength: new(int64(500)), MaxLengthBytes: new(int64(1 << 20)), Overflow: "reject-publish"}}}
	for _, o := range []client.Object{callee, alpha, beta} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	// TopologyReady comes from the topology operator's own conditions.
	// (HarnessReady stays False: envtest runs no Deployment controller.)
	for _, o := range []client.Object{callee, alpha, beta} {
		testbed.Eventually(t, readyTimeout, fmt.Sprintf("%T %s TopologyReady", o, o.GetName()), func(ctx context.Context) error {
			return topologyReady(ctx, c, o)
		})
	}
	if cond := meta.FindStatusCondition(alpha.Status.Conditions, hcpv1alpha1.ConditionReady); cond == nil || cond.Status != metav1.ConditionTrue {
		t.Errorf("external Caller alpha not Ready: %s", condition(alpha.Status.Conditions, hcpv1alpha1.ConditionReady))
	}

	checkBrokerTopology(t, broker, vhost)

	// The users, with the credentials the operator generated.
	actors := map[string]*actor{}
	for _, s := range []struct{ name, secret string }{
		{"caller alpha", alpha.Status.CredentialsSecret}, {"caller beta", beta.Status.CredentialsSecret}, {"callee lab", callee.Status.CredentialsSecret},
	} {
		sec := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.secret}, sec); err != nil {
			t.Fatal(err)
		}
		a := &actor{name: s.name, username: string(sec.Data["username"])}
		var err error
		if a.conn, err = amqp.Dial(string(sec.Data["uri"])); err != nil {
			t.Fatalf("%s cannot connect with the uri of Secret %s: %v", s.name, s.secret, err)
		}
		t.Cleanup(func() { _ = a.conn.Close() })
		actors[s.name] = a
	}
	checkPermissionMatrix(t, actors)
	checkDeadLetters(t, broker, vhost, actors)

	// Limits are a policy: an edited limit reaches the live queue, whose
	// declaration never changes.
	testbed.Eventually(t, readyTimeout, "edit the Callee", func(ctx context.Context) error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(callee), callee); err != nil {
			return err
		}
		callee.Spec.CommandQueue.MaxLength = new(int64(2000))
		return c.Update(ctx, callee)
	})
	testbed.Eventually(t, readyTimeout, "the new limit applies to the live queue", func(ctx context.Context) error {
		q, err := getQueue(ctx, broker, vhost, "hcp.cmd.lab")
		if err != nil {
			return err
		}
		if q.Policy != "hcp-limits.hcp.cmd.lab" || fmt.Sprint(q.EffectivePolicyDefinition["max-length"]) != "2000" {
			return fmt.Errorf("policy %q effective definition %v", q.Policy, q.EffectivePolicyDefinition)
		}
		return nil
	})
	if err := c.Get(ctx, client.ObjectKeyFromObject(callee), callee); err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(callee.Status.Conditions, hcpv1alpha1.ConditionTopologyReady); cond == nil || cond.Status != metav1.ConditionTrue {
		t.Errorf("TopologyReady after a limit change: %s", condition(callee.Status.Conditions, hcpv1alpha1.ConditionTopologyReady))
	}

	// Deleting one Caller removes its queue and user, and nothing shared.
	if err := c.Delete(ctx, beta); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, readyTimeout, "beta's queue and user removed from the broker", func(ctx context.Context) error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(beta), beta); err == nil {
			return fmt.Errorf("Caller beta still exists (finalizers %v; status %s)", beta.Finalizers, condition(beta.Status.Conditions, hcpv1alpha1.ConditionReady))
		}
		if _, err := broker.Queue(vhost, "hcp.evt.beta"); !testbed.IsNotFound(err) {
			return fmt.Errorf("queue hcp.evt.beta: %v", err)
		}
		if _, err := broker.Queue(vhost, "hcp.dlq.evt.beta"); !testbed.IsNotFound(err) {
			return fmt.Errorf("queue hcp.dlq.evt.beta: %v", err)
		}
		if _, err := broker.API.GetUser("caller.beta@" + vhost); !testbed.IsNotFound(err) {
			return fmt.Errorf("user caller.beta: %v", err)
		}
		return nil
	})
	names, err := exchangeNames(broker, vhost)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"hcp.commands", "hcp.dlx", "hcp.events"}) {
		t.Errorf("exchanges after deleting one of three users: %v", names)
	}
	if bs, _ := broker.Bindings(vhost); !hasBinding(bs, "hcp.commands", "hcp.cmd.lab", "lab") || !hasBinding(bs, "hcp.events", "hcp.evt.alpha", "alpha.#") {
		t.Errorf("bindings of the remaining users lost: %+v", bs)
	}

	// The last users go: so do the exchanges, the users and the vhost
	// (deletionPolicy delete).
	for _, o := range []client.Object{callee, alpha} {
		if err := c.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	testbed.Eventually(t, readyTimeout, "the vhost, its exchanges and the users removed from the broker", func(ctx context.Context) error {
		for _, o := range []client.Object{callee, alpha} {
			if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err == nil {
				return fmt.Errorf("%T %s still exists (finalizers %v)", o, o.GetName(), o.GetFinalizers())
			}
		}
		for _, u := range []string{"callee.lab@" + vhost, "caller.alpha@" + vhost} {
			if _, err := broker.API.GetUser(u); !testbed.IsNotFound(err) {
				return fmt.Errorf("user %s: %v", u, err)
			}
		}
		if _, err := broker.API.GetVhost(vhost); !testbed.IsNotFound(err) {
			return fmt.Errorf("vhost %s: %v", vhost, err)
		}
		return nil
	})
}

func exchangeNames(b *testbed.Broker, vhost string) ([]string, error) {
	xs, err := b.Exchanges(vhost)
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

func hasBinding(bs []rabbithole.BindingInfo, source, dest, key string) bool {
	for _, b := range bs {
		if b.Source == source && b.Destination == dest && b.DestinationType == "queue" && b.RoutingKey == key {
			return true
		}
	}
	return false
}

// checkBrokerTopology reads the broker through the management API.
func checkBrokerTopology(t *testing.T, b *testbed.Broker, vhost string) {
	t.Helper()
	// Declared with what no policy can give (and their dead-letter
	// routing, which never changes); the limits are each queue's policy.
	dlx := func(queue string, args map[string]any) map[string]any {
		args["x-dead-letter-exchange"], args["x-dead-letter-routing-key"] = "", "hcp.dlq."+strings.TrimPrefix(queue, "hcp.")
		return args
	}
	wantQueues := map[string]map[string]any{
		"hcp.cmd.lab":       dlx("hcp.cmd.lab", map[string]any{"x-queue-type": "quorum"}),
		"hcp.evt.alpha":     dlx("hcp.evt.alpha", map[string]any{"x-queue-type": "quorum", "x-single-active-consumer": true}),
		"hcp.evt.beta":      dlx("hcp.evt.beta", map[string]any{"x-queue-type": "quorum", "x-single-active-consumer": true}),
		"hcp.dlq.cmd.lab":   {"x-queue-type": "quorum"},
		"hcp.dlq.evt.alpha": {"x-queue-type": "quorum"},
		"hcp.dlq.evt.beta":  {"x-queue-type": "quorum"},
	}
	// Every policy names hcp.dlx as dead-letter exchange (for queues of
	// earlier versions; these queues' arguments win); dead-letter queues
	// are bounded.
	dlq := map[string]any{"max-length": float64(resource.DefaultDeadLetterMaxLength), "overflow": "drop-head"}
	wantLimits := map[string]map[string]any{
		"hcp.cmd.lab":       {"max-length": float64(1000), "delivery-limit": float64(5), "overflow": "reject-publish", "dead-letter-exchange": "hcp.dlx"},
		"hcp.evt.alpha":     {"message-ttl": float64(86400000), "max-length": float64(100000), "overflow": "drop-head", "dead-letter-exchange": "hcp.dlx"},
		"hcp.evt.beta":      {"message-ttl": float64(3600000), "max-length": float64(500), "max-length-bytes": float64(1 << 20), "overflow": "reject-publish", "dead-letter-exchange": "hcp.dlx"},
		"hcp.dlq.cmd.lab":   dlq,
		"hcp.dlq.evt.alpha": dlq,
		"hcp.dlq.evt.beta":  dlq,
	}
	for name, want := range wantLimits {
		testbed.Eventually(t, readyTimeout, "the limits policy of "+name, func(ctx context.Context) error {
			q, err := getQueue(ctx, b, vhost, name)
			if err != nil {
				return err
			}
			policy := "hcp-limits." + name
			switch {
			case name == "hcp.evt.alpha": // the default limits: the vhost's policy
				policy = resource.DefaultEventLimitsPolicyName
			case strings.HasPrefix(name, "hcp.dlq."):
				policy = resource.DeadLetterLimitsPolicyName
			}
			if q.Policy != policy || !reflect.DeepEqual(q.EffectivePolicyDefinition, want) {
				return fmt.Errorf("queue %s: policy %q effective definition %v, want %v", name, q.Policy, q.EffectivePolicyDefinition, want)
			}
			return nil
		})
	}
	qs, err := b.Queues(vhost)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	got := map[string]bool{}
	for _, q := range qs {
		got[q.Name] = true
		lines = append(lines, fmt.Sprintf("  %-14s type=%-6s durable=%t arguments=%s", q.Name, q.Type, q.Durable, formatArgs(q.Arguments)))
		want, ok := wantQueues[q.Name]
		if !ok {
			t.Errorf("unexpected queue %s", q.Name)
			continue
		}
		if q.Type != "quorum" || !q.Durable || q.AutoDelete != false {
			t.Errorf("queue %s: type %s durable %t auto_delete %v", q.Name, q.Type, q.Durable, q.AutoDelete)
		}
		if args := q.Arguments; !reflect.DeepEqual(args, want) {
			t.Errorf("queue %s arguments %v, want exactly %v", q.Name, args, want)
		}
	}
	for name := range wantQueues {
		if !got[name] {
			t.Errorf("queue %s missing", name)
		}
	}
	slices.Sort(lines)
	t.Logf("broker queues in vhost %s:\n%s", vhost, strings.Join(lines, "\n"))

	xs, err := b.Exchanges(vhost)
	if err != nil {
		t.Fatal(err)
	}
	wantX := map[string]string{"hcp.commands": "direct", "hcp.events": "topic", "hcp.dlx": "topic"}
	for _, x := range xs {
		if typ, ok := wantX[x.Name]; ok {
			if x.Type != typ || !x.Durable || x.AutoDelete != false {
				t.Errorf("exchange %s: type %s durable %t", x.Name, x.Type, x.Durable)
			}
			delete(wantX, x.Name)
		}
	}
	if len(wantX) > 0 {
		t.Errorf("exchanges missing: %v", slices.Collect(maps.Keys(wantX)))
	}

	bindings, err := b.BindingNames(vhost)
	if err != nil {
		t.Fatal(err)
	}
	// No dead-letter bindings: the queues route their dead letters.
	if want := []string{"hcp.commands -> hcp.cmd.lab [lab]", "hcp.events -> hcp.evt.alpha [alpha.#]", "hcp.events -> hcp.evt.beta [beta.#]"}; !slices.Equal(bindings, want) {
		t.Errorf("bindings %v, want exactly %v", bindings, want)
	}

	ps, err := b.Permissions(vhost)
	if err != nil {
		t.Fatal(err)
	}
	wantP := map[string][3]string{
		"callee.lab@" + vhost:   {`^$`, `^hcp\.events$`, `^hcp\.cmd\.lab$`},
		"caller.alpha@" + vhost: {`^$`, `^hcp\.commands$`, `^hcp\.evt\.alpha$`},
		"caller.beta@" + vhost:  {`^$`, `^hcp\.commands$`, `^hcp\.evt\.beta$`},
	}
	for _, p := range ps {
		want, ok := wantP[p.User]
		if !ok {
			if p.User != b.Username { // the topology operator's own admin user
				t.Errorf("unexpected permission for %s", p.User)
			}
			continue
		}
		if got := [3]string{p.Configure, p.Write, p.Read}; got != want {
			t.Errorf("permissions of %s: configure/write/read %q, want %q", p.User, got, want)
		}
		delete(wantP, p.User)
	}
	if len(wantP) > 0 {
		t.Errorf("permissions missing for %v", slices.Collect(maps.Keys(wantP)))
	}
	for _, u := range []string{"callee.lab@" + vhost, "caller.alpha@" + vhost} {
		info, err := b.API.GetUser(u)
		if err != nil {
			t.Errorf("user %s: %v", u, err)
			continue
		}
		if len(info.Tags) != 0 {
			t.Errorf("user %s has tags %v (management access)", u, info.Tags)
		}
	}
}

// actor is a harness user connected to the broker.
type actor struct {
	name, username string
	conn           *amqp.Connection
}

// opTimeout bounds every AMQP operation of the matrix.
const opTimeout = 10 * time.Second

// withChannel runs f on a fresh channel and returns f's error, or the
// channel's closing error when the broker closed it (access refused,
// precondition failed), which is how most refusals arrive.
func (a *actor) withChannel(f func(ch *amqp.Channel, closed <-chan *amqp.Error) error) error {
	ch, err := a.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	defer func() { _ = ch.Close() }()
	return f(ch, closed)
}

// publish publishes with confirms and waits for the confirm or a refusal.
func (a *actor) publish(exchange, key, userID string) error {
	return a.withChannel(func(ch *amqp.Channel, closed <-chan *amqp.Error) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent, UserId: userID,
			MessageId: testbed.RandomName("m-"), Body: []byte(`{"hcp_version":"1.0"}`),
		})
		if err != nil {
			return err
		}
		select {
		case e := <-closed:
			if e == nil {
				return errors.New("channel closed")
			}
			return e
		case <-conf.Done():
			// A refusal may close the channel right after; give it the
			// benefit of a moment.
			select {
			case e := <-closed:
				if e != nil {
					return e
				}
			case <-time.After(100 * time.Millisecond):
			}
			if !conf.Acked() {
				return errors.New("nacked by the broker")
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// consume starts a consumer and, when wantFrom is set, waits for one
// message and checks its validated user_id.
func (a *actor) consume(queue, wantFrom string) error {
	return a.withChannel(func(ch *amqp.Channel, closed <-chan *amqp.Error) error {
		if err := ch.Qos(1, 0, false); err != nil {
			return err
		}
		deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			return err
		}
		if wantFrom == "" {
			return nil
		}
		select {
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("consumer closed")
			}
			_ = d.Ack(false)
			if d.UserId != wantFrom {
				return fmt.Errorf("message from user_id %q, want %q", d.UserId, wantFrom)
			}
			return nil
		case e := <-closed:
			return e
		case <-time.After(opTimeout):
			return errors.New("no message within the timeout")
		}
	})
}

func (a *actor) declareQueue(name string, passive bool) error {
	return a.withChannel(func(ch *amqp.Channel, _ <-chan *amqp.Error) error {
		args := amqp.Table{"x-queue-type": "quorum"}
		if passive {
			_, err := ch.QueueDeclarePassive(name, true, false, false, false, args)
			return err
		}
		_, err := ch.QueueDeclare(name, true, false, false, false, args)
		return err
	})
}

func (a *actor) declareExchange(name string) error {
	return a.withChannel(func(ch *amqp.Channel, _ <-chan *amqp.Error) error {
		return ch.ExchangeDeclare(name, "topic", true, false, false, false, nil)
	})
}

func (a *actor) deleteQueue(name string) error {
	return a.withChannel(func(ch *amqp.Channel, _ <-chan *amqp.Error) error {
		_, err := ch.QueueDelete(name, false, false, false)
		return err
	})
}

func (a *actor) deleteExchange(name string) error {
	return a.withChannel(func(ch *amqp.Channel, _ <-chan *amqp.Error) error {
		return ch.ExchangeDelete(name, false, false)
	})
}

func (a *actor) bind(queue, exchange, key string) error {
	return a.withChannel(func(ch *amqp.Channel, _ <-chan *amqp.Error) error {
		return ch.QueueBind(queue, key, exchange, false, nil)
	})
}

// checkPermissionMatrix runs every operation as each user, checks the
// outcome against DESIGN section 3 and prints the matrix.
func checkPermissionMatrix(t *testing.T, actors map[string]*actor) {
	t.Helper()
	alpha, beta, lab := actors["caller alpha"], actors["caller beta"], actors["callee lab"]
	session := "3f2b8c1e-5d4a-4e6b-9c7d-1a2b3c4d5e6f"
	type op struct {
		name string
		run  func(a *actor) error
		// allowed by actor name
		allowed map[string]bool
	}
	own := func(a *actor) string {
		if a == lab {
			return "hcp.cmd.lab"
		}
		return "hcp.evt.alpha"
	}
	ops := []op{
		{"publish hcp.commands, key lab, user_id = own username", func(a *actor) error { return a.publish("hcp.commands", "lab", a.username) },
			map[string]bool{alpha.name: true}},
		{"publish hcp.commands, key lab, user_id = another user (forged)", func(a *actor) error { return a.publish("hcp.commands", "lab", beta.username) },
			nil},
		{"publish hcp.events, key alpha.{session}.event, user_id = own", func(a *actor) error {
			return a.publish("hcp.events", "alpha."+session+".event", a.username)
		}, map[string]bool{lab.name: true}},
		{"consume hcp.cmd.lab (the callee's command queue)", func(a *actor) error {
			if a == lab {
				return a.consume("hcp.cmd.lab", alpha.username) // the command alpha published, with alpha's validated identity
			}
			return a.consume("hcp.cmd.lab", "")
		}, map[string]bool{lab.name: true}},
		{"consume hcp.evt.alpha (alpha's event queue)", func(a *actor) error {
			if a == alpha {
				return a.consume("hcp.evt.alpha", lab.username) // the event lab published
			}
			return a.consume("hcp.evt.alpha", "")
		}, map[string]bool{alpha.name: true}},
		{"consume hcp.evt.beta (another caller's queue)", func(a *actor) error { return a.consume("hcp.evt.beta", "") }, nil},
		{"passive declare of its own queue (topology check)", func(a *actor) error { return a.declareQueue(own(a), true) },
			map[string]bool{alpha.name: true, lab.name: true}},
		{"declare queue hcp.evt.evil", func(a *actor) error { return a.declareQueue("hcp.evt.evil", false) }, nil},
		{"declare exchange hcp.evil", func(a *actor) error { return a.declareExchange("hcp.evil") }, nil},
		{"bind its own queue to hcp.events with #", func(a *actor) error { return a.bind(own(a), "hcp.events", "#") }, nil},
		{"delete its own queue", func(a *actor) error { return a.deleteQueue(own(a)) }, nil},
		{"delete exchange hcp.commands", func(a *actor) error { return a.deleteExchange("hcp.commands") }, nil},
	}
	columns := []*actor{alpha, lab}
	var table strings.Builder
	fmt.Fprintf(&table, "\n%-64s | %-34s | %-34s\n", "operation", "caller alpha", "callee lab")
	fmt.Fprintf(&table, "%s-+-%s-+-%s\n", strings.Repeat("-", 64), strings.Repeat("-", 34), strings.Repeat("-", 34))
	for _, o := range ops {
		fmt.Fprintf(&table, "%-64s", o.name)
		for _, a := range columns {
			err := o.run(a)
			cell := "allowed"
			if err != nil {
				cell = "refused " + refusal(err)
			}
			if want := o.allowed[a.name]; want != (err == nil) {
				cell += " UNEXPECTED"
				t.Errorf("%s: %s: want allowed=%t, got error %v", a.name, o.name, want, err)
			}
			fmt.Fprintf(&table, " | %-34s", cell)
		}
		table.WriteString("\n")
	}
	t.Logf("permission matrix (users %s, %s; beta is %s):%s", alpha.username, lab.username, beta.username, table.String())
}

// refusal names the AMQP reply code of a refusal.
func refusal(err error) string {
	var e *amqp.Error
	if errors.As(err, &e) {
		switch e.Code {
		case amqp.AccessRefused:
			return "(403 ACCESS_REFUSED)"
		case amqp.PreconditionFailed:
			return "(406 PRECONDITION_FAILED)"
		case amqp.NotFound:
			return "(404 NOT_FOUND)"
		}
		return fmt.Sprintf("(%d)", e.Code)
	}
	return "(" + err.Error() + ")"
}

// formatArgs prints queue arguments sorted, numbers as integers.
func formatArgs(args map[string]any) string {
	parts := make([]string, 0, len(args))
	for _, k := range slices.Sorted(maps.Keys(args)) {
		v := args[k]
		if f, ok := v.(float64); ok && f == float64(int64(f)) {
			v = int64(f)
		}
		parts = append(parts, fmt.Sprintf("%s=%v", k, v))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
