package resource

import (
	"encoding/json"
	"maps"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

func args(t *testing.T, q *topologyv1beta1.Queue) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(q.Spec.Arguments.Raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func policyDefinition(t *testing.T, p *topologyv1beta1.Policy) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(p.Spec.Definition.Raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// The command queue is declared without arguments; its limits are a
// policy matching exactly that queue.
func TestCalleeQueueLimitsArePolicy(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec hcpv1alpha1.CommandQueueSpec
		want map[string]any // nil: no policy
	}{
		{"no limits: no policy, no TTL", hcpv1alpha1.CommandQueueSpec{}, nil},
		{"max length rejects publishes", hcpv1alpha1.CommandQueueSpec{MaxLength: new(int64(10))},
			map[string]any{"max-length": float64(10), "overflow": "reject-publish"}},
		{"max bytes rejects publishes", hcpv1alpha1.CommandQueueSpec{MaxLengthBytes: new(int64(1 << 20))},
			map[string]any{"max-length-bytes": float64(1 << 20), "overflow": "reject-publish"}},
		{"delivery limit alone sets no overflow", hcpv1alpha1.CommandQueueSpec{DeliveryLimit: new(int32(3))},
			map[string]any{"delivery-limit": float64(3)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want != nil { // every queue dead-letters to hcp.dlx
				tc.want[PolicyDeadLetterExchange] = "hcp.dlx"
			}
			c := sampleCallee()
			c.Spec.CommandQueue = tc.spec
			b := sampleBroker(t, c.Spec.Broker)
			q := CalleeQueue(c, b)
			// No limit among its arguments: its dead-letter routing only.
			if got := args(t, q); !reflect.DeepEqual(got, map[string]any{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "hcp.dlq.cmd.lab-cvd"}) {
				t.Errorf("queue arguments = %v, want its dead-letter routing only", got)
			}
			if q.Spec.Name != "hcp.cmd.lab-cvd" || q.Spec.Type != "quorum" || q.Spec.Durable == nil || !*q.Spec.Durable || q.Spec.Vhost != "/hcp" {
				t.Errorf("queue spec = %+v", q.Spec)
			}
			p := CalleeLimitsPolicy(c, b)
			if tc.want == nil {
				if p != nil {
					t.Errorf("policy %+v, want none", p.Spec)
				}
				return
			}
			if got := policyDefinition(t, p); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("policy definition = %v, want %v", got, tc.want)
			}
			if p.Name != "hcp-callee-lab-cvd" || p.Spec.Name != "hcp-limits.hcp.cmd.lab-cvd" || p.Spec.Pattern != `^hcp\.cmd\.lab-cvd$` ||
				p.Spec.ApplyTo != "queues" || p.Spec.Priority != LimitsPolicyPriority || p.Spec.Vhost != "/hcp" ||
				!reflect.DeepEqual(p.Spec.RabbitmqClusterReference, b.Reference) || !metav1IsControlledBy(p, c.UID) {
				t.Errorf("policy = %+v %+v", p.ObjectMeta, p.Spec)
			}
			// The same arguments as a declaration would carry them.
			want := map[string]any{}
			for k, v := range tc.want {
				want["x-"+k] = v
			}
			if got := roundTrip(t, CalleeQueueArguments(tc.spec)); !reflect.DeepEqual(got, want) {
				t.Errorf("CalleeQueueArguments = %v, want %v", got, want)
			}
		})
	}
}

func metav1IsControlledBy(o metav1.Object, uid types.UID) bool {
	ref := metav1.GetControllerOf(o)
	return ref != nil && ref.UID == uid
}

func roundTrip(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	var out map[string]any
	if err := json.Unmarshal(RawJSON(m).Raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// The event queue is declared with x-single-active-consumer only; TTL,
// length and overflow are a policy.
func TestCallerQueueLimitsArePolicy(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec hcpv1alpha1.EventQueueSpec
		want map[string]any
	}{
		{"defaults: 24h TTL, 100000 messages, drop-head", hcpv1alpha1.EventQueueSpec{},
			map[string]any{"message-ttl": float64(86400000), "max-length": float64(100000), "overflow": "drop-head"}},
		{"explicit", hcpv1alpha1.EventQueueSpec{MessageTTL: "PT1H30M", MaxLength: new(int64(5)), MaxLengthBytes: new(int64(4096)), Overflow: "reject-publish"},
			map[string]any{"message-ttl": float64(5400000), "max-length": float64(5), "max-length-bytes": float64(4096), "overflow": "reject-publish"}},
		{"days", hcpv1alpha1.EventQueueSpec{MessageTTL: "P2D"},
			map[string]any{"message-ttl": float64(172800000), "max-length": float64(100000), "overflow": "drop-head"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.want[PolicyDeadLetterExchange] = "hcp.dlx"
			c := sampleCaller()
			c.Spec.EventQueue = tc.spec
			b := sampleBroker(t, c.Spec.Broker)
			q, err := CallerQueue(c, b)
			if err != nil {
				t.Fatal(err)
			}
			if got := args(t, q); !reflect.DeepEqual(got, map[string]any{"x-single-active-consumer": true,
				"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "hcp.dlq.evt.alpha"}) {
				t.Errorf("arguments = %v, want only x-single-active-consumer and the dead-letter routing", got)
			}
			if q.Spec.Name != "hcp.evt.alpha" {
				t.Errorf("queue name %q", q.Spec.Name)
			}
			p, err := CallerLimitsPolicy(c, b)
			if err != nil {
				t.Fatal(err)
			}
			if tc.spec == (hcpv1alpha1.EventQueueSpec{}) {
				// The defaults: the vhost's shared policy, none of its own.
				if p != nil {
					t.Fatalf("a Caller with the default limits got a policy of its own: %+v", p.Spec)
				}
				p = DefaultEventLimitsPolicy("hcp-system", b, b.Reference)
				if p.Spec.Pattern != `^hcp\.evt\.` || p.Spec.Name != "hcp-limits.hcp.evt.*" || p.Spec.Priority != DefaultLimitsPolicyPriority ||
					p.Spec.ApplyTo != "queues" || p.Namespace != "hcp-system" || len(p.OwnerReferences) != 0 || p.Labels[hcpv1alpha1.LabelVhostKey] != b.Key() {
					t.Errorf("default policy = %+v %+v", p.ObjectMeta, p.Spec)
				}
			} else if p.Spec.Pattern != `^hcp\.evt\.alpha$` || p.Spec.Name != "hcp-limits.hcp.evt.alpha" || p.Spec.Priority != LimitsPolicyPriority {
				t.Errorf("policy spec = %+v", p.Spec)
			}
			if got := policyDefinition(t, p); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("policy definition = %v, want %v", got, tc.want)
			}
		})
	}
	c := sampleCaller()
	c.Spec.EventQueue.MessageTTL = "P1M"
	if _, err := CallerQueue(c, sampleBroker(t, c.Spec.Broker)); err == nil || !strings.Contains(err.Error(), "messageTTL") {
		t.Errorf("month TTL: err = %v, want a messageTTL error", err)
	}
	if _, err := CallerLimitsPolicy(c, sampleBroker(t, c.Spec.Broker)); err == nil {
		t.Error("month TTL: CallerLimitsPolicy gave no error")
	}
}

// The pattern matches its queue and no other, whatever the id holds.
func TestLimitsPolicyPatternMatchesOnlyItsQueue(t *testing.T) {
	for _, q := range []string{"hcp.cmd.lab", "hcp.cmd.a-b_c", "hcp.evt.x"} {
		re := regexp.MustCompile(LimitsPolicyPattern(q))
		if !re.MatchString(q) {
			t.Errorf("%s does not match %s", re, q)
		}
		for _, other := range []string{q + "2", "x" + q, strings.Replace(q, ".", "x", 1), q + ".dlq"} {
			if re.MatchString(other) {
				t.Errorf("%s matches %s", re, other)
			}
		}
	}
}

// RabbitMQ's rule for quorum queues: the lower of argument and policy for
// numeric limits, the policy for overflow.
func TestPinnedLimits(t *testing.T) {
	legacy := map[string]any{"x-queue-type": "quorum", "x-max-length": float64(1000), "x-delivery-limit": float64(5), "x-overflow": "reject-publish"}
	for _, tc := range []struct {
		name   string
		limits map[string]any
		want   []string
	}{
		{"same as declared: nothing pinned", map[string]any{"max-length": int64(1000), "delivery-limit": int64(5), "overflow": "reject-publish"}, nil},
		{"lowered: the policy wins", map[string]any{"max-length": int64(10), "delivery-limit": int64(2), "overflow": "reject-publish"}, nil},
		{"raised: the argument pins it", map[string]any{"max-length": int64(2000), "delivery-limit": int64(5)},
			[]string{"x-max-length=1000 (the spec asks for 2000)"}},
		{"removed: the argument stays", map[string]any{"overflow": "drop-head"},
			[]string{"x-delivery-limit=5 (the spec sets none)", "x-max-length=1000 (the spec sets none)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range PinnedLimits(legacy, tc.limits) {
				got = append(got, p.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("pinned = %q, want %q", got, tc.want)
			}
		})
	}
	if got := PinnedLimits(map[string]any{"x-single-active-consumer": true}, map[string]any{"max-length": int64(1)}); len(got) != 0 {
		t.Errorf("a queue without limit arguments pins %v", got)
	}
	if got := LimitArguments(legacy); !slices.Equal(got, []string{"x-delivery-limit", "x-max-length", "x-overflow"}) {
		t.Errorf("LimitArguments = %v", got)
	}
}

// Shared objects live in the home namespace and reach the broker through
// the home's copy of the connection Secret, or the cluster by name.
func TestSharedReferenceAndSecret(t *testing.T) {
	c := sampleCallee()
	b := sampleBroker(t, c.Spec.Broker)
	ref := SharedReference("hcp-system", "tenant-a", b)
	if ref.ConnectionSecret == nil || ref.ConnectionSecret.Name != "hcp-broker-"+b.Key() || ref.Namespace != "" || ref.Name != "" {
		t.Errorf("connection-Secret broker: shared reference %+v", ref)
	}
	src := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "rmq"}, Data: map[string][]byte{
		"uri": []byte("http://rmq:15672"), "username": []byte("admin"), "password": []byte("pw"), "amqpURL": []byte("amqp://rmq:5672"), "other": []byte("x"),
	}}
	s := SharedConnectionSecret("hcp-system", b.Key(), src)
	if s.Namespace != "hcp-system" || s.Name != "hcp-broker-"+b.Key() || s.Labels[LabelTopologyOperator] != "true" || s.Labels[hcpv1alpha1.LabelVhostKey] != b.Key() ||
		s.Annotations[AnnotationCopiedFrom] != "tenant-a/rmq" || len(s.OwnerReferences) != 0 {
		t.Errorf("shared Secret metadata %+v", s.ObjectMeta)
	}
	if got := slices.Sorted(maps.Keys(s.Data)); !slices.Equal(got, []string{"password", "uri", "username"}) {
		t.Errorf("shared Secret keys %v, want exactly what the topology operator reads", got)
	}

	cl := BrokerFromCluster(topologyv1beta1.RabbitmqClusterReference{Name: "rabbit"}, c.Spec.Broker, "tenant-a")
	if ref := SharedReference("hcp-system", "tenant-a", cl); ref.Name != "rabbit" || ref.Namespace != "tenant-a" || ref.ConnectionSecret != nil {
		t.Errorf("cluster in the tenant's namespace: %+v", ref)
	}
	cl = BrokerFromCluster(topologyv1beta1.RabbitmqClusterReference{Name: "rabbit", Namespace: "hcp-system"}, c.Spec.Broker, "tenant-a")
	if ref := SharedReference("hcp-system", "tenant-a", cl); ref.Name != "rabbit" || ref.Namespace != "" {
		t.Errorf("cluster in the home namespace: %+v", ref)
	}
	x, _ := Exchanges("hcp-system", b, ref)
	if x.Namespace != "hcp-system" || len(x.OwnerReferences) != 0 || !reflect.DeepEqual(x.Spec.RabbitmqClusterReference, ref) {
		t.Errorf("shared exchange %+v", x)
	}
}

