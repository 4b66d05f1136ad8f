// Package relay runs the whole HCP relay in one process against the real
// RabbitMQ and a real API server (envtest, internal/testbed): a callee
// harness → the callee hcp-sidecar → RabbitMQ → the caller hcp-sidecar → a
// caller app, with broker users named and permitted exactly as the operator
// makes them (pkg/hcp/topology) and the topology declared by an
// administrator connection in a vhost of its own. TestRelay* check the full
// flow; BenchmarkRelay measures it against a raw amqp091-go publisher and
// consumer (internal/benchutil) in the same run:
//
//	go test -run '^$' -bench BenchmarkRelay -benchtime 5000x -timeout 60m ./test/relay
package relay

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/sidecar/cachetrim"
	"github.com/hcp-io/hcp-operator/internal/sidecar/callee"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/internal/transport"
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
	// The sidecars' informers and clients log through controller-runtime;
	// without a logger set it drops their logs and prints a stack trace
	// about it in the middle of the benchmarks' output. Errors only: a
	// benchmark's output is its figures.
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	code := m.Run()
	if sharedEnv != nil {
		_ = sharedEnv.Stop()
	}
	os.Exit(code)
}

func apiServer(tb testing.TB) *testbed.Env {
	tb.Helper()
	envOnce.Do(func() {
		sharedEnv, envErr = testbed.Start(context.Background(), testbed.Options{
			WithoutTopologyCRDs: true,
			AddToScheme:         []func(*runtime.Scheme) error{v1alpha1.AddToScheme},
		})
	})
	if envErr != nil {
		tb.Fatal(envErr)
	}
	return sharedEnv
}

const (
	calleeID = "lab"
	callerID = "alpha"
)

// bedOptions configure a bed.
type bedOptions struct {
	// Harness returns the callee harness, given the callee sidecar's API
	// base URL. Required.
	Harness func(sidecarURL string, log logr.Logger) http.Handler
	// App is the caller app. Required.
	App http.Handler
	// Capabilities of the Callee; nil: analyze (R1, T2) and restricted
	// (R1, T1).
	Capabilities []v1alpha1.Capability
	// Rules of the CapabilityPolicy; nil: the caller may use analyze.
	Rules []v1alpha1.PolicyRule
	// Quiet logs errors only (benchmarks).
	Quiet bool
	// GapTimeout is the caller sidecar's caller.Options.GapTimeout (0: its
	// default).
	GapTimeout time.Duration
	// CallerPrefetch is the caller sidecar's prefetch (0: its default).
	CallerPrefetch int
	// AppMaxBatch is the caller sidecar's caller.Options.AppMaxBatch (0:
	// one event per request).
	AppMaxBatch int
	// RecordBeforeReply is the callee sidecar's
	// callee.Options.RecordBeforeReply (the acceptance's baseline).
	RecordBeforeReply bool
	// Cluster, when set, is the broker instead of the machine's one node:
	// the sidecars get every node's address (transport.Options.Addresses).
	Cluster *testbed.Cluster
}

// bed is one callee pod (harness + callee sidecar) and one caller pod
// (caller sidecar + app), in-process, on a vhost and a namespace of their
// own.
type bed struct {
	tb     testing.TB
	env    *testbed.Env
	broker *testbed.Broker
	// addresses are the broker's nodes when it is a cluster.
	addresses []string
	ns        string
	vhost     string
	callee    user
	caller    user

	// CalleeAPI and CallerAPI are the sidecars' local API base URLs.
	CalleeAPI string
	CallerAPI string
	// Metrics of each sidecar (their own registries).
	CalleeMetrics *metrics.Metrics
	CallerMetrics *metrics.Metrics
	CalleeReg     *prometheus.Registry
	CallerReg     *prometheus.Registry
	CalleeSC      *callee.Sidecar
	CallerSC      *caller.Sidecar
	Harness       http.Handler
	// AppConns counts the connections the caller sidecar opened to the app.
	AppConns atomic.Int64
	// APIWrites counts both sidecars' API writes.
	APIWrites apiWriteCounter

	alive  atomic.Bool
	mu     sync.Mutex
	stops  []func() // run last first by Close
	closed bool
}

