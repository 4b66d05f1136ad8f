package callee

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/samplecallee"
	"github.com/hcp-io/hcp-operator/internal/sidecar/cachetrim"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/events"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// One API server for the package: starting envtest takes seconds.
var (
	envOnce   sync.Once
	sharedEnv *testbed.Env
	envErr    error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedEnv != nil {
		_ = sharedEnv.Stop()
	}
	os.Exit(code)
}

func apiServer(t *testing.T) *testbed.Env {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test (envtest + RabbitMQ); -short skips it")
	}
	envOnce.Do(func() {
		sharedEnv, envErr = testbed.Start(context.Background(), testbed.Options{
			WithoutTopologyCRDs: true,
			AddToScheme:         []func(*runtime.Scheme) error{v1alpha1.AddToScheme},
		})
	})
	if envErr != nil {
		t.Fatal(envErr)
	}
	return sharedEnv
}

const (
	calleeID = "lab"
	callerID = "alpha"
	password = "s3cret-pw"
)

// bed is one callee sidecar with its harness against the real broker (a
// vhost of its own, real users with the spec permissions) and the shared
// API server (a namespace of its own), plus a caller speaking raw AMQP.
type bed struct {
	t       *testing.T
	env     *testbed.Env
	broker  *testbed.Broker
	ns      string
	vhost   string
	pod     string
	key     ed25519.PrivateKey
	keyDir  string
	wrap    func(client.Client) client.Client
	callee  *v1alpha1.Callee
	calleeU string
	callerU string

	// stateDirs, when set, gives each pod a state directory (its
	// write-ahead log), kept across restarts in the same pod.
	stateDirs map[string]string

	// the first replica's sidecar
	first   *replica
	sc      *Sidecar
	harness *samplecallee.Harness
	metrics *metrics.Metrics
	stopSC  func()
	// timeouts of the sidecars
	timeouts Timeouts

	callerCh *amqp.Channel

	mu   sync.Mutex
	msgs []received
}

type received struct {
	env *envelope.Envelope
	d   amqp.Delivery
}

type bedOptions struct {
	capabilities []v1alpha1.Capability
	policies     []v1alpha1.PolicyRule
	sessions     v1alpha1.SessionsSpec
	timeouts     Timeouts
	noStart      bool
	// commandQueue is the Callee's spec.commandQueue; its limits are the
	// command queue's arguments.
	commandQueue v1alpha1.CommandQueueSpec
	// wrapClient, when set, wraps each replica's Kubernetes client (faults).
	wrapClient func(client.Client) client.Client
	// keyDir, when set, is a mounted token Secret (testbed.WriteSecretVolume):
	// the sidecars read their keys from its files, as in a pod.
	keyDir string
	// deadLetterQueue, when set, is declared and made the command queue's
	// dead-letter target (default exchange, routing key the queue's name).
	deadLetterQueue string
	// stateDirs gives each replica a state directory per pod (the
	// sidecar's write-ahead log on disk, as in a pod's emptyDir).
	stateDirs bool
}

func defaultCapabilities() []v1alpha1.Capability {
	return []v1alpha1.Capability{
		{Name: "analyze", RiskLevel: v1alpha1.RiskR1, DataClassification: v1alpha1.DataT2, MaxDuration: "PT1H"},
		{Name: "synthesize", RiskLevel: v1alpha1.RiskR3, DataClassification: v1alpha1.DataT3},
		{Name: "restricted", RiskLevel: v1alpha1.RiskR1, DataClassification: v1alpha1.DataT1},
	}
}

func defaultRules() []v1alpha1.PolicyRule {
	return []v1alpha1.PolicyRule{{
		Name:         "alpha-lab",
		Callers:      v1alpha1.CallerMatch{IDs: []string{callerID}},
		Capabilities: []string{"analyze", "synthesize"},
		MaxRiskLevel: v1alpha1.RiskR4,
	}}
}

