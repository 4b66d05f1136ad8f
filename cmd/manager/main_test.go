package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// TestManager runs the manager as cmd/manager does, with the arguments of
// config/manager/manager.yaml, against a real API server, changing only
// its ports and its Lease (name, namespace, duration): it takes the Lease
// it was told to for as long as it was told, serves /readyz and metrics,
// and releases the Lease when it stops.
func TestManager(t *testing.T) {
	args := kustomizeArgs(t)
	cfg := controller.DefaultManagerConfig()
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	cfg.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("config/manager's arguments %v: %v", args, err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config/manager's arguments %v: %v", args, err)
	}
	if !cfg.LeaderElect {
		t.Fatalf("config/manager runs without leader election: %v", args)
	}

	env := testbed.StartEnv(t, testbed.Options{AddToScheme: []func(*runtime.Scheme) error{hcpv1alpha1.AddToScheme}})
	ns := env.CreateNamespace(t, "manager-")
	addrs, err := testbed.FreeAddrs(2)
	if err != nil {
		t.Fatal(err)
	}
	probes, metrics := addrs[0], addrs[1]
	const leaseName = "hcp-test.hcp.io"
	if err := fs.Parse([]string{
		"--leader-election-namespace=" + ns, "--leader-election-id=" + leaseName,
		"--leader-election-lease-duration=37s", "--leader-election-renew-deadline=20s",
		"--health-probe-bind-address=" + probes, "--metrics-bind-address=" + metrics, "--metrics-secure=false",
	}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}

	var log syncBuffer
	ctrl.SetLogger(zap.New(zap.WriteTo(&log), zap.UseDevMode(true)))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("manager log:\n%s", log.String())
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx, env.Config, cfg) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return errors.New("the manager did not stop within 30s")
		}
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})

	lease := &coordinationv1.Lease{}
	testbed.Eventually(t, time.Minute, "the manager holds the Lease it was told to", func(ctx context.Context) error {
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("the manager stopped: %v", err)
		default:
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: leaseName}, lease); err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return errors.New("no holder")
		}
		return nil
	})
	if d := lease.Spec.LeaseDurationSeconds; d == nil || *d != 37 {
		t.Errorf("Lease duration %v s, want 37 (--leader-election-lease-duration)", d)
	}
	testbed.Eventually(t, 30*time.Second, "/readyz answers 200", func(ctx context.Context) error {
		_, err := httpGet(ctx, "http://"+probes+"/readyz")
		return err
	})
	testbed.Eventually(t, 30*time.Second, "the metrics say this replica leads", func(ctx context.Context) error {
		body, err := httpGet(ctx, "http://"+metrics+"/metrics")
		if err != nil {
			return err
		}
		if want := `leader_election_master_status{name="` + leaseName + `"} 1`; !strings.Contains(body, want) {
			return fmt.Errorf("no %s", want)
		}
		return nil
	})

	if err := stop(); err != nil {
		t.Fatalf("the manager stopped with %v", err)
	}
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(lease), lease); err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("the Lease is still held by %q after the manager stopped: the next leader waits out the lease", *h)
	}
}

// kustomizeArgs are the manager container's arguments in
// config/manager/manager.yaml.
func kustomizeArgs(t *testing.T) []string {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "config", "manager", "manager.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for doc := range strings.SplitSeq(string(raw), "\n---\n") {
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatal(err)
		}
		if d.Kind != "Deployment" {
			continue
		}
		i := slices.IndexFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == "manager" })
		if i < 0 {
			t.Fatal("config/manager/manager.yaml: no manager container")
		}
		return d.Spec.Template.Spec.Containers[i].Args
	}
	t.Fatal("config/manager/manager.yaml: no Deployment")
	return nil
}

func httpGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), nil
}

// syncBuffer is the manager's log, written from its goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