func TestBindingsAndPermissions(t *testing.T) {
	callee, caller := sampleCallee(), sampleCaller()
	b := sampleBroker(t, callee.Spec.Broker)
	cb, rb := Binding(ForCallee(callee), b), Binding(ForCaller(caller), b)
	if cb.Spec.Source != "hcp.commands" || cb.Spec.RoutingKey != "lab-cvd" || cb.Spec.Destination != "hcp.cmd.lab-cvd" || cb.Spec.DestinationType != "queue" {
		t.Errorf("callee binding %+v", cb.Spec)
	}
	if rb.Spec.Source != "hcp.events" || rb.Spec.RoutingKey != "alpha.#" || rb.Spec.Destination != "hcp.evt.alpha" {
		t.Errorf("caller binding %+v", rb.Spec)
	}
	// DESIGN section 3, literally.
	if p := Permission(ForCallee(callee), b).Spec; p.User != "callee.lab-cvd@/hcp" || p.Vhost != "/hcp" ||
		p.Permissions != (topologyv1beta1.VhostPermissions{Configure: `^$`, Write: `^hcp\.events$`, Read: `^hcp\.cmd\.lab-cvd$`}) {
		t.Errorf("callee permission %+v", p)
	}
	if p := Permission(ForCaller(caller), b).Spec; p.User != "caller.alpha@/hcp" ||
		p.Permissions != (topologyv1beta1.VhostPermissions{Configure: `^$`, Write: `^hcp\.commands$`, Read: `^hcp\.evt\.alpha$`}) {
		t.Errorf("caller permission %+v", p)
	}
	if u := User(ForCallee(callee), b).Spec; u.ImportCredentialsSecret == nil || u.ImportCredentialsSecret.Name != "hcp-callee-lab-cvd-credentials" || len(u.Tags) != 0 {
		t.Errorf("user %+v", u)
	}
}

