//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// Names of one run. Everything the suite creates is per run (namespaces,
// the vhost) except the release name, whose cluster-scoped objects are
// deleted at the end.
const (
	release      = "hcp-e2e"
	fieldManager = "hcp-e2e"
	// chartDir is charts/hcp-operator, relative to the repository root.
	chartDir = "charts/hcp-operator"
)

// Bounds of the waits.
const (
	installTimeout = 3 * time.Minute
	readyTimeout   = 3 * time.Minute
	sessionTimeout = 2 * time.Minute
	deleteTimeout  = 2 * time.Minute
)

// suite is one run against one cluster.
type suite struct {
	cfg    *config
	scheme *runtime.Scheme
	// c is an uncached client: every read goes to the API server.
	c      client.WithWatch
	broker *testbed.Broker

	// ns holds the samples; opNS the chart's release (the manager); vhost
	// the samples' topology on the broker.
	id, ns, opNS, vhost string
	// rendered is the chart as applied.
	rendered []*unstructured.Unstructured
	// paused are other installs' managers scaled to zero for the run.
	paused []pausedManager
}

type pausedManager struct {
	namespace, name string
	replicas        int32
}

func newSuite(t *testing.T) *suite {
	t.Helper()
	noteFailure(t, nil)
	scheme, err := testbed.NewScheme(hcpv1alpha1.AddToScheme)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatalf("KUBECONFIG %s: %v", os.Getenv("KUBECONFIG"), err)
	}
	rc.QPS, rc.Burst = 50, 100
	c, err := client.NewWithWatch(rc, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	broker, err := testbed.NewBroker(cfg.managementURL, cfg.username, cfg.password)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := broker.API.Overview(); err != nil {
		t.Fatalf("the broker's management API at %s does not answer (HCP_E2E_MANAGEMENT_URL): %v", cfg.managementURL, err)
	}
	id := testbed.RandomName("")
	return &suite{
		cfg: &cfg, scheme: scheme, c: c, broker: broker,
		id: id, ns: "hcp-e2e-" + id, opNS: "hcp-e2e-" + id + "-system", vhost: "/hcp-e2e-" + id,
	}
}

// kubectl runs kubectl (the stack's, on the local stack) with stdin.
func (s *suite) kubectl(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, s.cfg.kubectl, args...)
	cmd.Env = os.Environ()
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

// apply applies manifests server-side under the suite's field manager.
func (s *suite) apply(ctx context.Context, manifests []byte, extra ...string) (string, error) {
	args := append([]string{"apply", "--server-side", "--force-conflicts", "--field-manager=" + fieldManager, "-f", "-"}, extra...)
	return s.kubectl(ctx, manifests, args...)
}

// renderChart is `helm template` of the chart with the default broker
// connection Secret created from the broker settings, and the manager
// watching the run's namespace only (so it leaves any other install's
// objects alone, and gets Roles, not ClusterRoles, for them).
func (s *suite) renderChart(ctx context.Context) ([]byte, []string, error) {
	args := append([]string{"template", release, filepath.Join(s.cfg.root, chartDir), "--namespace", s.opNS, "--include-crds"}, s.helmValues()...)
	cmd := exec.CommandContext(ctx, s.cfg.helm, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return nil, args, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.Bytes(), args, nil
}

// helmValues are the chart's values of a run (renderChart's, and both
// releases of TestUpgrade): the default broker's connection Secret created
// by the chart, the manager watching the run's namespace, and
// HCP_E2E_HELM_ARGS.
func (s *suite) helmValues() []string {
	return append([]string{
		"--set", "defaultBroker.secret.create=true",
		"--set-string", "defaultBroker.secret.uri=" + s.cfg.brokerURI,
		"--set-string", "defaultBroker.secret.username=" + s.cfg.username,
		"--set-string", "defaultBroker.secret.password=" + s.cfg.password,
		// A cluster's nodes are comma-separated, and --set splits at commas.
		"--set-string", "defaultBroker.secret.amqpURL=" + strings.ReplaceAll(s.cfg.amqpURL, ",", `\,`),
		"--set", "watchNamespaces={" + s.ns + "}",
	}, s.cfg.helmArgs...)
}

func decodeManifests(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, err
		}
		if len(u.Object) == 0 {
			continue
		}
		objs = append(objs, u)
	}
	return objs, nil
}