type user struct{ name, password string }

func defaultCapabilities() []v1alpha1.Capability {
	return []v1alpha1.Capability{
		{Name: "analyze", RiskLevel: v1alpha1.RiskR1, DataClassification: v1alpha1.DataT2, MaxDuration: "PT1H"},
		{Name: "restricted", RiskLevel: v1alpha1.RiskR1, DataClassification: v1alpha1.DataT1},
	}
}

func defaultRules() []v1alpha1.PolicyRule {
	return []v1alpha1.PolicyRule{{
		Name:         "alpha-analyze",
		Callers:      v1alpha1.CallerMatch{IDs: []string{callerID}},
		Capabilities: []string{"analyze"},
		MaxRiskLevel: v1alpha1.RiskR2,
	}}
}

// newBed sets up broker and API objects and starts both sidecars; Close (or
// the end of the test) stops them.
func newBed(tb testing.TB, o bedOptions) *bed {
	tb.Helper()
	if testing.Short() {
		tb.Skip("integration test (envtest + RabbitMQ); -short skips it")
	}
	broker := testbed.EnsureRabbitMQ(tb)
	var addrs []string
	if o.Cluster != nil {
		broker, addrs = o.Cluster.Broker, o.Cluster.Addresses
	}
	env := apiServer(tb)
	b := &bed{tb: tb, env: env, broker: broker, addresses: addrs}
	b.alive.Store(true)
	tb.Cleanup(b.Close)
	ctx := context.Background()

	// Broker: a vhost, the two users as the operator names and permits them,
	// the topology as the operator declares it.
	b.vhost = testbed.RandomName("hcp-relay-")
	must(tb, broker.CreateVhost(b.vhost))
	b.onClose(func() { _ = broker.DeleteVhost(b.vhost) })
	must(tb, testbed.Answered(broker.API.UpdatePermissionsIn(b.vhost, broker.Username, rabbithole.Permissions{Configure: ".*", Write: ".*", Read: ".*"})))
	b.callee = b.newUser(topology.RoleCallee, calleeID)
	b.caller = b.newUser(topology.RoleCaller, callerID)
	must(tb, declareTopology(b.adminURL()))

	// Kubernetes: the Callee, the Caller and a CapabilityPolicy.
	b.ns = env.CreateNamespace(tb, "relay-")
	if o.Capabilities == nil {
		o.Capabilities = defaultCapabilities()
	}
	if o.Rules == nil {
		o.Rules = defaultRules()
	}
	must(tb, env.Client.Create(ctx, &v1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Name: calleeID, Namespace: b.ns},
		Spec: v1alpha1.CalleeSpec{
			Capabilities: o.Capabilities,
			Harness: v1alpha1.HarnessSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "harness", Image: "example.com/harness:1"}},
			}}},
		},
	}))
	must(tb, env.Client.Create(ctx, &v1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Name: callerID, Namespace: b.ns}}))
	must(tb, env.Client.Create(ctx, &v1alpha1.CapabilityPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "lab-policy", Namespace: b.ns},
		Spec:       v1alpha1.CapabilityPolicySpec{Rules: o.Rules},
	}))
	testbed.DumpOnFailure(tb, testbed.Dump{Client: env.Client, Namespace: b.ns, Lists: []client.ObjectList{&v1alpha1.HCPSessionList{}}, Broker: broker, Vhosts: []string{b.vhost}})

	b.startCallee(o)
	b.startCaller(o)
	return b
}

func (b *bed) onClose(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stops = append(b.stops, f)
}

// Close stops both sidecars (caller first, as an app shutting down would
// not matter here) and removes the broker objects. Idempotent.
func (b *bed) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	stops := b.stops
	b.mu.Unlock()
	for _, f := range slices.Backward(stops) {
		f()
	}
	b.alive.Store(false)
}