func TestOwnership(t *testing.T) {
	c := sampleCallee()
	b := sampleBroker(t, c.Spec.Broker)
	s := ForCallee(c)
	creds, _ := CredentialsSecret(s, b, "x")
	owned := []metav1.Object{CalleeQueue(c, b), Binding(s, b), User(s, b), Permission(s, b), creds,
		ServiceAccount(s), CalleeRoleBinding(s, DefaultCalleeSidecarClusterRole),
		Deployment(HarnessParams{Subject: s, Harness: c.Spec.Harness})}
	for _, o := range owned {
		refs := o.GetOwnerReferences()
		if len(refs) != 1 || refs[0].Kind != "Callee" || refs[0].Name != "lab-cvd" || refs[0].UID != "uid-callee" ||
			refs[0].Controller == nil || !*refs[0].Controller || refs[0].APIVersion != "hcp.io/v1alpha1" {
			t.Errorf("%s: owner references %+v", o.GetName(), refs)
		}
		if o.GetLabels()[hcpv1alpha1.LabelCallee] != "lab-cvd" || o.GetLabels()[hcpv1alpha1.LabelManagedBy] != "hcp-operator" {
			t.Errorf("%s: labels %v", o.GetName(), o.GetLabels())
		}
	}
	// Shared objects have no owner: the topology operator deletes the
	// broker's exchange with the object, and others may still use it.
	cmd, evt := Exchanges("labs", b, b.Reference)
	for _, o := range []metav1.Object{cmd, evt, Vhost("labs", b, b.Reference, "retain")} {
		if len(o.GetOwnerReferences()) != 0 || o.GetLabels()[hcpv1alpha1.LabelVhostKey] != b.Key() {
			t.Errorf("%s: owners %v labels %v", o.GetName(), o.GetOwnerReferences(), o.GetLabels())
		}
	}
	if cmd.Spec.Name != "hcp.commands" || cmd.Spec.Type != "direct" || !cmd.Spec.Durable ||
		evt.Spec.Name != "hcp.events" || evt.Spec.Type != "topic" || !evt.Spec.Durable {
		t.Errorf("exchanges %+v %+v", cmd.Spec, evt.Spec)
	}
}