// install renders the chart, applies it server-side and waits until the
// manager Deployment is available. It registers the teardown (the
// namespaces, the release's cluster-scoped objects, the vhost) first, so
// that it runs last.
func (s *suite) install(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	defer timed("install: helm template | kubectl apply, manager available")()

	// Cleanups run last-registered first: the paused managers come back
	// after the teardown, so they never see this run's objects.
	t.Cleanup(func() { s.resumeOtherManagers(t) })
	s.registerTeardown(t)
	for _, ns := range []string{s.ns, s.opNS} {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"app.kubernetes.io/part-of": "hcp-e2e"}}}
		if err := s.c.Create(ctx, obj); err != nil {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
	}
	s.pauseOtherManagers(t)

	manifests, args, err := s.renderChart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.rendered, err = decodeManifests(manifests); err != nil {
		t.Fatalf("decode the rendered chart: %v", err)
	}
	kinds := make([]string, 0, len(s.rendered))
	var crds []string
	for _, o := range s.rendered {
		kinds = append(kinds, o.GetKind()+"/"+o.GetName())
		if o.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, "crd/"+o.GetName())
		}
	}
	t.Logf("helm %s\n  → %d objects: %s", strings.Join(redact(args), " "), len(s.rendered), strings.Join(kinds, ", "))
	if len(crds) != 4 {
		t.Errorf("the chart rendered %d CRDs (%v), want the four of hcp.io", len(crds), crds)
	}
	out, err := s.apply(ctx, manifests)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl apply --server-side:\n%s", indent(out))
	if out, err := s.kubectl(ctx, nil, append([]string{"wait", "--for=condition=Established", "--timeout=60s"}, crds...)...); err != nil {
		t.Fatalf("CRDs not established: %v\n%s", err, out)
	}

	deploy := &appsv1.Deployment{}
	key := client.ObjectKey{Namespace: s.opNS, Name: release + "-hcp-operator-controller-manager"}
	eventually(t, installTimeout, "the manager Deployment available", func(ctx context.Context) error {
		if err := s.c.Get(ctx, key, deploy); err != nil {
			return err
		}
		if deploy.Status.ObservedGeneration < deploy.Generation || deploy.Status.AvailableReplicas < 1 || deploy.Status.UpdatedReplicas < 1 {
			return fmt.Errorf("deployment %s: %s", key, s.podsSummary(ctx, s.opNS))
		}
		return nil
	})
	pods := &corev1.PodList{}
	if err := s.c.List(ctx, pods, client.InNamespace(s.opNS)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		t.Logf("manager pod %s on %s, %s, image %s", p.Name, p.Spec.NodeName, p.Status.Phase, p.Spec.Containers[0].Image)
	}
}

func redact(args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if strings.HasPrefix(a, "defaultBroker.secret.password=") {
			out[i] = "defaultBroker.secret.password=<redacted>"
		}
	}
	return out
}

