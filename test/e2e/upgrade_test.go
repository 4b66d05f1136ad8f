//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
)

// TestUpgrade is docs/upgrades.md on the local stack: version N of the
// chart and of its binaries (HCP_UPGRADE_FROM, a git ref; default
// upgradeFrom) installed with `helm install`, the samples Ready, sessions
// streaming, then `helm upgrade` to the working tree's chart and binaries
// while they stream. Every session must end COMPLETED with nothing lost,
// duplicated or executed twice (measured as the chaos step measures a
// fault), and the CRDs must then be the working tree's, owned by the release
// and kept on uninstall.
//
// Version N's manager and hcp-sidecar are built from `git archive` of the
// ref into bin/upgrade-from/<commit> (kept: a second run reuses them) and
// packed into an image of a repository of their own, imported into the
// node, so the upgrade changes the manager's and the sidecars' image as a
// release would.
func TestUpgrade(t *testing.T) {
	if cfg.existing {
		t.Skip("TestUpgrade needs the local stack: version N's binaries become an image imported into its node")
	}
	ref := envOr("HCP_UPGRADE_FROM", upgradeFrom)
	prev := buildVersion(t, ref)
	s := newSuite(t)
	t.Logf("run %s: version N %s (%s), samples in %s, release %s in %s, vhost %s", s.id, ref, prev.commit[:12], s.ns, release, s.opNS, s.vhost)
	s.helmInstall(t, prev)
	s.dumpOnFailure(t)

	r := &samplesRun{suite: s, parent: t}
	if !t.Run("SamplesReady", r.samplesReady) {
		t.FailNow()
	}
	start := time.Now()
	res := r.sessionsAcrossUpgrade(t, s.helmUpgrade)
	record("upgrade: sessions across helm upgrade", time.Since(start))
	row := faultRow{fault: res.fault}
	row.add(1, res, true)
	t.Logf("sessions across the upgrade:\n%s", chaosTable([]faultRow{row}))
	s.crdsUpgraded(t)
	s.calleeRightsUpgraded(t)
}

const (
	// upgradeFrom is version N by default: the chart and binaries of
	// 2026-11-25, the last chart that shipped its CRDs in crds/.
	upgradeFrom = "ca9e768f1e845e1a5ed186e7dfa31bd3174ff134"
	// upgradeFromRepository is the image repository of version N's binaries
	// on the node; imageRepository the chart's default, the working tree's
	// build.
	upgradeFromRepository = "ghcr.io/hcp-io/hcp-operator-upgrade-from"
	imageRepository       = "ghcr.io/hcp-io/hcp-operator"
)

// upgradeSteps makes the sessions long enough (60 s) to stream through the
// whole upgrade: helm upgrade --wait, then the callee and caller pods
// rolling (about 20 s on the local stack).
const upgradeSteps = 240

