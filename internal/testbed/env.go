package testbed

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Options configures Start.
type Options struct {
	// CRDDirs are more directories of CRD manifests to install, besides the
	// project's config/crd/bases and the topology operator's CRDs.
	CRDDirs []string
	// WithoutTopologyCRDs skips the messaging-topology-operator and
	// RabbitmqCluster CRDs, for suites that need only the project's own.
	WithoutTopologyCRDs bool
	// AddToScheme registers more types (the project's api/v1alpha1, say) in
	// Env.Scheme, which the client uses. Core types and the topology
	// operator's v1beta1 types are always registered.
	AddToScheme []func(*runtime.Scheme) error
}

// Env is a running envtest control plane.
type Env struct {
	Environment *envtest.Environment
	// Config is envtest's admin config; Client is an uncached client on it.
	Config *rest.Config
	Scheme *runtime.Scheme
	Client client.Client
	// Kubeconfig is the path of a kubeconfig file for subprocesses (the
	// topology operator, the manager, kubectl): a system:masters user.
	Kubeconfig string
	// AssetsDir holds kube-apiserver, etcd and kubectl.
	AssetsDir string

	dir string
}

var k8sAssets once[string]

// KubebuilderAssets returns the directory holding kube-apiserver, etcd and
// kubectl: $KUBEBUILDER_ASSETS when set, else what hack/testbed-k8s.sh
// prints (it builds them from Go modules when missing: ~9 min cold).
func KubebuilderAssets(ctx context.Context) (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d, nil
	}
	return k8sAssets.do(func() (string, error) {
		// Not ctx: the result is shared by the whole process.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Minute)
		defer cancel()
		var dir string
		err := withFileLock(filepath.Join(cacheDir(), "testbed-k8s.lock"), func() error {
			var err error
			dir, _, err = runScript(ctx, "testbed-k8s.sh")
			return err
		})
		return dir, err
	})
}

var topologyCRDs once[[]string]

// TopologyCRDDirs returns the directories of the messaging-topology-operator
// CRDs and of cluster-operator's RabbitmqCluster CRD in the module cache
// (hack/testbed-mto.sh crds).
func TopologyCRDDirs(ctx context.Context) ([]string, error) {
	return topologyCRDs.do(func() ([]string, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		_, out, err := runScript(ctx, "testbed-mto.sh", "crds")
		if err != nil {
			return nil, err
		}
		return strings.Fields(out), nil
	})
}

// NewScheme returns a scheme with the core types and the topology operator's
// v1beta1 types, plus whatever add registers.
func NewScheme(add ...func(*runtime.Scheme) error) (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, f := range append([]func(*runtime.Scheme) error{clientgoscheme.AddToScheme, topologyv1beta1.AddToScheme}, add...) {
		if err := f(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Start starts envtest with the CRDs installed. Call Stop when done. For use
// in TestMain; tests use StartEnv.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	assets, err := KubebuilderAssets(ctx)
	if err != nil {
		return nil, fmt.Errorf("testbed: kube-apiserver and etcd binaries: %w", err)
	}
	scheme, err := NewScheme(opts.AddToScheme...)
	if err != nil {
		return nil, err
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	var crdDirs []string
	// Ours may not exist yet (nothing generated): tolerated.
	if ours := filepath.Join(root, "config", "crd", "bases"); isDir(ours) {
		crdDirs = append(crdDirs, ours)
	}
	if !opts.WithoutTopologyCRDs {
		dirs, err := TopologyCRDDirs(ctx)
		if err != nil {
			return nil, fmt.Errorf("testbed: topology operator CRDs: %w", err)
		}
		crdDirs = append(crdDirs, dirs...)
	}
	for _, d := range opts.CRDDirs {
		if !isDir(d) {
			return nil, fmt.Errorf("testbed: CRD directory %s does not exist", d)
		}
	}
	crdDirs = append(crdDirs, opts.CRDDirs...)

	e := &Env{
		Environment: &envtest.Environment{
			BinaryAssetsDirectory: assets,
			CRDDirectoryPaths:     crdDirs,
			ErrorIfCRDPathMissing: true, // every path was checked above
			Scheme:                scheme,
		},
		Scheme:    scheme,
		AssetsDir: assets,
	}
	if e.dir, err = os.MkdirTemp("", "hcp-testbed-env-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = e.Stop()
		}
	}()
	if e.Config, err = e.Environment.Start(); err != nil {
		return nil, fmt.Errorf("testbed: start envtest (assets %s): %w", assets, err)
	}
	if err := waitForAggregatedDiscovery(ctx, e.Config, e.Environment.CRDs); err != nil {
		return nil, err
	}
	if e.Client, err = client.New(e.Config, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	user, err := e.Environment.AddUser(envtest.User{Name: "hcp-testbed-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("testbed: add kubeconfig user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	e.Kubeconfig = filepath.Join(e.dir, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, kc, 0o600); err != nil {
		return nil, err
	}
	return e, nil
}

// waitForAggregatedDiscovery waits until every installed CRD's resources are
// in the API server's aggregated discovery document. envtest waits only for
// the per-group-version endpoints, and the API server updates the aggregated
// document asynchronously; controller-runtime's REST mapper (the topology
// operator's, a manager's) loads that document once, and a kind missing from
// it fails controller setup with "no matches for kind".
func waitForAggregatedDiscovery(ctx context.Context, cfg *rest.Config, crds []*apiextensionsv1.CustomResourceDefinition) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	return Poll(ctx, 30*time.Second, func(context.Context) error {
		_, byGV, _, err := dc.GroupsAndMaybeResources()
		if err != nil {
			return err
		}
		if byGV == nil {
			return nil // the server has no aggregated discovery: nothing to wait for
		}
		for _, crd := range crds {
			for _, v := range crd.Spec.Versions {
				if !v.Served {
					continue
				}
				gv := schema.GroupVersion{Group: crd.Spec.Group, Version: v.Name}
				found := false
				if rl := byGV[gv]; rl != nil {
					found = slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Name == crd.Spec.Names.Plural })
				}
				if !found {
					return fmt.Errorf("%s in %s not yet in aggregated discovery", crd.Spec.Names.Plural, gv)
				}
			}
		}
		return nil
	})
}

// Stop stops the control plane and removes the kubeconfig.
func (e *Env) Stop() error {
	var errs []error
	if e.Config != nil {
		errs = append(errs, e.Environment.Stop())
	}
	if e.dir != "" {
		errs = append(errs, os.RemoveAll(e.dir))
	}
	return errors.Join(errs...)
}

// StartEnv starts envtest for one test and stops it when the test ends.
func StartEnv(t testing.TB, opts Options) *Env {
	t.Helper()
	start := time.Now()
	e, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("testbed: envtest up in %s (kubeconfig %s)", time.Since(start).Round(time.Millisecond), e.Kubeconfig)
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("testbed: stop envtest: %v", err)
		}
	})
	return e
}

// CreateNamespace creates a namespace named prefix plus a random suffix.
// envtest runs no namespace controller, so namespaces are never really
// deleted; unique names keep tests apart instead.
func (e *Env) CreateNamespace(t testing.TB, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: RandomName(prefix)}}
	if err := e.Client.Create(t.Context(), ns); err != nil {
		t.Fatalf("testbed: create namespace: %v", err)
	}
	return ns.Name
}

// RandomName returns prefix followed by six random lowercase hex digits.
func RandomName(prefix string) string {
	return fmt.Sprintf("%s%06x", prefix, rand.Uint32()&0xffffff)
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
