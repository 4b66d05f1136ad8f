//go:build e2e

package scale

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// settings of a run, from the environment (the Makefile sets them).
type settings struct {
	// n Callees and n Callers (HCP_SCALE_N, default 50: the smoke).
	n int
	// idle is the window in which the operator must not write
	// (HCP_SCALE_IDLE, default 10s; make bench-scale: 60s).
	idle time.Duration
	// wait bounds each wait (HCP_SCALE_WAIT, default 5 min + 2 s per
	// object pair): a bound, not a target.
	wait time.Duration
	// managerArgs are extra manager flags (HCP_SCALE_MANAGER_ARGS).
	managerArgs []string
	// report receives the table too (HCP_SCALE_REPORT).
	report string
	// heapProfile receives the manager's heap profile at the end of the
	// idle window (HCP_SCALE_HEAP_PROFILE).
	heapProfile string
	// cpuProfile receives the manager's CPU profile of the first
	// cpuProfileFor of its convergence (HCP_SCALE_CPU_PROFILE).
	cpuProfile string
	// apiProfile, a path prefix, receives the API server's CPU profiles
	// of the first apiProfileFor of each phase, <prefix>-baseline.pprof
	// and <prefix>-operator.pprof (HCP_SCALE_APISERVER_PROFILE): where
	// the operator's extra API server time goes.
	apiProfile string
	// managerLog keeps the manager's log after the run
	// (HCP_SCALE_MANAGER_LOG; default: the test's temporary directory).
	managerLog string
}

// cpuProfileFor is the span of the manager's CPU profile: the operator's
// phase from the Callees' and Callers' creation on.
const cpuProfileFor = 60 * time.Second

// apiProfileFor is the span of the API server's CPU profiles: below its
// one-minute timeout for requests that are not watches.
const apiProfileFor = 45 * time.Second

func loadSettings(t *testing.T) settings {
	s := settings{n: 50, idle: 10 * time.Second, managerArgs: strings.Fields(os.Getenv("HCP_SCALE_MANAGER_ARGS")), report: os.Getenv("HCP_SCALE_REPORT"), heapProfile: os.Getenv("HCP_SCALE_HEAP_PROFILE"), cpuProfile: os.Getenv("HCP_SCALE_CPU_PROFILE"), apiProfile: os.Getenv("HCP_SCALE_APISERVER_PROFILE"), managerLog: os.Getenv("HCP_SCALE_MANAGER_LOG")}
	if v := os.Getenv("HCP_SCALE_N"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("HCP_SCALE_N=%q: want a whole number of at least 1", v)
		}
		s.n = n
	}
	if v := os.Getenv("HCP_SCALE_IDLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("HCP_SCALE_IDLE=%q: want a positive duration", v)
		}
		s.idle = d
	}
	// Paths are relative to the repository's root, where make runs (go
	// test runs in this package's directory).
	for _, p := range []*string{&s.report, &s.heapProfile, &s.cpuProfile, &s.apiProfile, &s.managerLog} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(repoRoot, *p)
		}
	}
	s.wait = 5*time.Minute + time.Duration(s.n)*2*time.Second
	if v := os.Getenv("HCP_SCALE_WAIT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("HCP_SCALE_WAIT=%q: want a positive duration", v)
		}
		s.wait = d
	}
	return s
}

// bed is one run's cluster side: namespaces, clients, the watching cache.
type bed struct {
	t      *testing.T
	s      settings
	cl     client.Client // direct, the manager's client settings
	cache  cache.Cache
	broker *testbed.Broker
	// home holds the connection Secret and the operator's shared objects;
	// op the Callees and Callers; base the baseline's objects.
	home, op, base      string
	opVhost, baseVhost  string
	connSecret          string
	managementURL, amqp string
	// api reads the API server's own metrics (apiWrites).
	api rest.Interface
}

const connSecretName = "hcp-broker"