func TestBrokerResolution(t *testing.T) {
	spec := hcpv1alpha1.BrokerSpec{Vhost: "/hcp"}
	ref := topologyv1beta1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: "rmq"}}
	mk := func(data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "rmq", Namespace: "ns"}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	base := map[string]string{"username": "u", "password": "p"}
	with := func(kv ...string) map[string]string {
		m := maps.Clone(base)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name, wantAMQP, wantIdentity, wantErr string
		data                                  map[string]string
		wantNodes                             []string
	}{
		{name: "a cluster's nodes", data: with("uri", "http://mgmt:15672", "amqpURL", "amqp://r1:5701, amqp://r2:5702,amqp://R3"), wantAMQP: "amqp://r1:5701", wantIdentity: "mgmt:15672", wantNodes: []string{"r1:5701", "r2:5702", "r3:5672"}},
		{name: "a cluster's nodes, two schemes", data: with("uri", "http://mgmt:15672", "amqpURL", "amqp://r1:5701,amqps://r2:5702"), wantErr: "one scheme"},
		{name: "a cluster's nodes, a blank one", data: with("uri", "http://mgmt:15672", "amqpURL", "amqp://r1:5701,,amqp://r2"), wantErr: "comma-separated"},
		{name: "http management: amqp 5672", data: with("uri", "http://rabbit.ns.svc:15672"), wantAMQP: "amqp://rabbit.ns.svc:5672", wantIdentity: "rabbit.ns.svc:15672"},
		{name: "https management: amqps 5671", data: with("uri", "https://Rabbit.example.com"), wantAMQP: "amqps://Rabbit.example.com:5671", wantIdentity: "rabbit.example.com:443"},
		{name: "bare host", data: with("uri", "127.0.0.1:15672"), wantAMQP: "amqp://127.0.0.1:5672", wantIdentity: "127.0.0.1:15672"},
		{name: "explicit amqpURL", data: with("uri", "http://mgmt:15672", "amqpURL", "amqps://u:p@broker.example.com/ignored"), wantAMQP: "amqps://broker.example.com:5671", wantIdentity: "mgmt:15672"},
		{name: "explicit amqpURL with port", data: with("uri", "http://mgmt:15672", "amqpURL", "amqp://broker:25672"), wantAMQP: "amqp://broker:25672", wantIdentity: "mgmt:15672"},
		{name: "bad amqpURL", data: with("uri", "http://mgmt:15672", "amqpURL", "http://broker"), wantErr: "amqpURL"},
		{name: "missing keys", data: map[string]string{"uri": "http://x"}, wantErr: "lacks key(s) username, password"},
		{name: "bad scheme", data: with("uri", "ftp://x"), wantErr: "scheme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := BrokerFromConnectionSecret(ref, spec, mk(tc.data))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.AMQPURL != tc.wantAMQP || b.Identity != tc.wantIdentity || b.VhostDeletionPolicy != "retain" || !slices.Equal(b.AMQPAddresses, tc.wantNodes) {
				t.Errorf("got %+v", b)
			}
		})
	}

	cl := BrokerFromCluster(topologyv1beta1.RabbitmqClusterReference{Name: "rmq"}, spec, "team")
	if cl.AMQPURL != "amqp://rmq.team.svc:5672" || cl.Identity != "rabbitmqcluster:team/rmq" {
		t.Errorf("cluster broker %+v", cl)
	}

	// Two namespaces' Secrets reaching the same broker agree on the key;
	// another vhost or broker does not.
	a, _ := BrokerFromConnectionSecret(ref, spec, mk(with("uri", "http://RABBIT:15672")))
	b2, _ := BrokerFromConnectionSecret(ref, spec, mk(with("uri", "http://rabbit:15672/")))
	c, _ := BrokerFromConnectionSecret(ref, hcpv1alpha1.BrokerSpec{Vhost: "/other"}, mk(with("uri", "http://rabbit:15672")))
	if a.Key() != b2.Key() || a.Key() == c.Key() || a.Key() == cl.Key() || len(a.Key()) != 10 {
		t.Errorf("keys %s %s %s %s", a.Key(), b2.Key(), c.Key(), cl.Key())
	}
}

