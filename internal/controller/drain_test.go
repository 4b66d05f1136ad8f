package controller

import (
	"context"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// TestHarnessPodDisruptionBudget: spec.harness.podDisruptionBudget makes,
// changes and removes the harness pods' PodDisruptionBudget, for a Callee
// and for a Caller's harness.
func TestHarnessPodDisruptionBudget(t *testing.T) {
	ns := newNamespace(t, "pdb-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "lab", func(c *hcpv1alpha1.Callee) {
		c.Spec.Harness.PodDisruptionBudget = &hcpv1alpha1.PodDisruptionBudgetSpec{MaxUnavailable: new(intstr.FromInt32(1))}
	})
	caller := newCaller(ns, "alpha", func(c *hcpv1alpha1.Caller) {
		c.Spec.Harness = &hcpv1alpha1.HarnessSpec{Template: harnessTemplate("example.com/agent:1"),
			PodDisruptionBudget: &hcpv1alpha1.PodDisruptionBudgetSpec{MinAvailable: new(intstr.FromString("50%"))}}
	})
	create(t, callee, caller)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hcp-callee-lab"}}
	callerPDB := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hcp-caller-alpha"}}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hcp-callee-lab"}}
	eventually(t, "both PodDisruptionBudgets exist, owned", all(exists(pdb, callee), exists(callerPDB, caller), exists(dep, callee)))
	if m := pdb.Spec.MaxUnavailable; m == nil || m.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("callee PDB spec %+v", pdb.Spec)
	}
	if !metav1.HasLabel(pdb.ObjectMeta, hcpv1alpha1.LabelManagedBy) || fmt.Sprint(pdb.Spec.Selector.MatchLabels) != fmt.Sprint(dep.Spec.Selector.MatchLabels) {
		t.Errorf("callee PDB selector %v, Deployment's %v", pdb.Spec.Selector, dep.Spec.Selector)
	}
	if m := callerPDB.Spec.MinAvailable; m == nil || m.String() != "50%" {
		t.Errorf("caller PDB spec %+v", callerPDB.Spec)
	}

	// The API refuses both bounds at once.
	bad := newCallee(ns, "both", func(c *hcpv1alpha1.Callee) {
		c.Spec.Harness.PodDisruptionBudget = &hcpv1alpha1.PodDisruptionBudgetSpec{MinAvailable: new(intstr.FromInt32(1)), MaxUnavailable: new(intstr.FromInt32(1))}
	})
	if err := k8sClient.Create(t.Context(), bad); err == nil {
		t.Error("a PodDisruptionBudget with minAvailable and maxUnavailable was accepted")
	}

	update(t, callee, func(c *hcpv1alpha1.Callee) {
		c.Spec.Harness.PodDisruptionBudget = &hcpv1alpha1.PodDisruptionBudgetSpec{MinAvailable: new(intstr.FromString("25%"))}
	})
	eventually(t, "a changed budget reaches the PodDisruptionBudget", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pdb), pdb); err != nil {
			return err
		}
		if pdb.Spec.MaxUnavailable != nil || pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.String() != "25%" {
			return fmt.Errorf("spec %+v", pdb.Spec)
		}
		return nil
	})
	update(t, callee, func(c *hcpv1alpha1.Callee) { c.Spec.Harness.PodDisruptionBudget = nil })
	update(t, caller, func(c *hcpv1alpha1.Caller) { c.Spec.Harness.PodDisruptionBudget = nil })
	eventually(t, "an unset budget deletes the PodDisruptionBudgets", all(gone(pdb), gone(callerPDB)))
}

// deployedSidecar returns the Deployment's sidecar container and hash.
func deployedSidecar(ctx context.Context, d *appsv1.Deployment) (corev1.Container, string, error) {
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(d), d); err != nil {
		return corev1.Container{}, "", err
	}
	for _, c := range d.Spec.Template.Spec.InitContainers {
		if c.Name == resource.SidecarContainerName {
			return c, d.Spec.Template.Annotations[resource.AnnotationSidecarHash], nil
		}
	}
	return corev1.Container{}, "", fmt.Errorf("no %s init container", resource.SidecarContainerName)
}

func sidecarImageIs(d *appsv1.Deployment, image string) func(context.Context) error {
	return func(ctx context.Context) error {
		c, _, err := deployedSidecar(ctx, d)
		if err != nil {
			return err
		}
		if c.Image != image {
			return fmt.Errorf("sidecar image %s, want %s", c.Image, image)
		}
		return nil
	}
}

func noCondition(c *hcpv1alpha1.Callee, typ string) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(c), c); err != nil {
			return err
		}
		if cond := meta.FindStatusCondition(c.Status.Conditions, typ); cond != nil {
			return fmt.Errorf("condition %s still set: %+v", typ, cond)
		}
		return nil
	}
}