// logger logs through the test while the bed lives (a goroutine logging
// after a test or benchmark ended would panic).
func (b *bed) logger(name string, quiet bool) logr.Logger {
	v := 0
	if n, err := strconv.Atoi(os.Getenv("HCP_RELAY_LOG_V")); err == nil {
		v = n // the sidecars' logs at this level, with millisecond timestamps, even in benchmarks
	} else if quiet {
		v = -1
	}
	return funcr.New(func(prefix, args string) {
		if b.alive.Load() {
			b.tb.Log(time.Now().Format("15:04:05.000"), prefix, args)
		}
	}, funcr.Options{Verbosity: v}).WithName(name)
}

// newUser creates a broker user with the operator's name and permissions
// for role and id, through the management API.
func (b *bed) newUser(role topology.Role, id string) user {
	var buf [12]byte
	_, _ = rand.Read(buf[:])
	u := user{name: topology.Username(role, b.vhost, id), password: hex.EncodeToString(buf[:])}
	must(b.tb, testbed.Answered(b.broker.API.PutUser(u.name, rabbithole.UserSettings{Password: u.password, Tags: rabbithole.UserTags{}})))
	b.onClose(func() { _ = b.broker.DeleteUsers(u.name) })
	var p topology.Permissions
	if role == topology.RoleCallee {
		p = topology.CalleePermissions(id)
	} else {
		p = topology.CallerPermissions(id)
	}
	must(b.tb, testbed.Answered(b.broker.API.UpdatePermissionsIn(b.vhost, u.name, rabbithole.Permissions{Configure: p.Configure, Write: p.Write, Read: p.Read})))
	return u
}

func (b *bed) adminURL() string {
	return b.broker.AMQPURI(b.broker.Username, b.broker.Password, b.vhost)
}

// eventQueueArgs are the arguments the operator gives hcp.evt.{caller} for
// a Caller with the default spec.eventQueue (quorum, TTL, max length,
// overflow, single active consumer).
func eventQueueArgs() amqp.Table {
	args, err := resource.CallerQueueArguments(v1alpha1.EventQueueSpec{})
	if err != nil {
		panic(err)
	}
	t := amqp.Table{"x-queue-type": "quorum"}
	for k, v := range args {
		t[k] = v
	}
	return t
}

// withChannel runs f on a channel of a connection to url of its own, an
// administrator's for declarations.
func withChannel(url string, f func(*amqp.Channel) error) error {
	conn, ch, err := benchutil.DialChannel(url, "relay-test-admin")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	return f(ch)
}