// sessionsAcrossUpgrade runs chaosSessions sessions on a Callee with two
// replicas and upgrades while they stream; they are judged as a chaos
// fault's: every one must end COMPLETED, with no event lost, duplicated or
// executed twice. The caller pod rolls too, so what its old app received is
// joined to what the new one receives.
func (r *samplesRun) sessionsAcrossUpgrade(t *testing.T, upgrade func(*testing.T)) chaosResult {
	t.Helper()
	r.setCalleeReplicas(t, 2)
	task := defaultTask
	task.steps = upgradeSteps
	ids := r.streamingSessions(t, "upgrade", task)
	var old <-chan samplecaller.Snapshot
	if r.receiptLog == "" {
		old = r.recordUntilGone(t)
	}
	at := time.Now()
	t.Logf("upgrading while sessions %v stream", ids)
	upgrade(t)
	for _, id := range ids {
		hs, err := r.session(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if hs.Status.State.IsTerminal() {
			t.Fatalf("session %s was %s by the time helm upgrade returned: it did not run across the upgrade (raise upgradeSteps)", id, hs.Status.State)
		}
	}
	var before samplecaller.Snapshot
	if old != nil {
		before = <-old
	}
	r.refreshCaller(t)
	var snap samplecaller.Snapshot
	eventually(t, chaosTimeout, fmt.Sprintf("%d sessions closed at the caller app", len(ids)), func(ctx context.Context) error {
		var err error
		if snap, err = r.appReceived(ctx, ids, before); err != nil {
			return err
		}
		for _, id := range ids {
			if s := snap.Sessions[id]; s == nil || s.FinalState == "" {
				return fmt.Errorf("session %s not closed at the app yet", id)
			}
		}
		return nil
	})
	return r.judgeSessions(t, "helm upgrade", ids, snap, at)
}

// hcpCRDs are the CRDs the chart ships.
var hcpCRDs = []string{"callees.hcp.io", "callers.hcp.io", "capabilitypolicies.hcp.io", "hcpsessions.hcp.io"}

// version is an older tree of the repository with its binaries built.
type version struct {
	commit, dir string
}

func (v version) chart() string { return filepath.Join(v.dir, chartDir) }

// tag is the tag of version N's manager image: its commit.
func (v version) tag() string { return v.commit[:12] }

// buildVersion extracts ref into bin/upgrade-from/<commit>, builds its
// manager and hcp-sidecar there, and imports them into the node as the
// image upgradeFromRepository:<commit> until the test ends.
func buildVersion(t *testing.T, ref string) version {
	t.Helper()
	defer timed("upgrade: build version N")()
	ctx := t.Context()
	commit, err := output(ctx, "git", "rev-parse", "--verify", ref+"^{commit}")
	if err != nil {
		t.Fatalf("HCP_UPGRADE_FROM=%s: %v", ref, err)
	}
	v := version{commit: strings.TrimSpace(commit)}
	v.dir = filepath.Join(cfg.root, "bin", "upgrade-from", v.commit)
	built := filepath.Join(v.dir, ".built")
	if _, err := os.Stat(built); err != nil {
		if err := os.RemoveAll(v.dir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(v.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := output(ctx, "sh", "-c", `git archive --format=tar "$1" | tar -x -C "$2"`, "sh", v.commit, v.dir); err != nil {
			t.Fatalf("git archive %s: %v\n%s", v.commit, err, out)
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", "bin/", "./cmd/manager", "./cmd/hcp-sidecar")
		cmd.Dir = v.dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build of version N (%s): %v\n%s", v.commit, err, out)
		}
		if err := os.WriteFile(built, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("built version N's manager and hcp-sidecar in %s", v.dir)
	}
	importImage(t, upgradeFromRepository+":"+v.tag(), filepath.Join(v.dir, "bin"))
	return v
}

// importImage builds an image of the manager's layout (hack/imagebuild:
// /manager and /hcp-sidecar, entrypoint /manager, user 65532) from the
// binaries in bin, imports it into the local stack's node as ref, and
// removes it when the test ends.
func importImage(t *testing.T, ref, bin string) {
	t.Helper()
	ctx := t.Context()
	archive := filepath.Join(bin, "image.tar")
	if out, err := output(ctx, "make", "-s", "--no-print-directory", "imagebuild"); err != nil {
		t.Fatalf("make imagebuild: %v\n%s", err, out)
	}
	if out, err := output(ctx, filepath.Join(cfg.root, "bin", "imagebuild"), "image", "--name", ref, "--entrypoint", "/manager",
		"--file", "/manager="+filepath.Join(bin, "manager"), "--file", "/hcp-sidecar="+filepath.Join(bin, "hcp-sidecar"), "--out", archive); err != nil {
		t.Fatalf("bin/imagebuild image %s: %v\n%s", ref, err, out)
	}
	stack := filepath.Join(cfg.root, "hack", "local-stack.sh")
	if out, err := output(ctx, stack, "images", archive); err != nil {
		t.Fatalf("import %s: %v\n%s", ref, err, out)
	}
	t.Cleanup(func() {
		if out, err := output(context.Background(), stack, "ctr", "images", "rm", ref); err != nil {
			t.Errorf("remove image %s from the node: %v\n%s", ref, err, out)
		}
	})
}

func (s *suite) helm(ctx context.Context, args ...string) (string, error) {
	args = append(args, "--kubeconfig", os.Getenv("KUBECONFIG"))
	return output(ctx, s.cfg.helm, args...)
}

// helmInstall installs version N as a user of it did: its CRDs applied
// server-side (Helm installs crds/ only when they do not exist yet, and an
// earlier run may have left newer ones), then `helm install` with its
// manager image. It registers the suite's teardown first, as install does.
func (s *suite) helmInstall(t *testing.T, v version) {
	t.Helper()
	ctx := t.Context()
	defer timed("upgrade: helm install version N, manager available")()
	t.Cleanup(func() { s.resumeOtherManagers(t) })
	s.registerTeardown(t)
	t.Cleanup(func() { s.disownCRDs(t) })
	for _, ns := range []string{s.ns, s.opNS} {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"app.kubernetes.io/part-of": "hcp-e2e"}}}
		if err := s.c.Create(ctx, obj); err != nil {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
	}
	s.pauseOtherManagers(t)

	if crds := filepath.Join(v.chart(), "crds"); exists(crds) {
		out, err := s.kubectl(ctx, nil, "apply", "--server-side", "--force-conflicts", "--field-manager=hcp-e2e-upgrade-from", "-f", crds)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("version N's CRDs: kubectl apply --server-side -f crds/:\n%s", indent(out))
	}
	args := append([]string{"install", release, v.chart(), "--namespace", s.opNS, "--wait", "--timeout", installTimeout.String(),
		"--set", "image.repository=" + upgradeFromRepository, "--set", "image.tag=" + v.tag()}, s.helmValues()...)
	out, err := s.helm(ctx, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s\npods: %s", strings.Join(redact(args), " "), err, out, s.podsSummary(ctx, s.opNS))
	}
	t.Logf("helm %s:\n%s", strings.Join(redact(args), " "), indent(out))
	s.trackRelease(t)
}

// trackRelease points the teardown at the release's objects as Helm has
// them now (the teardown deletes the cluster-scoped ones, except CRDs).
func (s *suite) trackRelease(t *testing.T) {
	t.Helper()
	manifest, err := s.helm(t.Context(), "get", "manifest", release, "--namespace", s.opNS)
	if err != nil {
		t.Fatal(err)
	}
	if s.rendered, err = decodeManifests([]byte(manifest)); err != nil {
		t.Fatalf("decode the release's manifest: %v", err)
	}
}

// helmUpgrade is the upgrade as docs/upgrades.md tells it: from a chart
// whose CRDs were in crds/ Helm refuses to take over the CRDs, so they get
// the release's ownership label and annotations first; then `helm upgrade`
// to the working tree's chart, as docs/upgrades.md has it: the values of
// the install reused over the new chart's defaults, and the manager image
// back to the default repository and tag (the working tree's build).
func (s *suite) helmUpgrade(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	defer timed("upgrade: helm upgrade, manager available")()
	args := []string{"upgrade", release, filepath.Join(s.cfg.root, chartDir), "--namespace", s.opNS, "--wait", "--timeout", installTimeout.String(),
		"--reset-then-reuse-values", "--set", "image.repository=" + imageRepository, "--set", "image.tag="}
	out, err := s.helm(ctx, args...)
	switch {
	case err == nil:
		t.Logf("helm upgrade took the CRDs over without help (version N had them as templates already):\n%s", indent(out))
	case strings.Contains(err.Error(), "invalid ownership metadata"):
		t.Logf("helm upgrade refused to adopt version N's CRDs, as docs/upgrades.md says: %v", err)
		for _, crd := range hcpCRDs {
			for _, cmd := range [][]string{
				{"label", "crd", crd, "--overwrite", "app.kubernetes.io/managed-by=Helm"},
				{"annotate", "crd", crd, "--overwrite", "meta.helm.sh/release-name=" + release, "meta.helm.sh/release-namespace=" + s.opNS},
			} {
				if out, err := s.kubectl(ctx, nil, cmd...); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
			}
		}
		if out, err = s.helm(ctx, args...); err != nil {
			t.Fatalf("helm %s after labelling and annotating the CRDs: %v\n%s\npods: %s", strings.Join(redact(args), " "), err, out, s.podsSummary(ctx, s.opNS))
		}
		t.Logf("helm upgrade:\n%s", indent(out))
	default:
		t.Fatalf("helm %s: %v\n%s", strings.Join(redact(args), " "), err, out)
	}
	s.trackRelease(t)
}

// crdsUpgraded: the CRDs are the working tree's chart's, owned by the
// release, with the keep policy (so `helm uninstall` leaves them and the
// objects of their kinds).
func (s *suite) crdsUpgraded(t *testing.T) {
	t.Helper()
	want := map[string]string{}
	for _, o := range s.rendered {
		if o.GetKind() == "CustomResourceDefinition" {
			want[o.GetName()] = o.GetLabels()["helm.sh/chart"]
		}
	}
	if len(want) != len(hcpCRDs) {
		t.Fatalf("the upgraded release has %d CRDs (%v), want %v", len(want), want, hcpCRDs)
	}
	for _, name := range hcpCRDs {
		crd := &unstructured.Unstructured{}
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		crd.SetKind("CustomResourceDefinition")
		if err := s.c.Get(t.Context(), client.ObjectKey{Name: name}, crd); err != nil {
			t.Fatal(err)
		}
		a, l := crd.GetAnnotations(), crd.GetLabels()
		if a["meta.helm.sh/release-name"] != release || a["meta.helm.sh/release-namespace"] != s.opNS || l["app.kubernetes.io/managed-by"] != "Helm" ||
			a["helm.sh/resource-policy"] != "keep" || l["helm.sh/chart"] != want[name] {
			t.Errorf("CRD %s after the upgrade: labels %v, annotations %v; want the release's ownership, helm.sh/resource-policy: keep and helm.sh/chart %s",
				name, l, a, want[name])
		}
	}
}

// disownCRDs takes the release's ownership label and annotations off the
// CRDs, which outlive the release (keep policy) and its namespace: a later
// `helm install` of another release would be refused them.
func (s *suite) disownCRDs(t *testing.T) {
	if s.cfg.keep {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, crd := range hcpCRDs {
		ns, err := s.kubectl(ctx, nil, "get", "crd", crd, "-o", `jsonpath={.metadata.annotations.meta\.helm\.sh/release-namespace}`)
		if err != nil || ns != s.opNS {
			continue
		}
		for _, cmd := range [][]string{
			{"label", "crd", crd, "app.kubernetes.io/managed-by-"},
			{"annotate", "crd", crd, "meta.helm.sh/release-name-", "meta.helm.sh/release-namespace-"},
		} {
			if out, err := s.kubectl(ctx, nil, cmd...); err != nil {
				t.Errorf("teardown: %v\n%s", err, out)
			}
		}
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// calleeRightsUpgraded: version N gave each Callee's sidecar a Role and
// RoleBinding of its own; the upgraded manager binds the sidecar to the
// release's callee sidecars' ClusterRole instead, then deletes them (the
// sessions above streamed through it: a sidecar without its rights would
// have failed them).
func (s *suite) calleeRightsUpgraded(t *testing.T) {
	t.Helper()
	var clusterRole string
	for _, o := range s.rendered {
		if o.GetKind() == "ClusterRole" && strings.HasSuffix(o.GetName(), "-callee-sidecar") {
			clusterRole = o.GetName()
		}
	}
	if clusterRole == "" {
		t.Fatal("the upgraded release renders no callee sidecars' ClusterRole")
	}
	var callees hcpv1alpha1.CalleeList
	if err := s.c.List(t.Context(), &callees, client.InNamespace(s.ns)); err != nil || len(callees.Items) == 0 {
		t.Fatalf("Callees in %s: %d, %v", s.ns, len(callees.Items), err)
	}
	for _, c := range callees.Items {
		sub := resource.ForCallee(&c)
		eventually(t, time.Minute, "the Callee "+c.Name+"'s sidecar bound to "+clusterRole+", its Role from version N gone", func(ctx context.Context) error {
			rb := &rbacv1.RoleBinding{}
			if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: sub.SidecarRoleBindingName()}, rb); err != nil {
				return err
			}
			if rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != clusterRole {
				return fmt.Errorf("RoleBinding %s refers to %+v", rb.Name, rb.RoleRef)
			}
			for _, o := range []client.Object{&rbacv1.Role{}, &rbacv1.RoleBinding{}} {
				if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: sub.BaseName()}, o); !apierrors.IsNotFound(err) {
					return fmt.Errorf("%T %s from version N: %v", o, sub.BaseName(), err)
				}
			}
			return nil
		})
	}
}