func TestReferenceAndDefault(t *testing.T) {
	if _, err := Reference(hcpv1alpha1.BrokerSpec{}, nil); err != ErrNoBroker {
		t.Errorf("no broker: %v", err)
	}
	def, err := ParseDefaultBroker("hcp-system/rmq")
	if err != nil || def.Namespace != "hcp-system" || def.Name != "rmq" {
		t.Fatalf("%+v %v", def, err)
	}
	r, _ := Reference(hcpv1alpha1.BrokerSpec{}, def)
	if r.Namespace != "hcp-system" || r.ConnectionSecret == nil || r.ConnectionSecret.Name != "rmq" || r.Name != "" {
		t.Errorf("default reference %+v", r)
	}
	if def, _ := ParseDefaultBroker("rmq"); def.Namespace != "" || def.Name != "rmq" {
		t.Errorf("bare name %+v", def)
	}
	for _, bad := range []string{"/x", "a/", "a/b/c"} {
		if _, err := ParseDefaultBroker(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	r, _ = Reference(hcpv1alpha1.BrokerSpec{RabbitmqClusterReference: &hcpv1alpha1.RabbitmqClusterReference{Name: "c", Namespace: "n"}}, def)
	if r.Name != "c" || r.Namespace != "n" || r.ConnectionSecret != nil {
		t.Errorf("explicit reference %+v", r)
	}
}

func TestCredentialsSecretURI(t *testing.T) {
	c := sampleCallee()
	b := sampleBroker(t, c.Spec.Broker)
	sec, err := CredentialsSecret(ForCallee(c), b, "p@ss/word")
	if err != nil {
		t.Fatal(err)
	}
	if sec.Labels["rabbitmq.com/topology-operator"] != "true" {
		t.Error("credentials Secret lacks the topology operator label")
	}
	uri := string(sec.Data["uri"])
	// amqp091-go must read back exactly the credentials and vhost.
	parsed, err := amqp.ParseURI(uri)
	if err != nil {
		t.Fatal(err)
	}
	if parsed.Username != "callee.lab-cvd@/hcp" || parsed.Password != "p@ss/word" || parsed.Vhost != "/hcp" || parsed.Port != 5672 {
		t.Errorf("%s parsed as %+v", uri, parsed)
	}
	if _, err := url.Parse(uri); err != nil {
		t.Error(err)
	}
	if string(sec.Data["username"]) != "callee.lab-cvd@/hcp" || string(sec.Data["vhost"]) != "/hcp" || string(sec.Data["password"]) != "p@ss/word" {
		t.Errorf("data %q", sec.Data)
	}
}

// resolveEnv plays the kubelet: it resolves the sidecar's env against the
// Secrets and the downward API, then feeds it to the sidecar's own parser.
func resolveEnv(t *testing.T, c corev1.Container, secrets map[string]map[string][]byte) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secrets[ref.Name][ref.Key]
			if !ok {
				t.Fatalf("env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
			}
			env[e.Name] = string(v)
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = "from:" + e.ValueFrom.FieldRef.FieldPath
		}
	}
	return env
}