// podsSummary is one line per pod: phase, readiness, restarts, waiting
// reasons. For the error of a wait.
func (s *suite) podsSummary(ctx context.Context, ns string) string {
	pods := &corev1.PodList{}
	if err := s.c.List(ctx, pods, client.InNamespace(ns)); err != nil {
		return err.Error()
	}
	if len(pods.Items) == 0 {
		return "no pods in " + ns
	}
	var lines []string
	for _, p := range pods.Items {
		l := fmt.Sprintf("pod %s %s", p.Name, p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			l += fmt.Sprintf(" [%s ready=%t restarts=%d", cs.Name, cs.Ready, cs.RestartCount)
			if w := cs.State.Waiting; w != nil {
				l += " waiting " + w.Reason + ": " + w.Message
			}
			if lt := cs.LastTerminationState.Terminated; lt != nil {
				l += fmt.Sprintf(" last exit %d %s %s", lt.ExitCode, lt.Reason, strings.TrimSpace(lt.Message))
			}
			l += "]"
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "; ")
}

// pauseOtherManagers deals with hcp-operator managers of other installs
// (the demo's, typically): they watch every namespace, so they would
// reconcile this run's objects too. HCP_E2E_OTHER_MANAGERS=pause (default)
// scales them to zero until the run ends, fail refuses to run, ignore
// leaves them be (only for managers known not to watch this namespace).
func (s *suite) pauseOtherManagers(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	list := &appsv1.DeploymentList{}
	if err := s.c.List(ctx, list); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		d := &list.Items[i]
		if d.Namespace == s.opNS || !isManager(d) || d.Spec.Replicas == nil || *d.Spec.Replicas == 0 {
			continue
		}
		ref := d.Namespace + "/" + d.Name
		switch s.cfg.otherManagers {
		case "ignore":
			t.Logf("another hcp-operator manager runs (%s); HCP_E2E_OTHER_MANAGERS=ignore leaves it running", ref)
			continue
		case "fail":
			t.Fatalf("another hcp-operator manager runs (%s) and would reconcile this run's objects too; stop it, or set HCP_E2E_OTHER_MANAGERS=pause", ref)
		case "pause":
		default:
			t.Fatalf("HCP_E2E_OTHER_MANAGERS=%q: want pause, fail or ignore", s.cfg.otherManagers)
		}
		replicas := *d.Spec.Replicas
		t.Logf("another hcp-operator manager runs (%s, %d replicas); it watches every namespace, so it is scaled to 0 until the run ends (HCP_E2E_OTHER_MANAGERS)", ref, replicas)
		if _, err := s.kubectl(ctx, nil, "scale", "-n", d.Namespace, "deployment/"+d.Name, "--replicas=0"); err != nil {
			t.Fatal(err)
		}
		s.paused = append(s.paused, pausedManager{namespace: d.Namespace, name: d.Name, replicas: replicas})
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "the paused manager's pods gone", func(ctx context.Context) error {
			pods := &corev1.PodList{}
			if err := s.c.List(ctx, pods, client.InNamespace(d.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
				return err
			}
			if n := len(pods.Items); n > 0 {
				return fmt.Errorf("%d pods of %s left", n, ref)
			}
			return nil
		})
	}
}

// resumeOtherManagers scales the paused managers back.
func (s *suite) resumeOtherManagers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range s.paused {
		if _, err := s.kubectl(ctx, nil, "scale", "-n", p.namespace, "deployment/"+p.name, fmt.Sprintf("--replicas=%d", p.replicas)); err != nil {
			if strings.Contains(err.Error(), "(NotFound)") {
				// Deleted meanwhile (its namespace went): nothing to resume.
				t.Logf("%s/%s is gone; not resumed", p.namespace, p.name)
				continue
			}
			t.Errorf("resume %s/%s with %d replicas: %v", p.namespace, p.name, p.replicas, err)
			continue
		}
		t.Logf("resumed %s/%s with %d replicas", p.namespace, p.name, p.replicas)
	}
}

// isManager: a container runs the hcp-operator manager (its flags say so;
// the image may come from any registry).
func isManager(d *appsv1.Deployment) bool {
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, a := range append(slices.Clone(c.Command), c.Args...) {
			if strings.HasPrefix(a, "--sidecar-image") || strings.HasPrefix(a, "--default-connection-secret") {
				return true
			}
		}
	}
	return false
}