// declareTopology declares, as an administrator (the operator's job: the
// sidecars may not), the HCP exchanges, the callee's command queue and the
// caller's event queue with the operator's arguments, and their bindings.
func declareTopology(url string) error {
	return withChannel(url, func(ch *amqp.Channel) error {
		cmdArgs := amqp.Table{"x-queue-type": "quorum"}
		for k, v := range resource.CalleeQueueArguments(v1alpha1.CommandQueueSpec{}) {
			cmdArgs[k] = v
		}
		steps := []func() error{
			func() error {
				return ch.ExchangeDeclare(topology.CommandsExchange, topology.CommandsExchangeType, true, false, false, false, nil)
			},
			func() error {
				return ch.ExchangeDeclare(topology.EventsExchange, topology.EventsExchangeType, true, false, false, false, nil)
			},
			func() error {
				_, err := ch.QueueDeclare(topology.CommandQueue(calleeID), true, false, false, false, cmdArgs)
				return err
			},
			func() error {
				_, err := ch.QueueDeclare(topology.EventQueue(callerID), true, false, false, false, eventQueueArgs())
				return err
			},
			func() error {
				return ch.QueueBind(topology.CommandQueue(calleeID), topology.CommandRoutingKey(calleeID), topology.CommandsExchange, false, nil)
			},
			func() error {
				return ch.QueueBind(topology.EventQueue(callerID), topology.EventBindingKey(callerID), topology.EventsExchange, false, nil)
			},
		}
		for _, f := range steps {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	})
}

// startCallee runs the callee pod: the harness and the callee sidecar,
// wired as cmd/hcp-sidecar wires them (a cache scoped to the callee's
// HCPSessions, an uncached reader, the coalescing status writer).
func (b *bed) startCallee(o bedOptions) {
	tb := b.tb
	log := b.logger("callee", o.Quiet)
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	must(tb, err)
	b.CalleeAPI = "http://" + apiLn.Addr().String()
	b.Harness = o.Harness(b.CalleeAPI, log.WithName("harness"))
	hsrv := httptest.NewServer(b.Harness)
	b.onClose(hsrv.Close)

	objCache, kc := b.cachedClient(map[client.Object]cache.ByObject{
		&v1alpha1.HCPSession{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.LabelCalleeID: calleeID})},
	}, &v1alpha1.HCPSession{}, &v1alpha1.Callee{}, &v1alpha1.Caller{}, &v1alpha1.CapabilityPolicy{})

	b.CalleeReg = prometheus.NewRegistry()
	b.CalleeMetrics = metrics.New(b.CalleeReg)
	conn, pub := b.dial(b.callee, "hcp-sidecar callee "+calleeID, log, b.CalleeMetrics, false)
	sw := b.statusWriter(kc, b.CalleeMetrics, log)
	_, key, err := token.GenerateKey()
	must(tb, err)
	cfg := &config.Config{
		Mode: config.ModeCallee, ID: calleeID, ObjectName: calleeID, Namespace: b.ns, PodName: "lab-0",
		Vhost: b.vhost, Username: b.callee.name, HarnessURL: hsrv.URL, APIAddr: apiLn.Addr().String(),
		Prefetch: config.DefaultCalleePrefetch, Heartbeat: config.DefaultHeartbeat,
	}
	sc, err := callee.New(callee.Options{
		Config: cfg, Client: kc, Reader: b.env.Client, Cache: objCache, Conn: conn, Publisher: pub, Consumer: conn,
		Status: sw, Metrics: b.CalleeMetrics, Log: log, SigningKey: key,
		Timeouts:          callee.Timeouts{ShutdownDrain: 2 * time.Second, PendingWait: 5 * time.Second},
		RecordBeforeReply: o.RecordBeforeReply,
	})
	must(tb, err)
	b.CalleeSC = sc
	b.serve(apiLn, sc.Handler(), log)
	b.run("callee sidecar", sc.Run, sc.Ready)
}

// startCaller runs the caller pod: the app and the caller sidecar, wired as
// cmd/hcp-sidecar wires them, with a state directory on disk (fsync).
func (b *bed) startCaller(o bedOptions) {
	tb := b.tb
	log := b.logger("caller", o.Quiet)
	appSrv := httptest.NewUnstartedServer(o.App)
	appSrv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			b.AppConns.Add(1)
		}
	}
	appSrv.Start()
	b.onClose(appSrv.Close)
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	must(tb, err)
	b.CallerAPI = "http://" + apiLn.Addr().String()

	_, kc := b.cachedClient(map[client.Object]cache.ByObject{
		&v1alpha1.HCPSession{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.LabelCallerID: callerID}), Transform: cachetrim.CallerSession},
	}, &v1alpha1.HCPSession{}, &v1alpha1.Caller{})
	b.CallerReg = prometheus.NewRegistry()
	b.CallerMetrics = metrics.New(b.CallerReg)
	conn, pub := b.dial(b.caller, "hcp-sidecar caller "+callerID, log, b.CallerMetrics, true)
	sw := b.statusWriter(kc, b.CallerMetrics, log)
	// HCP_RELAY_STATE_DIR places the state directory (default the system's
	// temporary directory, on disk here); a tmpfs there shows what the
	// fsyncs cost.
	stateDir, err := os.MkdirTemp(os.Getenv("HCP_RELAY_STATE_DIR"), "hcp-relay-state-")
	must(tb, err)
	b.onClose(func() { _ = os.RemoveAll(stateDir) })
	cfg := &config.Config{
		Mode: config.ModeCaller, ID: callerID, ObjectName: callerID, Namespace: b.ns, PodName: "alpha-0",
		Vhost: b.vhost, AMQPURL: b.broker.AMQPURI(b.caller.name, b.caller.password, b.vhost), Username: b.caller.name,
		HarnessURL: appSrv.URL, APIAddr: apiLn.Addr().String(), Prefetch: cmp.Or(o.CallerPrefetch, config.DefaultCallerPrefetch),
		Heartbeat: config.DefaultHeartbeat, StateDir: stateDir,
	}
	sc, err := caller.New(caller.Options{
		Config: cfg, Client: kc, Publisher: pub, Consumer: conn, Status: sw, Metrics: b.CallerMetrics, Log: log,
		GapTimeout: o.GapTimeout, AppMaxBatch: o.AppMaxBatch,
	})
	must(tb, err)
	b.CallerSC = sc
	b.serve(apiLn, sc.Handler(), log)
	b.run("caller sidecar", sc.Run, sc.Ready)
}