func TestSidecarEnvMatchesContract(t *testing.T) {
	c := sampleCallee()
	b := sampleBroker(t, c.Spec.Broker)
	s := ForCallee(c)
	creds, _ := CredentialsSecret(s, b, "pw")
	tok := WithTokenKeys(creds, TokenKeys{PrivatePEM: []byte("-----BEGIN PRIVATE KEY-----"), PublicPEM: []byte("pub"), VerifyPEM: []byte("pub")})
	nodes := []string{"r1:5701", "r2:5702"}
	dep := Deployment(HarnessParams{Subject: s, Harness: c.Spec.Harness, Sidecar: c.Spec.Sidecar, Vhost: b.Vhost, Prefetch: 7, Addresses: nodes})
	var side *corev1.Container
	for i := range dep.Spec.Template.Spec.InitContainers {
		if dep.Spec.Template.Spec.InitContainers[i].Name == SidecarContainerName {
			side = &dep.Spec.Template.Spec.InitContainers[i]
		}
	}
	if side == nil {
		t.Fatal("no hcp-sidecar init container")
	}
	env := resolveEnv(t, *side, map[string]map[string][]byte{creds.Name: creds.Data, tok.Name: tok.Data})
	cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("the sidecar would refuse this env: %v", err)
	}
	if cfg.Mode != config.ModeCallee || cfg.ID != "lab-cvd" || cfg.Vhost != "/hcp" || cfg.Username != "callee.lab-cvd@/hcp" ||
		cfg.HarnessURL != "http://127.0.0.1:8080" || cfg.Prefetch != 7 || cfg.Namespace != "from:metadata.namespace" ||
		cfg.PodName != "from:metadata.name" || cfg.APIAddr != "127.0.0.1:9090" || cfg.StateDir != "/var/lib/hcp" ||
		cfg.TokenKeyFile != "/etc/hcp/token/private.pem" || cfg.TokenVerifyKeysFile != "/etc/hcp/token/verification-keys.pem" ||
		cfg.AMQPURLFile != "/etc/hcp/credentials/uri" || cfg.TokenKeyPEM != "" || cfg.AMQPURL != "" || !slices.Equal(cfg.AMQPAddresses, nodes) {
		t.Errorf("config %+v", cfg)
	}
	// No secret in the environment (/proc/PID/environ): the only Secret
	// reference left is the username.
	for _, e := range side.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Key != CredentialsUsernameKey {
			t.Errorf("env %s comes from Secret key %s", e.Name, e.ValueFrom.SecretKeyRef.Key)
		}
	}
	for k, v := range env {
		if strings.Contains(v, "pw") || strings.Contains(v, "PRIVATE KEY") {
			t.Errorf("env %s holds a secret: %q", k, v)
		}
	}

	// Caller mode: no token key.
	cr := sampleCaller()
	cs := ForCaller(cr)
	ccreds, _ := CredentialsSecret(cs, b, "pw")
	cside := SidecarContainer(HarnessParams{Subject: cs, Harness: *cr.Spec.Harness, Vhost: "/hcp", Prefetch: 10, AppMaxBatch: 64, AppStream: true, AppMaxAttempts: 7})
	cenv := resolveEnv(t, cside, map[string]map[string][]byte{ccreds.Name: ccreds.Data})
	ccfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := cenv[k]; return v, ok })
	if err != nil {
		t.Fatalf("caller env: %v", err)
	}
	if ccfg.Mode != config.ModeCaller || ccfg.HarnessURL != "http://127.0.0.1:3000" || ccfg.TokenKeyPEM != "" || ccfg.TokenKeyFile != "" ||
		ccfg.AMQPURLFile != "/etc/hcp/credentials/uri" || ccfg.AppMaxBatch != 64 || !ccfg.AppStream || ccfg.AppMaxAttempts != 7 {
		t.Errorf("caller config %+v", ccfg)
	}
	if !reflect.DeepEqual(cside.Args, []string{"--mode=caller"}) {
		t.Errorf("args %v", cside.Args)
	}
}