// TestScale is issue 13's scale benchmark, and with the defaults its
// smoke (make test): n Callees and n Callers with harness replicas 0 on
// the local stack, against the same child objects created directly with
// a client in the same run; the manager's RSS per object; its API writes
// while idle; the cleanup, checked on the broker. It asserts what must
// hold at any size (everything converges, the baseline creates what the
// operator creates, no write while idle, everything cleaned up on the
// broker and in the cluster); timings and memory are printed, not
// asserted.
func TestScale(t *testing.T) {
	s := loadSettings(t)
	ctx := t.Context()
	b := newBed(t, s)
	r := &results{n: s.n, idle: s.idle}

	// The manager first, idle, for its memory before any object.
	dir := t.TempDir()
	bin, err := buildManager(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	logPath := s.managerLog
	if logPath == "" {
		logPath = filepath.Join(dir, "manager.log")
	}
	mgr, err := startManager(bin, logPath, b.home, b.connSecret, []string{b.op}, s.managerArgs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("manager log tail (%s):\n%s", mgr.logPath, mgr.logTail())
		}
	})
	if err := mgr.waitReady(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // let start-up garbage settle; memory only
	if r.mem0, err = mgr.memory(); err != nil {
		t.Fatal(err)
	}
	t.Logf("manager started (pid %d, log %s): RSS %s idle with no objects", mgr.cmd.Process.Pid, mgr.logPath, mib(r.mem0.rss))

	// Baseline: the same children, created directly.
	cpu0, api0 := sampleCPU(), b.apiRequests(ctx)
	apiProfiled := b.startAPIProfile(ctx, s.apiProfile, "baseline")
	r.baseCounts, r.baseReady, r.baseRequests = b.baseline(ctx, false)
	r.baseCPU, r.baseAPI = sampleCPU().since(cpu0), b.apiRequests(ctx).use(api0)
	apiProfiled()
	cpu0, api0 = sampleCPU(), b.apiRequests(ctx)
	r.baseCleanup, r.baseLeft = b.cleanupBaseline(ctx)
	r.baseCleanupCPU, r.baseCleanupAPI = sampleCPU().since(cpu0), b.apiRequests(ctx).use(api0)
	b.waitReplicaSetsGone(ctx, b.base)

	// The floor: the baseline and the writes any operator adds.
	cpu0, api0 = sampleCPU(), b.apiRequests(ctx)
	_, r.floorReady, r.floorRequests = b.baseline(ctx, true)
	r.floorCPU, r.floorAPI = sampleCPU().since(cpu0), b.apiRequests(ctx).use(api0)
	if _, left := b.cleanupBaseline(ctx); left.total() > 0 {
		t.Errorf("floor cleanup: the broker still holds %s", left)
	}
	b.waitReplicaSetsGone(ctx, b.base)

	// The operator.
	before, err := mgr.scrape()
	if err != nil {
		t.Fatal(err)
	}
	cpu0, api0 = sampleCPU(), b.apiRequests(ctx)
	apiProfiled = b.startAPIProfile(ctx, s.apiProfile, "operator")
	profiled := make(chan error, 1)
	if s.cpuProfile != "" {
		go func() { profiled <- mgr.cpuProfile(ctx, cpuProfileFor, s.cpuProfile) }()
	}
	r.opReady, r.opTopologyReady = b.operatorPhase(ctx)
	r.opCPU, r.opAPI = sampleCPU().since(cpu0), b.apiRequests(ctx).use(api0)
	apiProfiled()
	if s.cpuProfile != "" {
		if err := <-profiled; err != nil {
			t.Errorf("manager CPU profile: %v", err)
		} else {
			t.Logf("manager CPU profile of the first %s of its convergence: %s (go tool pprof -top %s)", cpuProfileFor, s.cpuProfile, s.cpuProfile)
		}
	}
	after, err := mgr.scrape()
	if err != nil {
		t.Fatal(err)
	}
	r.opWrites = after.writes() - before.writes()
	r.opReconciles = after.reconciles() - before.reconciles()
	r.opCounts = b.count(ctx, b.op, b.home)
	for _, k := range childKinds {
		if r.opCounts[k.name] != r.baseCounts[k.name] {
			t.Errorf("%s: the operator made %d, the baseline %d: the baseline (objects_test.go) no longer builds what the reconcilers apply",
				k.name, r.opCounts[k.name], r.baseCounts[k.name])
		}
	}

	// Idle: once nothing is queued, no write for the window.
	if err := b.waitQuiet(ctx, mgr); err != nil {
		t.Fatal(err)
	}
	w0, err := mgr.scrape()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("idle: watching the manager's API writes for %s", s.idle)
	select {
	case <-time.After(s.idle):
	case <-mgr.exited:
		t.Fatalf("manager exited: %s", mgr.logTail())
	}
	w1, err := mgr.scrape()
	if err != nil {
		t.Fatal(err)
	}
	r.idleWrites = w1.writes() - w0.writes()
	for _, m := range writeMethods {
		if d := w1.sum("rest_client_requests_total", `method="`+m+`"`) - w0.sum("rest_client_requests_total", `method="`+m+`"`); d > 0 {
			t.Logf("idle: %v %s requests", d, m)
		}
	}
	if r.idleWrites != 0 {
		t.Errorf("the manager wrote %v times to the API server while idle for %s; want 0", r.idleWrites, s.idle)
	}
	if r.mem1, err = mgr.memory(); err != nil {
		t.Fatal(err)
	}
	r.sizeFull, r.sizeTrimmed = b.serializedSize(ctx)
	if s.heapProfile != "" {
		if err := mgr.heapProfile(ctx, s.heapProfile); err != nil {
			t.Errorf("manager heap profile: %v", err)
		} else {
			t.Logf("manager heap profile: %s (go tool pprof -sample_index=inuse_space -top %s)", s.heapProfile, s.heapProfile)
		}
	}

	// Cleanup.
	cpu0, api0 = sampleCPU(), b.apiRequests(ctx)
	r.opCleanup, r.opLeft = b.cleanupOperator(ctx)
	r.opCleanupCPU, r.opCleanupAPI = sampleCPU().since(cpu0), b.apiRequests(ctx).use(api0)

	// The baseline again, after the operator's phase (A-B-A): the stack
	// and the machine drift over a run (etcd's and the API server's
	// state grow, the cores' speed varies), so the time to Ready is
	// compared with the mean of the baseline before and after.
	b.waitReplicaSetsGone(ctx, b.op)
	t.Logf("the baseline again, after the operator's phase")
	cpu0 = sampleCPU()
	_, r.baseAgainReady, _ = b.baseline(ctx, false)
	r.baseAgainCPU = sampleCPU().since(cpu0)
	if _, left := b.cleanupBaseline(ctx); left.total() > 0 {
		t.Errorf("second baseline's cleanup: the broker still holds %s", left)
	}

	r.print(t, s.report)
}