// cachedClient starts a cache on the bed's namespace and returns it with a
// client reading through it.
func (b *bed) cachedClient(byObject map[client.Object]cache.ByObject, watched ...client.Object) (cache.Cache, client.Client) {
	tb := b.tb
	c, err := cache.New(b.env.Config, cache.Options{
		Scheme:            b.env.Scheme,
		DefaultNamespaces: map[string]cache.Config{b.ns: {}},
		DefaultTransform:  cachetrim.Transform, // as internal/sidecar/runner
		ByObject:          byObject,
	})
	must(tb, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Start(ctx); close(done) }()
	b.onClose(func() { cancel(); <-done })
	for _, o := range watched {
		_, err := c.GetInformer(ctx, o)
		must(tb, err)
	}
	syncCtx, cancelSync := context.WithTimeout(ctx, time.Minute)
	defer cancelSync()
	if !c.WaitForCacheSync(syncCtx) {
		tb.Fatal("cache did not sync")
	}
	kc, err := client.New(b.APIWrites.wrap(b.env.Config), client.Options{Scheme: b.env.Scheme, Cache: &client.CacheOptions{Reader: c}})
	must(tb, err)
	return c, kc
}

func (b *bed) dial(u user, name string, log logr.Logger, m *metrics.Metrics, drainWithoutCancel bool) (*transport.Conn, *transport.ConfirmPublisher) {
	tb := b.tb
	conn, err := transport.Dial(context.Background(), transport.Options{
		URL: b.broker.AMQPURI(u.name, u.password, b.vhost), Addresses: b.addresses, ConnectionName: name, Logger: log.WithName("amqp"), Metrics: m,
		Heartbeat: config.DefaultHeartbeat, DrainWithoutCancel: drainWithoutCancel,
	})
	must(tb, err)
	b.onClose(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = conn.Close(ctx)
	})
	pub, err := transport.NewPublisher(conn, transport.PublisherOptions{})
	must(tb, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must(tb, conn.WaitReady(ctx))
	return conn, pub
}

func (b *bed) statusWriter(kc client.Client, m *metrics.Metrics, log logr.Logger) *status.Writer {
	sw := status.New(status.Options{Client: kc, Namespace: b.ns, Metrics: m, Log: log.WithName("status")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = sw.Run(ctx); close(done) }()
	b.onClose(func() { cancel(); <-done })
	return sw
}

func (b *bed) serve(ln net.Listener, h http.Handler, log logr.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = server.Serve(ctx, ln, h, log); close(done) }()
	b.onClose(func() { cancel(); <-done })
}

// run runs a sidecar until Close and waits for it to be ready. Its stop
// runs before the API server, status writer and connection it uses are
// closed (registered after them), as in cmd/hcp-sidecar.
func (b *bed) run(what string, run func(context.Context) error, ready func() error) {
	tb := b.tb
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	b.onClose(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				tb.Errorf("%s: Run: %v", what, err)
			}
		case <-time.After(30 * time.Second):
			tb.Errorf("%s did not stop within 30s", what)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for ready() != nil {
		select {
		case err := <-done:
			tb.Fatalf("%s stopped: %v", what, err)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s not ready: %v", what, ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hcpSession reads an HCPSession from the API server.
func (b *bed) hcpSession(ctx context.Context, sid string) (*v1alpha1.HCPSession, error) {
	var hs v1alpha1.HCPSession
	err := b.env.Client.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: sid}, &hs)
	return &hs, err
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}