func newBed(t *testing.T, o bedOptions) *bed {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test (envtest + RabbitMQ); -short skips it")
	}
	broker := testbed.EnsureRabbitMQ(t)
	e := apiServer(t)
	ctx := t.Context()
	b := &bed{t: t, env: e, broker: broker, pod: "callee-pod-0"}
	b.ns = e.CreateNamespace(t, "callee-")
	b.vhost = testbed.RandomName("hcp-callee-test-")
	b.calleeU = topology.Username(topology.RoleCallee, b.vhost, calleeID)
	b.callerU = topology.Username(topology.RoleCaller, b.vhost, callerID)

	// Broker: vhost, users with the spec permissions, topology declared by
	// an administrator (the operator's job).
	must(t, broker.CreateVhost(b.vhost))
	broker.CleanupVhost(t, b.vhost)
	must(t, testbed.Answered(broker.API.UpdatePermissionsIn(b.vhost, broker.Username, rabbithole.Permissions{Configure: ".*", Write: ".*", Read: ".*"})))
	for _, u := range []struct {
		name string
		p    topology.Permissions
	}{{b.calleeU, topology.CalleePermissions(calleeID)}, {b.callerU, topology.CallerPermissions(callerID)}} {
		must(t, testbed.Answered(broker.API.PutUser(u.name, rabbithole.UserSettings{Password: password, Tags: rabbithole.UserTags{}})))
		must(t, testbed.Answered(broker.API.UpdatePermissionsIn(b.vhost, u.name, rabbithole.Permissions{Configure: u.p.Configure, Write: u.p.Write, Read: u.p.Read})))
	}
	t.Cleanup(func() { _ = broker.DeleteUsers(b.calleeU, b.callerU) })
	b.declareTopology(o.commandQueue, o.deadLetterQueue)

	// Kubernetes: Callee, Caller, CapabilityPolicy.
	if o.capabilities == nil {
		o.capabilities = defaultCapabilities()
	}
	if o.policies == nil {
		o.policies = defaultRules()
	}
	b.callee = &v1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Name: calleeID, Namespace: b.ns, Labels: map[string]string{"tier": "lab"}},
		Spec: v1alpha1.CalleeSpec{
			Capabilities: o.capabilities,
			Harness: v1alpha1.HarnessSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "harness", Image: "example.com/harness:1"}},
			}}},
			Sessions:     o.sessions,
			CommandQueue: o.commandQueue,
		},
	}
	must(t, e.Client.Create(ctx, b.callee))
	must(t, e.Client.Create(ctx, &v1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Name: callerID, Namespace: b.ns, Labels: map[string]string{"team": "a"}}}))
	must(t, e.Client.Create(ctx, &v1alpha1.CapabilityPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "lab-policy", Namespace: b.ns},
		Spec:       v1alpha1.CapabilityPolicySpec{Rules: o.policies},
	}))

	_, b.key, _ = token.GenerateKey()
	b.keyDir, b.wrap = o.keyDir, o.wrapClient
	b.startCaller()
	testbed.DumpOnFailure(t, testbed.Dump{Client: e.Client, Namespace: b.ns, Lists: []client.ObjectList{&v1alpha1.HCPSessionList{}}, Broker: broker, Vhosts: []string{b.vhost}})
	b.timeouts = o.timeouts
	if o.stateDirs {
		b.stateDirs = map[string]string{}
	}
	if !o.noStart {
		b.start()
	}
	return b
}

