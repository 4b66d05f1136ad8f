package controller

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// The envtest suite: one API server (with the project's and the topology
// operator's CRDs) and one manager running every reconciler, as in
// production, for all tests of the package. envtest runs no
// kube-controller-manager (no garbage collection, no Deployment
// controller) and no topology operator: tests assert on what the operator
// writes, and play those controllers' part by writing status where needed.
var (
	// k8sClient is uncached: assertions see the API server, not the
	// manager's cache.
	k8sClient client.Client
	testEnv   *testbed.Env
	// managerLog receives the manager's log; failing tests print the lines
	// about their namespace.
	managerLog string
	// suiteManager is the manager under test, built by ManagerConfig as
	// cmd/manager builds it; tests may look into its cache.
	suiteManager ctrl.Manager
	// suiteManagerConfig is what it was built from.
	suiteManagerConfig ManagerConfig
)

// The manager's default broker: a connection Secret in suiteBrokerNamespace
// that every namespace may use.
const (
	suiteBrokerNamespace = "hcp-system"
	suiteBrokerSecret    = "rmq-default"
	suiteSidecarImage    = "ghcr.io/hcp-io/hcp-operator:test"
)

// suiteFirstStatusWait is the suite manager's Options.FirstStatusWait:
// shorter than production's, so that tests see a first rollout's wait
// within seconds (the writebudget package runs production's).
const suiteFirstStatusWait = 2 * time.Second

func suiteOptions() Options {
	return Options{
		DefaultBroker:   &resource.DefaultBroker{Namespace: suiteBrokerNamespace, Name: suiteBrokerSecret},
		SidecarImage:    suiteSidecarImage,
		FirstStatusWait: suiteFirstStatusWait,
	}
}

// newSuiteManagerConfig is the suite manager's configuration: production's
// defaults, but no probes, and metrics on a free local port, served as in
// production (HTTPS, every scrape authenticated and authorized). The two
// controllers whose objects stand alone run more than one worker, so that
// TestManagerMetrics can tell the configured concurrency from the default.
func newSuiteManagerConfig() (ManagerConfig, error) {
	cfg := DefaultManagerConfig()
	cfg.Options = suiteOptions()
	cfg.HealthProbeAddr = "0"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return cfg, err
	}
	cfg.MetricsAddr = l.Addr().String()
	if err := l.Close(); err != nil {
		return cfg, err
	}
	cfg.MaxConcurrentReconciles[ControllerCapabilityPolicy] = 2
	cfg.MaxConcurrentReconciles[ControllerHCPSession] = 3
	return cfg, cfg.Validate()
}

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env, err := testbed.Start(ctx, testbed.Options{AddToScheme: []func(*runtime.Scheme) error{hcpv1alpha1.AddToScheme}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop envtest:", err)
		}
	}()
	testEnv, k8sClient = env, env.Client

	dir, err := os.MkdirTemp("", "hcp-controller-suite-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if os.Getenv("HCP_KEEP_MANAGER_LOG") == "" {
		defer func() { _ = os.RemoveAll(dir) }()
	} else {
		fmt.Fprintln(os.Stderr, "manager log:", filepath.Join(dir, "manager.log"))
	}
	managerLog = filepath.Join(dir, "manager.log")
	logFile, err := os.Create(managerLog)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = logFile.Close() }()
	ctrl.SetLogger(zap.New(zap.WriteTo(logFile), zap.UseDevMode(true)))

	if err := createSuiteBroker(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	managerConfig, err := restrictedManagerConfig(ctx, env)
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager RBAC:", err)
		return 1
	}
	cfg, err := newSuiteManagerConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager config:", err)
		return 1
	}
	mgr, err := ctrl.NewManager(cfg.RESTConfig(managerConfig), cfg.ManagerOptions(env.Scheme))
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		return 1
	}
	suiteManager, suiteManagerConfig = mgr, cfg
	if err := Setup(ctx, mgr, cfg.Options); err != nil {
		fmt.Fprintln(os.Stderr, "setup:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	code := m.Run()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	case <-time.After(30 * time.Second):
		fmt.Fprintln(os.Stderr, "manager did not stop within 30s")
	}
	return code
}