// TestSidecarUpdatePolicy: Immediate rolls a changed sidecar at once, even
// with sessions running; OnDrain holds a sidecar-only change while
// sessions are active, says so, and rolls it when they end, or with the
// next change of anything else in the pod template.
func TestSidecarUpdatePolicy(t *testing.T) {
	ns := newNamespace(t, "sidecar-update-")
	dumpOnFailure(t, ns)
	immediate := newCallee(ns, "now")
	onDrain := newCallee(ns, "later", func(c *hcpv1alpha1.Callee) { c.Spec.Sidecar.UpdatePolicy = hcpv1alpha1.SidecarUpdateOnDrain })
	create(t, immediate, onDrain)
	depNow := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hcp-callee-now"}}
	depLater := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hcp-callee-later"}}
	eventually(t, "both harnesses deployed with the manager's sidecar", all(sidecarImageIs(depNow, suiteSidecarImage), sidecarImageIs(depLater, suiteSidecarImage)))

	// A session runs on each.
	runNow := newSession(ns, "now", hcpv1alpha1.SessionRunning, nil)
	runLater := newSession(ns, "later", hcpv1alpha1.SessionRunning, nil)
	createSession(t, runNow)
	createSession(t, runLater)
	eventually(t, "the sessions are counted", all(activeSessions(immediate, 1), activeSessions(onDrain, 1)))

	// A new sidecar: spec.sidecar.image stands in for a new operator
	// version (the suite's manager has one sidecar image).
	const v2 = "ghcr.io/hcp-io/hcp-operator:v2"
	_, heldHash, err := deployedSidecar(t.Context(), depLater)
	if err != nil {
		t.Fatal(err)
	}
	configHash := depLater.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash]
	update(t, immediate, func(c *hcpv1alpha1.Callee) { c.Spec.Sidecar.Image = v2 })
	update(t, onDrain, func(c *hcpv1alpha1.Callee) { c.Spec.Sidecar.Image = v2 })
	eventually(t, "Immediate rolls the new sidecar with a session running", sidecarImageIs(depNow, v2))
	eventually(t, "OnDrain says the update is pending", calleeCondition(onDrain, hcpv1alpha1.ConditionSidecarUpdatePending,
		metav1.ConditionTrue, hcpv1alpha1.ReasonSessionsActive, "1 sessions active"))
	c, hash, err := deployedSidecar(t.Context(), depLater)
	if err != nil {
		t.Fatal(err)
	}
	if c.Image != suiteSidecarImage || hash != heldHash || depLater.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash] != configHash {
		t.Errorf("OnDrain changed the pod template with a session active: sidecar %s, sidecar hash %s (was %s)", c.Image, hash, heldHash)
	}
	if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(onDrain), onDrain); err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(onDrain.Status.Conditions, hcpv1alpha1.ConditionSidecarUpdatePending); cond == nil {
		t.Fatal("no condition")
	}
	if r := meta.FindStatusCondition(onDrain.Status.Conditions, hcpv1alpha1.ConditionReady); r == nil || r.Reason == hcpv1alpha1.ReasonReconcileFailed {
		t.Errorf("Ready %+v", r)
	}
	if meta.FindStatusCondition(immediate.Status.Conditions, hcpv1alpha1.ConditionSidecarUpdatePending) != nil {
		t.Error("Immediate has a SidecarUpdatePending condition")
	}
	// Scaling while held keeps the held sidecar.
	update(t, onDrain, func(c *hcpv1alpha1.Callee) { c.Spec.Harness.Replicas = new(int32(2)) })
	eventually(t, "replicas reach the held Deployment", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(depLater), depLater); err != nil {
			return err
		}
		if *depLater.Spec.Replicas != 2 {
			return fmt.Errorf("replicas %d", *depLater.Spec.Replicas)
		}
		return nil
	})
	if err := sidecarImageIs(depLater, suiteSidecarImage)(t.Context()); err != nil {
		t.Errorf("scaling rolled the held sidecar: %v", err)
	}

	// The session ends: the new sidecar rolls, the condition goes.
	setSessionState(t, runLater, hcpv1alpha1.SessionCompleted)
	eventually(t, "OnDrain rolls the sidecar once no session is active", all(sidecarImageIs(depLater, v2),
		noCondition(onDrain, hcpv1alpha1.ConditionSidecarUpdatePending)))

	// Held again, then a harness change: the pods roll anyway, with the
	// new sidecar.
	runAgain := newSession(ns, "later", hcpv1alpha1.SessionRunning, nil)
	createSession(t, runAgain)
	eventually(t, "the new session is counted", activeSessions(onDrain, 1))
	const v3 = "ghcr.io/hcp-io/hcp-operator:v3"
	update(t, onDrain, func(c *hcpv1alpha1.Callee) { c.Spec.Sidecar.Image = v3 })
	eventually(t, "held again", calleeCondition(onDrain, hcpv1alpha1.ConditionSidecarUpdatePending, metav1.ConditionTrue, hcpv1alpha1.ReasonSessionsActive, ""))
	if err := sidecarImageIs(depLater, v2)(t.Context()); err != nil {
		t.Fatal(err)
	}
	update(t, onDrain, func(c *hcpv1alpha1.Callee) {
		c.Spec.Harness.Template.Spec.Containers[0].Image = "example.com/harness:2"
	})
	eventually(t, "a harness change rolls the held sidecar with it", all(sidecarImageIs(depLater, v3),
		noCondition(onDrain, hcpv1alpha1.ConditionSidecarUpdatePending)))
	if depLater.Spec.Template.Spec.Containers[0].Image != "example.com/harness:2" {
		t.Errorf("harness image %s", depLater.Spec.Template.Spec.Containers[0].Image)
	}

	// OnDrain is for Callees only.
	caller := newCaller(ns, "alpha", func(c *hcpv1alpha1.Caller) { c.Spec.Sidecar.UpdatePolicy = hcpv1alpha1.SidecarUpdateOnDrain })
	if err := k8sClient.Create(t.Context(), caller); err == nil {
		t.Error("a Caller with updatePolicy OnDrain was accepted")
	}
}

