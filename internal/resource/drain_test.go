package resource

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
)

func TestNativeSidecar(t *testing.T) {
	c := sampleCallee()
	tmpl := &c.Spec.Harness.Template
	tmpl.Spec.InitContainers = []corev1.Container{
		{Name: "migrate", Image: "example.com/migrate:1"},
		{Name: SidecarContainerName, Image: "user-tried-to-override"},
	}
	tmpl.Spec.Containers = append(tmpl.Spec.Containers, corev1.Container{Name: SidecarContainerName, Image: "again"})
	d := Deployment(HarnessParams{Subject: ForCallee(c), Harness: c.Spec.Harness, Sidecar: c.Spec.Sidecar, Vhost: "/hcp", Prefetch: 4})
	ps := d.Spec.Template.Spec

	inits, regular := make([]string, 0, len(ps.InitContainers)), make([]string, 0, len(ps.Containers))
	for _, x := range ps.InitContainers {
		inits = append(inits, x.Name)
	}
	for _, x := range ps.Containers {
		regular = append(regular, x.Name)
	}
	// First, so that it runs before the user's init containers (they may
	// call it) and is stopped last.
	if !reflect.DeepEqual(inits, []string{SidecarContainerName, "migrate"}) || !reflect.DeepEqual(regular, []string{"harness"}) {
		t.Fatalf("init containers %v, containers %v", inits, regular)
	}
	side := ps.InitContainers[0]
	if side.RestartPolicy == nil || *side.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("sidecar restartPolicy %v, want Always (a native sidecar)", side.RestartPolicy)
	}
	if ps.InitContainers[1].RestartPolicy != nil {
		t.Error("the user's init container was changed")
	}
	// What it had as a regular container, it keeps.
	want := SidecarContainer(HarnessParams{Subject: ForCallee(c), Harness: c.Spec.Harness, Sidecar: c.Spec.Sidecar, Vhost: "/hcp", Prefetch: 4})
	if !reflect.DeepEqual(side, want) || side.LivenessProbe == nil || side.ReadinessProbe == nil || side.SecurityContext == nil || len(side.VolumeMounts) == 0 {
		t.Errorf("sidecar %+v", side)
	}
	if side.Lifecycle != nil {
		t.Error("the sidecar must not drain itself through a hook: its SIGTERM drains it")
	}
	if ps.TerminationGracePeriodSeconds != nil {
		t.Errorf("terminationGracePeriodSeconds %d set; Kubernetes' default applies unless the template sets it", *ps.TerminationGracePeriodSeconds)
	}
}

func TestDrainHooks(t *testing.T) {
	c := sampleCallee()
	own := &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/save"}}}
	post := &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/warm"}}}
	c.Spec.Harness.Template.Spec.Containers = []corev1.Container{
		{Name: "plain", Image: "a"},
		{Name: "own-hook", Image: "b", Lifecycle: &corev1.Lifecycle{PreStop: own}},
		{Name: "post-start", Image: "c", Lifecycle: &corev1.Lifecycle{PostStart: post}},
	}
	c.Spec.Harness.Template.Spec.TerminationGracePeriodSeconds = new(int64(600))
	d := Deployment(HarnessParams{Subject: ForCallee(c), Harness: c.Spec.Harness})
	ps := d.Spec.Template.Spec
	get := func(name string) corev1.Container {
		for _, x := range ps.Containers {
			if x.Name == name {
				return x
			}
		}
		t.Fatalf("no container %s", name)
		return corev1.Container{}
	}

	hook := get("plain").Lifecycle.PreStop
	if hook == nil || hook.HTTPGet == nil {
		t.Fatalf("plain: preStop %+v, want the drain hook", hook)
	}
	// A numeric port: the kubelet resolves a hook's named port against its
	// own container, which does not declare the sidecar's probe port.
	if g := hook.HTTPGet; g.Path != "/drain" || g.Port != intstr.FromInt32(config.DefaultProbePort) || g.Host != "" || g.Scheme != corev1.URISchemeHTTP {
		t.Errorf("drain hook %+v", g)
	}
	var probePort int32
	for _, p := range ps.InitContainers[0].Ports {
		if p.Name == ProbePortName {
			probePort = p.ContainerPort
		}
	}
	if hook.HTTPGet.Port.IntVal != probePort {
		t.Errorf("the hook calls port %d, the sidecar's probe port is %d", hook.HTTPGet.Port.IntVal, probePort)
	}
	if got := get("own-hook").Lifecycle.PreStop; !reflect.DeepEqual(got, own) {
		t.Errorf("a container's own preStop hook was replaced: %+v", got)
	}
	pl := get("post-start").Lifecycle
	if !reflect.DeepEqual(pl.PostStart, post) || pl.PreStop == nil || pl.PreStop.HTTPGet == nil {
		t.Errorf("post-start: lifecycle %+v", pl)
	}
	if ps.TerminationGracePeriodSeconds == nil || *ps.TerminationGracePeriodSeconds != 600 {
		t.Error("the template's terminationGracePeriodSeconds was not kept")
	}
	// The input is not modified.
	if c.Spec.Harness.Template.Spec.Containers[0].Lifecycle != nil {
		t.Error("Deployment modified its input")
	}
}

func TestPodDisruptionBudget(t *testing.T) {
	s := ForCallee(sampleCallee())
	in := hcpv1alpha1.PodDisruptionBudgetSpec{MaxUnavailable: new(intstr.FromString("25%"))}
	pdb := PodDisruptionBudget(s, in)
	if pdb.Name != "hcp-callee-lab-cvd" || pdb.Namespace != "labs" || len(pdb.OwnerReferences) != 1 || pdb.OwnerReferences[0].UID != "uid-callee" {
		t.Errorf("meta %+v", pdb.ObjectMeta)
	}
	if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.StrVal != "25%" {
		t.Errorf("spec %+v", pdb.Spec)
	}
	// It selects exactly the Deployment's pods.
	d := Deployment(HarnessParams{Subject: s, Harness: sampleCallee().Spec.Harness})
	if !reflect.DeepEqual(pdb.Spec.Selector, d.Spec.Selector) {
		t.Errorf("selector %v, Deployment's %v", pdb.Spec.Selector, d.Spec.Selector)
	}
	in.MaxUnavailable.StrVal = "50%"
	if pdb.Spec.MaxUnavailable.StrVal != "25%" {
		t.Error("the PodDisruptionBudget shares memory with its input")
	}
}