func newBed(t *testing.T, s settings) *bed {
	ctx := t.Context()
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		t.Fatal(err)
	}
	// The manager's client settings (no client-side rate limit unless
	// configured): the baseline creates with the same.
	mc := controller.DefaultManagerConfig()
	restCfg = mc.RESTConfig(restCfg)
	scheme := runtime.NewScheme()
	if err := controller.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	api, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	// The project's CRDs, as a chart install would leave them (the e2e
	// suite, which runs before in make test, uninstalls its release).
	if _, err := envtest.InstallCRDs(restCfg, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join("..", "..", "config", "crd", "bases")}, ErrorIfPathMissing: true,
	}); err != nil {
		t.Fatalf("install the CRDs: %v", err)
	}
	id := randomID()
	b := &bed{
		t: t, s: s, cl: cl, api: api.RESTClient(),
		home: "hcp-scale-" + id + "-system", op: "hcp-scale-" + id, base: "hcp-scale-" + id + "-base",
		opVhost: "/hcp-scale-" + id, baseVhost: "/hcp-scale-" + id + "-base",
		connSecret:    connSecretName,
		managementURL: firstOf(os.Getenv("HCP_STACK_MANAGEMENT_URL"), testbed.DefaultManagementURL),
		amqp:          firstOf(os.Getenv("HCP_STACK_AMQP_URL"), testbed.DefaultAMQPURL),
	}
	if b.broker, err = testbed.NewBroker(b.managementURL, firstOf(os.Getenv("RABBITMQ_USERNAME"), testbed.DefaultUsername),
		firstOf(os.Getenv("RABBITMQ_PASSWORD"), testbed.DefaultPassword)); err != nil {
		t.Fatal(err)
	}
	t.Logf("run %s: namespaces %s (Callees, Callers), %s (shared objects), %s (baseline); vhosts %s, %s; %d Callees + %d Callers",
		id, b.op, b.home, b.base, b.opVhost, b.baseVhost, s.n, s.n)
	for _, ns := range []string{b.home, b.op, b.base} {
		if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// Leave nothing behind, whatever happened: the namespaces (the
		// topology operator's finalizers still run) and the vhosts.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		for _, ns := range []string{b.op, b.base, b.home} {
			if err := cl.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreNotFound(err) != nil {
				t.Errorf("delete namespace %s: %v", ns, err)
			}
		}
		for _, v := range []string{b.opVhost, b.baseVhost} {
			if err := cleanBroker(b.broker, v); err != nil {
				t.Errorf("clean vhost %s on the broker: %v", v, err)
			}
		}
	})
	for _, ns := range []string{b.home, b.base} {
		conn := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: ns, Name: connSecretName,
				Labels:      map[string]string{resource.LabelTopologyOperator: resource.TopologyOperatorLabelValue},
				Annotations: map[string]string{resource.AllowedNamespacesAnnotation: b.op},
			},
			StringData: map[string]string{
				resource.ConnectionSecretURIKey:      b.managementURL,
				resource.ConnectionSecretUsernameKey: b.broker.Username,
				resource.ConnectionSecretPasswordKey: b.broker.Password,
				resource.ConnectionSecretAMQPURLKey:  b.amqp,
			},
		}
		if err := cl.Create(ctx, conn); err != nil {
			t.Fatal(err)
		}
	}
	b.cache, err = cache.New(restCfg, cache.Options{Scheme: scheme, DefaultNamespaces: map[string]cache.Config{b.home: {}, b.op: {}, b.base: {}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range append(append([]kind{}, childKinds...), ownKinds...) {
		if _, err := b.cache.GetInformer(ctx, itemOf(t, scheme, k.list())); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = b.cache.Start(ctx) }()
	if !b.cache.WaitForCacheSync(ctx) {
		t.Fatal("the test's cache did not sync")
	}
	return b
}

// itemOf is an empty object of a list's item kind.
func itemOf(t *testing.T, scheme *runtime.Scheme, l client.ObjectList) client.Object {
	gvk, err := apiutil.GVKForObject(l, scheme)
	if err != nil {
		t.Fatal(err)
	}
	gvk.Kind = strings.TrimSuffix(gvk.Kind, "List")
	o, err := scheme.New(gvk)
	if err != nil {
		t.Fatal(err)
	}
	return o.(client.Object)
}

func randomID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randomPassword() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