// harnessPod stands in for a pod of the callee's Deployment (envtest runs
// no Deployment controller): what the ReplicaSet controller would create.
func harnessPod(ns, callee, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: resource.ForCallee(newCallee(ns, callee)).SelectorLabels()},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "harness", Image: "example.com/harness:1"}}},
	}
}

func sessionOn(t *testing.T, ns, callee, pod string, state hcpv1alpha1.SessionState) *hcpv1alpha1.HCPSession {
	t.Helper()
	s := newSession(ns, callee, state, nil)
	if state.IsTerminal() {
		s.Status.CompletedAt = new(metav1.Now())
	}
	s.Status.PodName = pod
	createSession(t, s)
	return s
}

// deletionCosts checks each pod's controller.kubernetes.io/pod-deletion-cost
// ("" for none).
func deletionCosts(ns string, want map[string]string) func(context.Context) error {
	return func(ctx context.Context) error {
		for name, w := range want {
			p := &corev1.Pod{}
			if err := k8sClient.Get(ctx, key(ns, name), p); err != nil {
				return err
			}
			if got := p.Annotations[corev1.PodDeletionCost]; got != w {
				return fmt.Errorf("pod %s: deletion cost %q, want %q", name, got, w)
			}
		}
		return nil
	}
}

// TestPodDeletionCost: each harness pod's deletion cost is its number of
// live sessions, kept up to date as sessions start, move and end.
func TestPodDeletionCost(t *testing.T) {
	ns := newNamespace(t, "deletion-cost-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "lab")
	create(t, callee)
	eventually(t, "harness deployed", exists(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hcp-callee-lab"}}, callee))
	stranger := harnessPod(ns, "other", "stranger-0")
	create(t, harnessPod(ns, "lab", "lab-a"), harnessPod(ns, "lab", "lab-b"), harnessPod(ns, "lab", "lab-c"), stranger)

	s1 := sessionOn(t, ns, "lab", "lab-a", hcpv1alpha1.SessionRunning)
	sessionOn(t, ns, "lab", "lab-a", hcpv1alpha1.SessionPaused)
	sessionOn(t, ns, "lab", "lab-a", hcpv1alpha1.SessionCompleted)
	s4 := sessionOn(t, ns, "lab", "lab-b", hcpv1alpha1.SessionRunning)
	// Another callee's session on a pod of the same name counts nowhere.
	sessionOn(t, ns, "other", "lab-c", hcpv1alpha1.SessionRunning)
	eventually(t, "costs count live sessions per pod", deletionCosts(ns, map[string]string{"lab-a": "2", "lab-b": "1", "lab-c": "", "stranger-0": ""}))

	// A session moves to another replica (a handover).
	eventually(t, "move a session", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(s1), s1); err != nil {
			return err
		}
		s1.Status.PodName = "lab-b"
		return k8sClient.Status().Update(ctx, s1)
	})
	eventually(t, "costs follow a handover", deletionCosts(ns, map[string]string{"lab-a": "1", "lab-b": "2"}))

	// Sessions end.
	setSessionState(t, s1, hcpv1alpha1.SessionCompleted)
	setSessionState(t, s4, hcpv1alpha1.SessionFailed)
	eventually(t, "costs drop as sessions end", deletionCosts(ns, map[string]string{"lab-a": "1", "lab-b": "0"}))

	// A session recorded on a pod before the pod is seen.
	sessionOn(t, ns, "lab", "lab-d", hcpv1alpha1.SessionRunning)
	create(t, harnessPod(ns, "lab", "lab-d"))
	eventually(t, "a new pod gets its cost", deletionCosts(ns, map[string]string{"lab-d": "1"}))
}