func (b *bed) declareTopology(q v1alpha1.CommandQueueSpec, dlq string) {
	t := b.t
	conn, err := amqp.Dial(b.broker.AMQPURI(b.broker.Username, b.broker.Password, b.vhost))
	must(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	must(t, err)
	must(t, ch.ExchangeDeclare(topology.CommandsExchange, "direct", true, false, false, false, nil))
	must(t, ch.ExchangeDeclare(topology.EventsExchange, "topic", true, false, false, false, nil))
	args := amqp.Table{"x-queue-type": "quorum"}
	for k, v := range resource.CalleeQueueArguments(q) {
		args[k] = v
	}
	if dlq != "" {
		_, err = ch.QueueDeclare(dlq, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		must(t, err)
		args["x-dead-letter-exchange"], args["x-dead-letter-routing-key"] = "", dlq
	}
	_, err = ch.QueueDeclare(topology.CommandQueue(calleeID), true, false, false, false, args)
	must(t, err)
	_, err = ch.QueueDeclare(topology.EventQueue(callerID), true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-message-ttl": int64(86400000), "x-max-length": int64(100000), "x-overflow": "drop-head",
	})
	must(t, err)
	must(t, ch.QueueBind(topology.CommandQueue(calleeID), topology.CommandRoutingKey(calleeID), topology.CommandsExchange, false, nil))
	must(t, ch.QueueBind(topology.EventQueue(callerID), topology.EventBindingKey(callerID), topology.EventsExchange, false, nil))
}

// replica is one callee pod: a sidecar and its sample harness.
type replica struct {
	pod        string
	harnessSrv *httptest.Server
	sc         *Sidecar
	harness    *samplecallee.Harness
	metrics    *metrics.Metrics
	stop       func()
}

// start runs the first replica's sidecar (and a fresh sample harness).
func (b *bed) start() {
	r := b.startReplica(b.pod)
	b.first = r
	b.sc, b.harness, b.metrics, b.stopSC = r.sc, r.harness, r.metrics, r.stop
}

// harnessLogger logs to t until the test's cleanup reaches it, then
// drops: an in-process harness may still run a task after its test (it
// retries a stopped sidecar for minutes), and a t.Log then panics.
func harnessLogger(t *testing.T) logr.Logger {
	var mu sync.RWMutex
	done := false
	t.Cleanup(func() { mu.Lock(); done = true; mu.Unlock() })
	return funcr.New(func(prefix, args string) {
		mu.RLock()
		defer mu.RUnlock()
		if !done {
			t.Log(prefix, args)
		}
	}, funcr.Options{Verbosity: 1})
}

// stateDir is pod's state directory (created on first use).
func (b *bed) stateDir(pod string) string {
	if b.stateDirs[pod] == "" {
		b.stateDirs[pod] = b.t.TempDir()
	}
	return b.stateDirs[pod]
}

// startReplica runs a callee sidecar (and a fresh sample harness)
// in-process as pod.
func (b *bed) startReplica(pod string) *replica {
	t := b.t
	to := b.timeouts
	r := &replica{pod: pod}
	log := testr.NewWithOptions(t, testr.Options{Verbosity: 1}).WithValues("pod", pod)
	ctx, cancel := context.WithCancel(context.Background())
	cleanups := make([]func(), 0, 8)
	stop := func() {
		cancel()
		for _, f := range slices.Backward(cleanups) {
			f()
		}
	}

	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	r.harness = samplecallee.New("http://"+apiLn.Addr().String(), harnessLogger(t).WithValues("pod", pod).WithName("harness"))
	hsrv := httptest.NewServer(r.harness.Handler())
	r.harnessSrv = hsrv
	cleanups = append(cleanups, hsrv.Close)

	objCache, err := cache.New(b.env.Config, cache.Options{
		Scheme:            b.env.Scheme,
		DefaultNamespaces: map[string]cache.Config{b.ns: {}},
		DefaultTransform:  cachetrim.Transform, // as internal/sidecar/runner
		ByObject: map[client.Object]cache.ByObject{
			&v1alpha1.HCPSession{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.LabelCalleeID: calleeID})},
		},
	})
	must(t, err)
	cacheCtx, stopCache := context.WithCancel(context.Background())
	go func() { _ = objCache.Start(cacheCtx) }()
	cleanups = append(cleanups, stopCache)
	for _, o := range []client.Object{&v1alpha1.HCPSession{}, &v1alpha1.Callee{}, &v1alpha1.Caller{}, &v1alpha1.CapabilityPolicy{}} {
		_, err := objCache.GetInformer(ctx, o)
		must(t, err)
	}
	if !objCache.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	var kc client.Client
	kc, err = client.New(b.env.Config, client.Options{Scheme: b.env.Scheme, Cache: &client.CacheOptions{Reader: objCache}})
	must(t, err)
	if b.wrap != nil {
		kc = b.wrap(kc)
	}

	r.metrics = metrics.New(prometheus.NewRegistry())
	conn, err := transport.Dial(ctx, transport.Options{URL: b.broker.AMQPURI(b.calleeU, password, b.vhost), Logger: log.WithName("amqp"), Metrics: r.metrics, ConnectionName: "callee-test " + pod})
	must(t, err)
	cleanups = append(cleanups, func() {
		cctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		_ = conn.Close(cctx)
	})
	pub, err := transport.NewPublisher(conn, transport.PublisherOptions{})
	must(t, err)

	sw := status.New(status.Options{Client: kc, Namespace: b.ns, Metrics: r.metrics, Log: log.WithName("status")})
	swCtx, stopSW := context.WithCancel(context.Background())
	swDone := make(chan struct{})
	go func() { _ = sw.Run(swCtx); close(swDone) }()
	cleanups = append(cleanups, func() { stopSW(); <-swDone })

	cfg := &config.Config{
		Mode: config.ModeCallee, ID: calleeID, ObjectName: calleeID, Namespace: b.ns, PodName: pod,
		Vhost: b.vhost, Username: b.calleeU, HarnessURL: hsrv.URL, APIAddr: apiLn.Addr().String(), Prefetch: 10,
	}
	if b.stateDirs != nil {
		cfg.StateDir = b.stateDir(pod)
	}
	if to.ShutdownDrain == 0 {
		to.ShutdownDrain = 2 * time.Second
	}
	if to.LostOwnerGrace == 0 {
		to.LostOwnerGrace = 300 * time.Millisecond
	}
	if to.PendingWait == 0 {
		to.PendingWait = 5 * time.Second
	}
	signingKey := b.key
	if b.keyDir != "" {
		signingKey = nil
		cfg.TokenKeyFile = filepath.Join(b.keyDir, resource.TokenPrivateKeyKey)
		cfg.TokenVerifyKeysFile = filepath.Join(b.keyDir, resource.TokenVerifyKeysKey)
	}
	rec, stopEvents, err := events.NewRecorder(b.env.Config, b.env.Scheme, b.ns, cfg.PodName)
	must(t, err)
	t.Cleanup(stopEvents)
	sc, err := New(Options{
		Config: cfg, Client: kc, Reader: b.env.Client, Cache: objCache, Conn: conn, Publisher: pub, Consumer: conn,
		Status: sw, Metrics: r.metrics, Log: log.WithName("callee"), SigningKey: signingKey, Timeouts: to, Recorder: rec,
	})
	must(t, err)
	apiCtx, stopAPI := context.WithCancel(context.Background())
	apiDone := make(chan struct{})
	go func() { _ = server.Serve(apiCtx, apiLn, sc.Handler(), log); close(apiDone) }()

	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	// Order of shutdown as in main: Run, then the API, the status writer, AMQP.
	cleanups = append(cleanups, func() { stopAPI(); <-apiDone })
	waitReady := time.Now().Add(20 * time.Second)
	for sc.Ready() != nil {
		select {
		case err := <-done:
			t.Fatalf("sidecar stopped: %v", err)
		default:
		}
		if time.Now().After(waitReady) {
			t.Fatalf("sidecar not ready: %v", sc.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.sc = sc
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("sidecar Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("sidecar did not stop within 30s")
			}
			stop()
		})
	}
	t.Cleanup(r.stop)
	return r
}