func TestSidecarRestrictedSecurity(t *testing.T) {
	c := SidecarContainer(HarnessParams{Subject: ForCallee(sampleCallee())})
	sc := c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
		!reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || sc.Privileged != nil {
		t.Errorf("security context %+v", sc)
	}
	if c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Port.StrVal != "probes" {
		t.Errorf("probes %+v %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	if c.Image != DefaultSidecarImage {
		t.Errorf("image %s", c.Image)
	}
	if got := c.Resources.Requests.Cpu().String(); got != "50m" {
		t.Errorf("cpu request %s", got)
	}
}

func TestDeploymentInjection(t *testing.T) {
	cr := sampleCaller()
	s := ForCaller(cr)
	cr.Spec.Harness.Template.Spec.Volumes = []corev1.Volume{{Name: StateVolumeName}, {Name: "data"}}
	d := Deployment(HarnessParams{Subject: s, Harness: *cr.Spec.Harness, Sidecar: hcpv1alpha1.SidecarSpec{Image: "mine:1"}, Image: "mgr:1"})
	ps := d.Spec.Template.Spec
	names := make([]string, 0, len(ps.InitContainers)+len(ps.Containers))
	for _, c := range append(slices.Clone(ps.InitContainers), ps.Containers...) {
		names = append(names, c.Name+"="+c.Image)
	}
	if !reflect.DeepEqual(names, []string{"hcp-sidecar=mine:1", "app=example.com/agent:1"}) {
		t.Errorf("init containers, then containers: %v (a user container named hcp-sidecar must be replaced; spec.sidecar.image wins)", names)
	}
	if len(ps.Volumes) != 4 || ps.Volumes[0].Name != "data" || ps.Volumes[1].Name != StateVolumeName || ps.Volumes[1].EmptyDir == nil || ps.Volumes[2].Name != APIAccessVolumeName ||
		ps.Volumes[3].Name != CredentialsVolumeName || ps.Volumes[3].Secret == nil || ps.Volumes[3].Secret.SecretName != "hcp-caller-alpha-credentials" {
		t.Errorf("volumes %+v", ps.Volumes)
	}
	if ps.ServiceAccountName != "hcp-caller-alpha" || *d.Spec.Replicas != 1 {
		t.Errorf("sa %s replicas %d", ps.ServiceAccountName, *d.Spec.Replicas)
	}
	sel := d.Spec.Selector.MatchLabels
	for k, v := range sel {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("selector %v does not match template labels %v", sel, d.Spec.Template.Labels)
		}
	}
	// The input must not be modified.
	if len(cr.Spec.Harness.Template.Spec.Containers) != 2 || cr.Spec.Harness.Template.Annotations != nil {
		t.Error("Deployment modified its input")
	}
}