// registerTeardown removes what the run created, unless HCP_E2E_KEEP=1:
// the samples' Callees and Callers first, while the manager still runs and
// may still write them (its Role in a watched namespace goes with the
// namespace, and with it the right to release their finalizers), then the
// samples' namespace, then the release's namespace and cluster-scoped
// objects (the CRDs stay, as the chart keeps them on uninstall), then the
// vhost if anything left it behind.
func (s *suite) registerTeardown(t *testing.T) {
	t.Cleanup(func() {
		if s.cfg.keep {
			t.Logf("HCP_E2E_KEEP=1: keeping namespaces %s and %s, vhost %s and the release's cluster-scoped objects", s.ns, s.opNS, s.vhost)
			return
		}
		defer timed("teardown")()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		s.deleteHCPObjects(t, ctx)
		// Nothing left in the samples' namespace needs the manager now.
		var wg sync.WaitGroup
		for _, ns := range []string{s.ns, s.opNS} {
			wg.Go(func() { s.deleteNamespace(t, ctx, ns) })
		}
		wg.Wait()
		for _, o := range s.rendered {
			if o.GetNamespace() != "" || o.GetKind() == "CustomResourceDefinition" || o.GetKind() == "Namespace" {
				continue
			}
			if err := s.c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("teardown: delete %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
		if _, err := s.broker.API.GetVhost(s.vhost); err == nil {
			t.Logf("teardown: vhost %s still on the broker; deleting it", s.vhost)
			if err := s.broker.DeleteVhost(s.vhost); err != nil {
				t.Errorf("teardown: delete vhost %s: %v", s.vhost, err)
			}
		}
	})
}

// deleteHCPObjects deletes the run's Callees, Callers and
// CapabilityPolicies and waits until the manager has finalized them.
func (s *suite) deleteHCPObjects(t *testing.T, ctx context.Context) {
	if out, err := s.kubectl(ctx, nil, "delete", "callees,callers,capabilitypolicies", "--all", "-n", s.ns, "--wait=false"); err != nil {
		t.Logf("teardown: %v", err)
		return
	} else if strings.TrimSpace(out) != "" {
		t.Logf("teardown: kubectl delete callees,callers,capabilitypolicies --all:\n%s", indent(out))
	}
	err := poll(ctx, deleteTimeout, func(ctx context.Context) error {
		callees, callers := &hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}
		if err := s.c.List(ctx, callees, client.InNamespace(s.ns)); err != nil {
			return err
		}
		if err := s.c.List(ctx, callers, client.InNamespace(s.ns)); err != nil {
			return err
		}
		if n := len(callees.Items) + len(callers.Items); n > 0 {
			return fmt.Errorf("%d Callees and Callers not finalized yet", n)
		}
		return nil
	})
	if err != nil {
		t.Logf("teardown: %v", err)
	}
}

// deleteNamespace deletes ns and waits until it is gone. Objects whose
// finalizers keep it (a manager that died, say) are reported and released,
// so no run leaves a namespace stuck in Terminating.
func (s *suite) deleteNamespace(t *testing.T, ctx context.Context, ns string) {
	obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if err := s.c.Delete(ctx, obj); err != nil {
		if !apierrors.IsNotFound(err) {
			t.Errorf("teardown: delete namespace %s: %v", ns, err)
		}
		return
	}
	err := poll(ctx, deleteTimeout, func(ctx context.Context) error {
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(obj), obj); apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("namespace %s still exists: %v", ns, obj.Status.Conditions)
	})
	if err == nil {
		return
	}
	t.Logf("teardown: %v; releasing the finalizers of the hcp.io objects left", err)
	for _, l := range []client.ObjectList{&hcpv1alpha1.CalleeList{}, &hcpv1alpha1.CallerList{}, &hcpv1alpha1.HCPSessionList{}} {
		if err := s.c.List(ctx, l, client.InNamespace(ns)); err != nil {
			continue
		}
		_ = forEach(l, func(o client.Object) error {
			t.Logf("teardown: %T %s/%s has finalizers %v", o, ns, o.GetName(), o.GetFinalizers())
			return s.c.Patch(ctx, o, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
		})
	}
}

func forEach(l client.ObjectList, f func(client.Object) error) error {
	var errs []error
	switch l := l.(type) {
	case *hcpv1alpha1.CalleeList:
		for i := range l.Items {
			errs = append(errs, f(&l.Items[i]))
		}
	case *hcpv1alpha1.CallerList:
		for i := range l.Items {
			errs = append(errs, f(&l.Items[i]))
		}
	case *hcpv1alpha1.HCPSessionList:
		for i := range l.Items {
			errs = append(errs, f(&l.Items[i]))
		}
	}
	return errors.Join(errs...)
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "    (nothing)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