// startCaller connects as the caller user and collects every message of its
// event queue.
func (b *bed) startCaller() {
	t := b.t
	conn, err := amqp.Dial(b.broker.AMQPURI(b.callerU, password, b.vhost))
	must(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	pubCh, err := conn.Channel()
	must(t, err)
	b.callerCh = pubCh
	ch, err := conn.Channel()
	must(t, err)
	must(t, ch.Qos(100, 0, false))
	ds, err := ch.Consume(topology.EventQueue(callerID), "test-caller", false, false, false, false, nil)
	must(t, err)
	go func() {
		for d := range ds {
			env, err := envelope.FromDelivery(d, 0)
			if err != nil {
				t.Errorf("caller received an invalid message: %v", err)
			} else if d.UserId != b.calleeU {
				t.Errorf("event with user_id %q, want %q", d.UserId, b.calleeU)
			}
			_ = d.Ack(false)
			b.mu.Lock()
			b.msgs = append(b.msgs, received{env: env, d: d})
			b.mu.Unlock()
		}
	}()
}

func newSubmit(mut func(*task.TaskSubmit)) *task.TaskSubmit {
	ts := &task.TaskSubmit{
		CallerID: callerID, CalleeID: calleeID, Capability: "analyze", Intent: "analyze the sample",
		Inputs:      json.RawMessage(`{"steps":3,"step_ms":20}`),
		Constraints: task.Constraints{DataClassification: task.T1},
	}
	if mut != nil {
		mut(ts)
	}
	return ts
}

// submit publishes a task_submit as the caller; it returns the message id
// and the session id the callee derives from it.
func (b *bed) submit(ts *task.TaskSubmit) (msgID, sid string, pub amqp.Publishing) {
	b.t.Helper()
	env, err := envelope.New(envelope.TypeTaskSubmit, "", ts)
	must(b.t, err)
	pub, err = envelope.EncodePublishing(env, b.callerU)
	must(b.t, err)
	b.publish(pub)
	return env.MessageID, topology.SessionID(calleeID, callerID, env.MessageID), pub
}

func (b *bed) publish(pub amqp.Publishing) {
	b.t.Helper()
	must(b.t, b.callerCh.PublishWithContext(b.t.Context(), topology.CommandsExchange, calleeID, false, false, pub))
}

// messages returns what the caller received for a session, in arrival
// order.
func (b *bed) messages(sid string) []received {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []received
	for _, m := range b.msgs {
		if m.env != nil && m.env.Session() == sid {
			out = append(out, m)
		}
	}
	return out
}

// waitMessage waits for a message of the session matching pred.
func (b *bed) waitMessage(sid string, timeout time.Duration, what string, pred func(received) bool) received {
	b.t.Helper()
	var found received
	testbed.Eventually(b.t, timeout, what, func(context.Context) error {
		for _, m := range b.messages(sid) {
			if pred(m) {
				found = m
				return nil
			}
		}
		return fmt.Errorf("not yet; session has %s", summary(b.messages(sid)))
	})
	return found
}

func isType(t envelope.MessageType) func(received) bool {
	return func(m received) bool { return m.env.Type == t }
}

func isEvent(et session.EventType) func(received) bool {
	return func(m received) bool {
		if m.env.Type != envelope.TypeEvent {
			return false
		}
		return eventOf(m).EventType == et
	}
}

func eventOf(m received) session.EventPayload {
	var p session.EventPayload
	_ = json.Unmarshal(m.env.Payload, &p)
	return p
}

func summary(ms []received) string {
	var s []string
	for _, m := range ms {
		if m.env.Type == envelope.TypeEvent {
			p := eventOf(m)
			s = append(s, fmt.Sprintf("%d:%s", p.Sequence, p.EventType))
		} else {
			s = append(s, string(m.env.Type))
		}
	}
	return fmt.Sprint(s)
}

// events returns the session's events in arrival order.
func (b *bed) events(sid string) []session.EventPayload {
	var out []session.EventPayload
	for _, m := range b.messages(sid) {
		if m.env.Type == envelope.TypeEvent {
			out = append(out, eventOf(m))
		}
	}
	return out
}

// checkSequences asserts the events are numbered 1, 2, 3, ... in order.
func checkSequences(t *testing.T, evs []session.EventPayload) {
	t.Helper()
	for i, e := range evs {
		if e.Sequence != int64(i+1) {
			t.Fatalf("event %d (%s) has sequence %d, want %d; all: %v", i, e.EventType, e.Sequence, i+1, evs)
		}
	}
}

func (b *bed) hcpSession(sid string) *v1alpha1.HCPSession {
	b.t.Helper()
	var hs v1alpha1.HCPSession
	must(b.t, b.env.Client.Get(b.t.Context(), client.ObjectKey{Namespace: b.ns, Name: sid}, &hs))
	return &hs
}

// waitEvent waits for an Event on the Callee with reason whose message
// holds every one of parts.
func (b *bed) waitEvent(reason string, parts ...string) corev1.Event {
	b.t.Helper()
	return b.waitEventOn("Callee", calleeID, reason, parts...)
}

// waitEventOn waits for an Event on the object kind/name with reason whose
// message holds every one of parts.
func (b *bed) waitEventOn(kind, name, reason string, parts ...string) corev1.Event {
	b.t.Helper()
	var found corev1.Event
	testbed.Eventually(b.t, 10*time.Second, "Event "+reason+" "+strings.Join(parts, " "), func(ctx context.Context) error {
		var list corev1.EventList
		if err := b.env.Client.List(ctx, &list, client.InNamespace(b.ns)); err != nil {
			return err
		}
	next:
		for _, e := range list.Items {
			if e.Reason != reason || e.InvolvedObject.Kind != kind || e.InvolvedObject.Name != name {
				continue
			}
			for _, p := range parts {
				if !strings.Contains(e.Message, p) {
					continue next
				}
			}
			found = e
			return nil
		}
		return fmt.Errorf("%d events, none matches", len(list.Items))
	})
	return found
}

func (b *bed) waitState(sid string, want v1alpha1.SessionState, timeout time.Duration) *v1alpha1.HCPSession {
	b.t.Helper()
	var hs v1alpha1.HCPSession
	testbed.Eventually(b.t, timeout, "HCPSession "+sid+" "+string(want), func(ctx context.Context) error {
		if err := b.env.Client.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: sid}, &hs); err != nil {
			return err
		}
		if hs.Status.State != want {
			return fmt.Errorf("state %q (reason %q, message %q)", hs.Status.State, hs.Status.Reason, hs.Status.Message)
		}
		return nil
	})
	return &hs
}

func (b *bed) queueDepth(queue string) int {
	q, err := b.broker.Queue(b.vhost, queue)
	must(b.t, err)
	return q.Messages
}

func acceptedOf(t *testing.T, m received) task.TaskAccepted {
	t.Helper()
	var a task.TaskAccepted
	must(t, json.Unmarshal(m.env.Payload, &a))
	return a
}

func rejectedOf(t *testing.T, m received) task.TaskRejected {
	t.Helper()
	var r task.TaskRejected
	must(t, json.Unmarshal(m.env.Payload, &r))
	return r
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type ed25519PublicKey = ed25519.PublicKey

func deriveSID(msgID string) string { return topology.SessionID(calleeID, callerID, msgID) }

// countReplies counts the messages of type t the caller received.
func (b *bed) countReplies(t envelope.MessageType) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, m := range b.msgs {
		if m.env != nil && m.env.Type == t {
			n++
		}
	}
	return n
}