func TestConfigHash(t *testing.T) {
	c := sampleCallee()
	s := ForCallee(c)
	p := HarnessParams{Subject: s, Harness: c.Spec.Harness, Sidecar: c.Spec.Sidecar, Vhost: "/hcp", Prefetch: 4, SecretsHash: "a"}
	hashes := func(p HarnessParams) (string, string) {
		a := Deployment(p).Spec.Template.Annotations
		return a[hcpv1alpha1.AnnotationConfigHash], a[AnnotationSidecarHash]
	}
	c0, s0 := hashes(p)
	if c0 == "" || s0 == "" {
		t.Fatal("hash empty")
	}
	if c, s := hashes(p); c != c0 || s != s0 {
		t.Fatal("hash unstable")
	}
	// Which hash each change moves: only sidecar-only changes may be held
	// back by updatePolicy OnDrain.
	changes := map[string]struct {
		mutate          func(*HarnessParams)
		config, sidecar bool
	}{
		"secret content": {func(p *HarnessParams) { p.SecretsHash = "b" }, true, false},
		"prefetch":       {func(p *HarnessParams) { p.Prefetch = 5 }, false, true},
		"image":          {func(p *HarnessParams) { p.Image = "other:1" }, false, true},
		"log level":      {func(p *HarnessParams) { p.Sidecar.LogLevel = "debug" }, false, true},
		"harness image": {func(p *HarnessParams) {
			p.Harness = *p.Harness.DeepCopy()
			p.Harness.Template.Spec.Containers[0].Image = "example.com/cvd:2"
		}, true, false},
		// The harness URL is in the sidecar's env.
		"harness port": {func(p *HarnessParams) { p.Harness.Port = 9000 }, false, true},
		// A volume and the sidecar's mount of it.
		"tls": {func(p *HarnessParams) { p.TLS = &hcpv1alpha1.BrokerTLS{CASecret: "ca"} }, true, true},
		// The update policy says when a change rolls, it is none.
		"update policy": {func(p *HarnessParams) { p.Sidecar.UpdatePolicy = hcpv1alpha1.SidecarUpdateOnDrain }, false, false},
		"replicas":      {func(p *HarnessParams) { p.Harness.Replicas = new(int32(7)) }, false, false},
	}
	for name, ch := range changes {
		q := p
		ch.mutate(&q)
		c, s := hashes(q)
		if (c != c0) != ch.config || (s != s0) != ch.sidecar {
			t.Errorf("%s: config hash changed %v (want %v), sidecar hash changed %v (want %v)", name, c != c0, ch.config, s != s0, ch.sidecar)
		}
	}
}

func TestNames(t *testing.T) {
	long := strings.Repeat("a", 250)
	s := Subject{Role: topology.RoleCallee, Name: long, Namespace: "n", ID: "x"}
	for _, n := range []string{s.BaseName(), s.CredentialsSecretName(), s.LegacyTokenSecretName()} {
		if len(n) > 200 || len(validation.IsDNS1123Subdomain(n)) != 0 {
			t.Errorf("bad name %q (%d)", n, len(n))
		}
	}
	if v := LabelValue(long); len(v) > 63 || len(validation.IsValidLabelValue(v)) != 0 {
		t.Errorf("bad label value %q", v)
	}
	if s.CredentialsSecretName() == s.LegacyTokenSecretName() {
		t.Error("secret names collide")
	}
	callee := Subject{Role: topology.RoleCallee, Name: "x"}
	caller := Subject{Role: topology.RoleCaller, Name: "x"}
	if callee.BaseName() == caller.BaseName() {
		t.Error("a Callee and a Caller of one name collide")
	}
}
