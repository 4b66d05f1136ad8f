//go:build e2e

package scale

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
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

var managedBy = client.MatchingLabels{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue}

// readOnly: the test's cache lists only read what they list, so they take
// the cache's objects without copying them. Copying some 20,000 objects
// every 500 ms while waiting for a cleanup cost the test process 95 s of
// CPU at 1,000 + 1,000, CPU the API server and the garbage collector it
// waits for did not get.
var readOnly = client.UnsafeDisableDeepCopy

// count counts, in the test's cache, the operator's children (labelled
// managed-by hcp-operator) in namespaces, by kind.
func (b *bed) count(ctx context.Context, namespaces ...string) map[string]int {
	out := map[string]int{}
	for _, k := range childKinds {
		for _, ns := range namespaces {
			l := k.list()
			if err := b.cache.List(ctx, l, client.InNamespace(ns), managedBy, readOnly); err != nil {
				b.t.Fatal(err)
			}
			out[k.name] += meta.LenList(l)
		}
	}
	return out
}

// topologyReady counts the topology objects in namespaces and those Ready
// at their generation.
func (b *bed) topologyReady(ctx context.Context, namespaces ...string) (ready, total int) {
	for _, k := range childKinds {
		if k.ready == nil {
			continue
		}
		for _, ns := range namespaces {
			l := k.list()
			if err := b.cache.List(ctx, l, client.InNamespace(ns), managedBy, readOnly); err != nil {
				b.t.Fatal(err)
			}
			_ = meta.EachListItem(l, func(o runtime.Object) error {
				total++
				if k.ready(o.(client.Object)) {
					ready++
				}
				return nil
			})
		}
	}
	return ready, total
}