// managerUser is who the suite's manager runs as.
const managerUser = "hcp-operator-manager"

// restrictedManagerConfig returns a config for a user bound to exactly the
// ClusterRole generated from the kubebuilder markers (config/rbac/role.yaml),
// so that every envtest test also proves the manager needs nothing more,
// including for the Roles it grants to sidecars (Kubernetes refuses to let
// anyone grant permissions it does not hold), plus the ClusterRole that
// lets it check who scrapes its metrics (config/rbac/metrics_auth_role.yaml).
func restrictedManagerConfig(ctx context.Context, env *testbed.Env) (*rest.Config, error) {
	for _, r := range []struct{ file, name string }{
		{"role.yaml", managerUser},
		{"metrics_auth_role.yaml", managerUser + "-metrics-auth"},
	} {
		role, err := rbacFromRepo[*rbacv1.ClusterRole](r.file)
		if err != nil {
			return nil, err
		}
		role.Name = r.name
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: r.name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r.name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: managerUser}},
		}
		for _, o := range []client.Object{role, binding} {
			if err := k8sClient.Create(ctx, o); err != nil {
				return nil, err
			}
		}
	}
	// What the install ships beside the manager's own: the ClusterRole it
	// binds every callee sidecar to, under the manager's default name.
	sidecars, err := rbacFromRepo[*rbacv1.ClusterRole](calleeSidecarRoleFile)
	if err != nil {
		return nil, err
	}
	sidecars.Name = resource.DefaultCalleeSidecarClusterRole
	if err := k8sClient.Create(ctx, sidecars); err != nil {
		return nil, err
	}
	user, err := env.Environment.AddUser(envtest.User{Name: managerUser}, nil)
	if err != nil {
		return nil, err
	}
	return user.Config(), nil
}

// calleeSidecarRoleFile is the callee sidecars' ClusterRole in config/rbac
// (hack/sidecarrbac), named callee-sidecar before config/default's prefix.
const calleeSidecarRoleFile = "callee_sidecar_role.yaml"

// rbacFromRepo reads one of config/rbac's manifests.
func rbacFromRepo[T client.Object](file string) (T, error) {
	var obj T
	root, err := testbed.RepoRoot()
	if err != nil {
		return obj, err
	}
	raw, err := os.ReadFile(filepath.Join(root, "config", "rbac", file))
	if err != nil {
		return obj, err
	}
	obj = reflect.New(reflect.TypeFor[T]().Elem()).Interface().(T)
	if err := yaml.Unmarshal(raw, obj); err != nil {
		return obj, fmt.Errorf("config/rbac/%s: %w", file, err)
	}
	return obj, nil
}

// createSuiteBroker creates the default connection Secret. No broker runs
// in this suite: nothing connects to it.
func createSuiteBroker(ctx context.Context) error {
	if err := k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: suiteBrokerNamespace}}); err != nil {
		return err
	}
	return k8sClient.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: suiteBrokerSecret, Namespace: suiteBrokerNamespace,
			Labels:      map[string]string{resource.LabelTopologyOperator: "true"},
			Annotations: map[string]string{resource.AllowedNamespacesAnnotation: "*"},
		},
		StringData: map[string]string{"uri": "http://rabbitmq.hcp-system.svc:15672", "username": "admin", "password": "admin"},
	})
}

// newNamespace creates a namespace for one test and, when the test fails,
// prints the manager's log lines about it.
func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := testEnv.CreateNamespace(t, prefix)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("manager log lines mentioning %s:\n%s", ns, grepFile(managerLog, ns, 400))
		}
	})
	return ns
}

func grepFile(path, needle string, max int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), needle) {
			lines = append(lines, sc.Text())
		}
	}
	if len(lines) > max {
		lines = lines[len(lines)-max:]
	}
	return strings.Join(lines, "\n")
}