// waitFor polls cond every 500 ms until it holds, failing the test after
// the run's bound with cond's last description. It returns how long it
// took from start.
func (b *bed) waitFor(ctx context.Context, what string, start time.Time, cond func() (bool, string)) time.Duration {
	b.t.Helper()
	deadline := time.Now().Add(b.s.wait)
	lastLog := time.Now()
	for {
		ok, desc := cond()
		if ok {
			d := time.Since(start)
			b.t.Logf("%s after %s: %s", what, d.Round(100*time.Millisecond), desc)
			return d
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: not within %s: %s", what, b.s.wait, desc)
		}
		if time.Since(lastLog) > 30*time.Second {
			b.t.Logf("%s: waiting (%s): %s", what, time.Since(start).Round(time.Second), desc)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			b.t.Fatal(ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// forBoth runs callee and caller for i in [0, n), each on its own
// goroutine, as the
// manager runs one worker per controller by default.
func forBoth(n int, callee, caller func(i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for j, f := range []func(int) error{callee, caller} {
		wg.Go(func() {
			for i := range n {
				if err := f(i); err != nil {
					errs[j] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if errs[0] != nil {
		return errs[0]
	}
	return errs[1]
}

// baseline creates, directly, what the operator would create for n
// Callees and n Callers (objects_test.go), as fast as the client goes
// with one writer per kind, and waits until the topology operator has
// made every topology object Ready: issue 13's measure for the operator's
// time to Ready. It returns the objects by kind, the time and the
// requests sent.
//
// With floor it also makes the writes any operator of these kinds adds,
// and nothing else: each Callee and Caller itself is created before its
// children (the user's create, in the operator's phase too), and once
// every topology object is Ready each gets one status write (the least
// that tells kstatus, Argo CD or a user it converged). No watch, no
// reconcile, no claim, no Event: what is left of the operator's time
// above the floor is the operator's own.
func (b *bed) baseline(ctx context.Context, floor bool) (map[string]int, time.Duration, int) {
	t := b.t
	conn := &corev1.Secret{}
	if err := b.cl.Get(ctx, client.ObjectKey{Namespace: b.base, Name: connSecretName}, conn); err != nil {
		t.Fatal(err)
	}
	// The CRDs' defaults, as the reconcilers see them.
	calleeTmpl := newCallee(b.base, objectName(0), b.baseVhost)
	callerTmpl := newCaller(b.base, objectName(0), b.baseVhost)
	for _, o := range []client.Object{calleeTmpl, callerTmpl} {
		if err := b.cl.Create(ctx, o, client.DryRunAll); err != nil {
			t.Fatal(err)
		}
	}
	ref := resourceRef(conn)
	brk, err := resource.BrokerFromConnectionSecret(ref, calleeTmpl.Spec.Broker, conn)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	requests := 0
	create := func(objs []client.Object) error {
		for _, o := range objs {
			if err := b.cl.Create(ctx, o); err != nil {
				return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
			}
		}
		mu.Lock()
		requests += len(objs)
		mu.Unlock()
		return nil
	}
	phase := "baseline"
	if floor {
		phase = "floor"
	}
	// subject is the Callee or Caller the children are built for: with
	// floor, created; else never created, with a UID of its own.
	callees := make([]*hcpv1alpha1.Callee, b.s.n)
	callers := make([]*hcpv1alpha1.Caller, b.s.n)
	subject := func(o client.Object) error {
		if !floor {
			withUID(o)
			return nil
		}
		// The dry run's result, as a new object.
		o.SetResourceVersion("")
		o.SetManagedFields(nil)
		return create([]client.Object{o})
	}
	t.Logf("%s: creating the children of %d Callees and %d Callers directly", phase, b.s.n, b.s.n)
	start := time.Now()
	if err := create(sharedObjects(b.base, brk, conn)); err != nil {
		t.Fatal(err)
	}
	err = forBoth(b.s.n, func(i int) error {
		c := calleeTmpl.DeepCopy()
		c.Name = objectName(i)
		if err := subject(c); err != nil {
			return err
		}
		callees[i] = c
		objs, err := calleeChildren(c, brk, randomPassword())
		if err != nil {
			return err
		}
		return create(objs)
	}, func(i int) error {
		c := callerTmpl.DeepCopy()
		c.Name = objectName(i)
		if err := subject(c); err != nil {
			return err
		}
		callers[i] = c
		objs, err := callerChildren(c, brk, randomPassword())
		if err != nil {
			return err
		}
		return create(objs)
	})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Since(start)
	t.Logf("%s: %d objects created in %s", phase, requests, created.Round(100*time.Millisecond))
	d := b.waitFor(ctx, phase+": every topology object Ready", start, func() (bool, string) {
		ready, total := b.topologyReady(ctx, b.base)
		return total > 0 && ready == total, fmt.Sprintf("%d/%d topology objects Ready", ready, total)
	})
	if floor {
		err := forBoth(b.s.n, func(i int) error {
			return writeConverged(ctx, b.cl, callees[i], &callees[i].Status.ObservedGeneration, &callees[i].Status.Conditions)
		}, func(i int) error {
			return writeConverged(ctx, b.cl, callers[i], &callers[i].Status.ObservedGeneration, &callers[i].Status.Conditions)
		})
		if err != nil {
			t.Fatal(err)
		}
		requests += 2 * b.s.n
		d = time.Since(start)
		t.Logf("%s: one status write each for the %d Callees and Callers after %s", phase, 2*b.s.n, d.Round(100*time.Millisecond))
	}
	return b.count(ctx, b.base), d, requests
}

// writeConverged writes obj's status as the operator writes it for a
// converged object with replicas 0 (converged holds for it): one merge
// patch of the status subresource, as the operator's status writes are.
func writeConverged(ctx context.Context, cl client.Client, obj client.Object, observed *int64, conds *[]metav1.Condition) error {
	before := obj.DeepCopyObject().(client.Object)
	*observed = obj.GetGeneration()
	set := func(typ string, ok bool, reason, msg string) {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: obj.GetGeneration()})
	}
	set(hcpv1alpha1.ConditionTopologyReady, true, hcpv1alpha1.ReasonReconciled, "topology objects ready")
	set(hcpv1alpha1.ConditionHarnessReady, false, hcpv1alpha1.ReasonScaledToZero, "scaled to zero")
	set(hcpv1alpha1.ConditionReady, true, hcpv1alpha1.ReasonScaledToZero, "HarnessReady: scaled to zero")
	return cl.Status().Patch(ctx, obj, client.MergeFrom(before))
}

// resourceRef is a reference to a connection Secret in the subject's
// own namespace.
func resourceRef(conn *corev1.Secret) topologyv1beta1.RabbitmqClusterReference {
	return topologyv1beta1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: conn.Name}}
}

// cleanupBaseline deletes the baseline's objects as the operator's
// finalizers would (the topology objects, then once the topology operator
// removed them the shared ones, the rest at once), times it until
// everything is gone from the cluster and the broker, and returns what
// the broker still held then.
func (b *bed) cleanupBaseline(ctx context.Context) (cleanup, leftover) {
	t := b.t
	start := time.Now()
	deleteAll := func(names ...string) {
		for _, k := range childKinds {
			if !containsName(names, k.name) {
				continue
			}
			o := itemOf(t, b.cl.Scheme(), k.list())
			if err := b.cl.DeleteAllOf(ctx, o, client.InNamespace(b.base), managedBy, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
				t.Fatalf("delete %ss: %v", k.name, err)
			}
		}
	}
	// The Secrets last: the topology operator needs the connection
	// Secret's copy to delete the shared objects on the broker (the
	// operator's copy goes by garbage collection after them).
	deleteAll("Queue", "Binding", "User", "Permission", "Policy", "ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget", "Deployment")
	b.waitFor(ctx, "baseline cleanup: per-object topology objects gone", start, func() (bool, string) {
		c := b.count(ctx, b.base)
		n := c["Queue"] + c["Binding"] + c["User"] + c["Permission"] + c["Policy"]
		return n == 0, fmt.Sprintf("%d left", n)
	})
	deleteAll("Exchange", "Vhost")
	r := b.waitFor(ctx, "baseline cleanup: shared objects gone", start, func() (bool, string) {
		c := b.count(ctx, b.base)
		n := c["Exchange"] + c["Vhost"]
		return n == 0, fmt.Sprintf("%d left", n)
	})
	deleteAll("Secret")
	// The floor's Callees and Callers: no finalizer (no operator watches
	// this namespace).
	for _, o := range []client.Object{&hcpv1alpha1.Callee{}, &hcpv1alpha1.Caller{}} {
		if err := b.cl.DeleteAllOf(ctx, o, client.InNamespace(b.base)); err != nil {
			t.Fatal(err)
		}
	}
	d, left := b.waitGone(ctx, "baseline cleanup", start, b.baseVhost, b.base)
	return cleanup{topology: r, all: d}, left
}

// waitReplicaSetsGone waits, untimed, until the garbage collector has
// removed the ReplicaSets of ns's deleted Deployments, so that its tail
// after one phase's cleanup does not load the machine in the next phase.
func (b *bed) waitReplicaSetsGone(ctx context.Context, ns string) {
	b.waitFor(ctx, ns+": ReplicaSets gone (garbage collection, untimed)", time.Now(), func() (bool, string) {
		var l appsv1.ReplicaSetList
		if err := b.cl.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(l.Items) == 0, fmt.Sprintf("%d left", len(l.Items))
	})
}

func containsName(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}

// waitGone waits until namespaces hold no Callee, Caller or child and the
// broker holds nothing of vhost; when the cluster is clean but the broker
// is not, it waits 2 more minutes for the broker and returns what is left.
func (b *bed) waitGone(ctx context.Context, what string, start time.Time, vhost string, namespaces ...string) (time.Duration, leftover) {
	var clusterClean time.Time
	var left leftover
	var lastErr error
	d := b.waitFor(ctx, what+": nothing left in the cluster or on the broker", start, func() (bool, string) {
		c := b.count(ctx, namespaces...)
		var parts []string
		for _, k := range append(append([]kind{}, ownKinds...), childKinds...) {
			n := c[k.name]
			if k.list != nil && containsName([]string{"Callee", "Caller"}, k.name) {
				for _, ns := range namespaces {
					l := k.list()
					if err := b.cache.List(ctx, l, client.InNamespace(ns), readOnly); err != nil {
						b.t.Fatal(err)
					}
					n += meta.LenList(l)
				}
			}
			if n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, k.name))
			}
		}
		if len(parts) > 0 {
			return false, "in the cluster: " + strings.Join(parts, ", ")
		}
		if clusterClean.IsZero() {
			clusterClean = time.Now()
		}
		left, lastErr = onBroker(b.broker, vhost)
		if lastErr != nil {
			return false, "broker: " + lastErr.Error()
		}
		if left.total() > 0 && time.Since(clusterClean) > 2*time.Minute {
			return true, "cluster clean, but the broker still holds " + left.String()
		}
		return left.total() == 0, "on the broker: " + left.String()
	})
	if left.total() > 0 {
		b.t.Errorf("%s: orphans on the broker in vhost %s: %s", what, vhost, left)
	}
	return d, left
}

func converged(gen, observed int64, conds []metav1.Condition) (ready, topology bool) {
	if observed != gen {
		return false, false
	}
	topo := meta.FindStatusCondition(conds, hcpv1alpha1.ConditionTopologyReady)
	h := meta.FindStatusCondition(conds, hcpv1alpha1.ConditionHarnessReady)
	topology = topo != nil && topo.Status == metav1.ConditionTrue
	// Replicas 0 is HarnessReady=False, ScaledToZero (nothing consumes
	// the queue; Ready=True ScaledToZero). Everything the operator can
	// make ready is.
	harness := h != nil && (h.Status == metav1.ConditionTrue || h.Reason == hcpv1alpha1.ReasonScaledToZero)
	return topology && harness, topology
}

// operatorPhase creates n Callees and n Callers and waits until every one
// has converged: status for its generation, TopologyReady=True, and
// HarnessReady True or ScaledToZero. It returns the time to that and the
// time until all were TopologyReady.
func (b *bed) operatorPhase(ctx context.Context) (time.Duration, time.Duration) {
	t := b.t
	t.Logf("operator: creating %d Callees and %d Callers", b.s.n, b.s.n)
	start := time.Now()
	err := forBoth(b.s.n, func(i int) error {
		return b.cl.Create(ctx, newCallee(b.op, objectName(i), b.opVhost))
	}, func(i int) error {
		return b.cl.Create(ctx, newCaller(b.op, objectName(i), b.opVhost))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("operator: %d objects created in %s", 2*b.s.n, time.Since(start).Round(100*time.Millisecond))
	var topoAt time.Duration
	d := b.waitFor(ctx, "operator: every Callee and Caller converged", start, func() (bool, string) {
		var ready, topo int
		callees := &hcpv1alpha1.CalleeList{}
		callers := &hcpv1alpha1.CallerList{}
		if err := b.cache.List(ctx, callees, client.InNamespace(b.op), readOnly); err != nil {
			t.Fatal(err)
		}
		if err := b.cache.List(ctx, callers, client.InNamespace(b.op), readOnly); err != nil {
			t.Fatal(err)
		}
		var example string
		for i := range callees.Items {
			c := &callees.Items[i]
			r, tp := converged(c.Generation, c.Status.ObservedGeneration, c.Status.Conditions)
			ready, topo = ready+btoi(r), topo+btoi(tp)
			if !r && example == "" {
				example = describeStatus("Callee", c.Name, c.Status.Conditions)
			}
		}
		for i := range callers.Items {
			c := &callers.Items[i]
			r, tp := converged(c.Generation, c.Status.ObservedGeneration, c.Status.Conditions)
			ready, topo = ready+btoi(r), topo+btoi(tp)
			if !r && example == "" {
				example = describeStatus("Caller", c.Name, c.Status.Conditions)
			}
		}
		if topoAt == 0 && topo == 2*b.s.n {
			topoAt = time.Since(start)
		}
		desc := fmt.Sprintf("%d/%d converged, %d TopologyReady", ready, 2*b.s.n, topo)
		if example != "" {
			desc += "; e.g. " + example
		}
		return ready == 2*b.s.n, desc
	})
	if topoAt == 0 {
		topoAt = d
	}
	return d, topoAt
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func describeStatus(kind, name string, conds []metav1.Condition) string {
	c := meta.FindStatusCondition(conds, hcpv1alpha1.ConditionReady)
	if c == nil {
		return kind + " " + name + ": no status yet"
	}
	msg := c.Message
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	return fmt.Sprintf("%s %s: Ready=%s %s: %s", kind, name, c.Status, c.Reason, msg)
}

// waitQuiet waits until the harness controllers have nothing queued or in
// progress for three scrapes in a row.
func (b *bed) waitQuiet(ctx context.Context, m *manager) error {
	quiet := 0
	b.waitFor(ctx, "manager: work queues empty", time.Now(), func() (bool, string) {
		s, err := m.scrape()
		if err != nil {
			return false, err.Error()
		}
		if q := s.queued(); q > 0 {
			quiet = 0
			return false, fmt.Sprintf("%v queued or in progress", q)
		}
		quiet++
		return quiet >= 3, "nothing queued or in progress"
	})
	return nil
}

// serializedSize is the JSON size of what the manager holds for the run
// (the Callees and Callers, their children, the shared objects and the
// connection Secret), as the API server serves it and without
// managedFields (the manager's cache drops them).
func (b *bed) serializedSize(ctx context.Context) (full, trimmed int64) {
	add := func(l client.ObjectList) {
		_ = meta.EachListItem(l, func(o runtime.Object) error {
			raw, err := json.Marshal(o)
			if err != nil {
				b.t.Fatal(err)
			}
			full += int64(len(raw))
			o.(client.Object).SetManagedFields(nil)
			raw, _ = json.Marshal(o)
			trimmed += int64(len(raw))
			return nil
		})
	}
	for _, ns := range []string{b.op, b.home} {
		for _, k := range ownKinds {
			l := k.list()
			if err := b.cl.List(ctx, l, client.InNamespace(ns)); err != nil {
				b.t.Fatal(err)
			}
			add(l)
		}
		for _, k := range childKinds {
			l := k.list()
			if err := b.cl.List(ctx, l, client.InNamespace(ns), managedBy); err != nil {
				b.t.Fatal(err)
			}
			add(l)
		}
	}
	conn := &corev1.SecretList{}
	if err := b.cl.List(ctx, conn, client.InNamespace(b.home)); err != nil {
		b.t.Fatal(err)
	}
	for i := range conn.Items {
		if conn.Items[i].Name == connSecretName {
			add(&corev1.SecretList{Items: conn.Items[i : i+1]})
		}
	}
	return full, trimmed
}

// cleanupOperator deletes every Callee and Caller and times it until
// their children, the shared objects, and everything on the broker are
// gone.
func (b *bed) cleanupOperator(ctx context.Context) (cleanup, leftover) {
	t := b.t
	start := time.Now()
	for _, o := range []client.Object{&hcpv1alpha1.Callee{}, &hcpv1alpha1.Caller{}} {
		if err := b.cl.DeleteAllOf(ctx, o, client.InNamespace(b.op)); err != nil {
			t.Fatal(err)
		}
	}
	// The finalizers' part: every Callee and Caller gone, which each
	// lets go only once its topology objects (and, for the last user of
	// the vhost, the shared ones) are gone. The rest is the garbage
	// collector's.
	r := b.waitFor(ctx, "operator cleanup: Callees, Callers and topology objects gone", start, func() (bool, string) {
		n := 0
		for _, l := range []client.ObjectList{&hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}} {
			if err := b.cache.List(ctx, l, client.InNamespace(b.op), readOnly); err != nil {
				t.Fatal(err)
			}
			n += meta.LenList(l)
		}
		c := b.count(ctx, b.op, b.home)
		for _, k := range topologyKindNames {
			n += c[k]
		}
		return n == 0, fmt.Sprintf("%d left", n)
	})
	d, left := b.waitGone(ctx, "operator cleanup", start, b.opVhost, b.op, b.home)
	return cleanup{topology: r, all: d}, left
}

// topologyKindNames are the children the topology operator deletes on the
// broker.
var topologyKindNames = []string{"Vhost", "Exchange", "Queue", "Binding", "User", "Permission", "Policy"}

// cleanup is how long a cleanup took: until the topology objects were gone
// (and, for the operator, every Callee and Caller), and until everything
// was (the rest by garbage collection for the operator).
type cleanup struct{ topology, all time.Duration }
