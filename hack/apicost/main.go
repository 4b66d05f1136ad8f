// Command apicost measures what one write of each kind the operator makes
// costs the API server in CPU: a Callee's create, its id claim (a merge
// patch of labels and finalizer), its status patch, a CapabilityPolicy's
// create and status patch, a ConfigMap's create for reference, and a
// child's create against a server-side apply that creates it (a Role, a
// Deployment, a Callee as a CRD object, a Secret). It
// reads the kube-apiserver process's CPU time from /proc, so it must run
// on the API server's machine (the local stack: hack/local-stack.sh); it
// prints each write's share of that CPU over its step, and the same less
// what the API server spends with nothing sent (measured for 10 s first).
// A write's work after its response (its watch events to every watcher)
// is counted as far as it falls within its step; steps are 2 s apart, so
// that little of one step's tail falls into the next.
//
//	go run ./hack/apicost -kubeconfig ~/.cache/hcp-operator/stack/kubeconfig [-n 300]
//
// It works in a namespace of its own, deleted at the end.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

func main() {
	n := flag.Int("n", 300, "writes of each kind")
	policy := flag.String("policy", "config/samples/hcp_v1alpha1_capabilitypolicy.yaml", "a CapabilityPolicy to create copies of")
	flag.Parse()
	// --kubeconfig (controller-runtime's flag) or KUBECONFIG.
	if err := run(*n, *policy); err != nil {
		fmt.Fprintln(os.Stderr, "apicost:", err)
		os.Exit(1)
	}
}

func run(n int, policyPath string) error {
	ctx := context.Background()
	cfg, err := ctrl.GetConfig() // no client-side limit, as the manager
	if err != nil {
		return err
	}
	s := runtime.NewScheme()
	if err := controller.AddToScheme(s); err != nil {
		return err
	}
	cl, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(policyPath)
	if err != nil {
		return err
	}
	var policy hcpv1alpha1.CapabilityPolicy
	if err := yaml.Unmarshal(raw, &policy); err != nil {
		return fmt.Errorf("%s: %w", policyPath, err)
	}
	if _, err := apiserverCPU(); err != nil {
		return err
	}
	ns := fmt.Sprintf("hcp-apicost-%d", time.Now().Unix())
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	callees := make([]*hcpv1alpha1.Callee, n)
	defer func() {
		// The claim's finalizer would hold the namespace's deletion, and
		// the namespace controller's retries would load the API server.
		ctx := context.Background()
		for _, c := range callees {
			if c != nil && len(c.Finalizers) > 0 {
				_ = cl.Patch(ctx, c, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
			}
		}
		_ = cl.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}()

	// The idle rate: what the API server spends with nothing sent (its
	// own loops, leases, the controllers' resyncs).
	const idleFor = 10 * time.Second
	i0, err := apiserverCPU()
	if err != nil {
		return err
	}
	time.Sleep(idleFor)
	i1, err := apiserverCPU()
	if err != nil {
		return err
	}
	idle := float64(i1-i0) / float64(idleFor)
	fmt.Printf("%d writes of each kind, one at a time; the API server's CPU idle: %.0f ms/s\n", n, idle*1000)
	step := func(what string, write func(i int) error) error {
		time.Sleep(2 * time.Second) // the last step's watchers and controllers catch up
		t0 := time.Now()
		c0, err := apiserverCPU()
		if err != nil {
			return err
		}
		for i := range n {
			if err := write(i); err != nil {
				return fmt.Errorf("%s %d: %w", what, i, err)
			}
		}
		took := time.Since(t0)
		c1, err := apiserverCPU()
		if err != nil {
			return err
		}
		per := func(d float64) float64 { return d / float64(time.Millisecond) / float64(n) }
		fmt.Printf("%-40s %6.2f ms of API server CPU each (%6.2f ms less the idle rate), %5.2f ms wall\n",
			what, per(float64(c1-c0)), per(float64(c1-c0)-idle*float64(took)), per(float64(took)))
		return nil
	}
	pending := func(conds *[]metav1.Condition, round, i int) {
		for _, t := range []string{hcpv1alpha1.ConditionTopologyReady, hcpv1alpha1.ConditionHarnessReady, hcpv1alpha1.ConditionReady, hcpv1alpha1.ConditionReconciling} {
			meta.SetStatusCondition(conds, metav1.Condition{Type: t, Status: metav1.ConditionFalse, Reason: hcpv1alpha1.ReasonTopologyPending,
				Message: fmt.Sprintf("round %d: Queue hcp-callee-c%d: not yet declared by the messaging-topology-operator", round, i)})
		}
	}

	newCallee := func(name string) *hcpv1alpha1.Callee {
		c := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		c.Spec.Broker = hcpv1alpha1.BrokerSpec{Vhost: "/apicost", CreateVhost: true}
		c.Spec.Capabilities = []hcpv1alpha1.Capability{{Name: "apicost.noop", RiskLevel: "R1", DataClassification: "T1", MaxDuration: "PT5M"}}
		c.Spec.Harness.Replicas = new(int32)
		c.Spec.Harness.Template.Spec.Containers = []corev1.Container{{Name: "app", Image: "example.com/app"}}
		return c
	}

	type write struct {
		what  string
		write func(i int) error
	}
	steps := []write{
		{"ConfigMap: create (for reference)", func(i int) error {
			return cl.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cm%d", i)}, Data: map[string]string{"a": "b"}})
		}},
		{"Callee: create", func(i int) error {
			c := newCallee(fmt.Sprintf("c%d", i))
			callees[i] = c
			return cl.Create(ctx, c)
		}},
		{"Callee: id claim (label, finalizer)", func(i int) error {
			c := callees[i]
			before := c.DeepCopy()
			c.Labels = map[string]string{hcpv1alpha1.LabelVhostKey: "apicost"}
			c.Finalizers = []string{controller.TopologyFinalizer}
			return cl.Patch(ctx, c, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		}},
	}
	// A child as the operator makes it: created, or applied (server-side
	// apply of an object that does not exist yet), as applyChild does.
	managedBy := map[string]string{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue}
	role := func(name string) *rbacv1.Role {
		return &rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: managedBy},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"hcp.io"}, Resources: []string{"hcpsessions"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
				{APIGroups: []string{"hcp.io"}, Resources: []string{"hcpsessions/status"}, Verbs: []string{"get", "update", "patch"}}}}
	}
	secret := func(name string) *corev1.Secret {
		return &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: managedBy},
			Data:       map[string][]byte{"username": []byte("hcp-callee-" + name), "password": []byte("0123456789abcdef0123456789abcdef")}}
	}
	deployment := func(name string) *appsv1.Deployment {
		labels := map[string]string{"app.kubernetes.io/name": name}
		return &appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: appsv1.DeploymentSpec{Replicas: new(int32), Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{
					{Name: "app", Image: "example.com/app"},
					{Name: "hcp-sidecar", Image: "example.com/sidecar", Args: []string{"--role=callee"},
						Env: []corev1.EnvVar{{Name: "HCP_ID", Value: name}, {Name: "HCP_VHOST", Value: "/x"}}}}}}}}
	}
	applyNew := func(o client.Object) error {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{Object: m}
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		return cl.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(resource.FieldManager), client.ForceOwnership)
	}
	steps = append(steps, []write{
		{"Role: create", func(i int) error { return cl.Create(ctx, role(fmt.Sprintf("rc%d", i))) }},
		{"Role: server-side apply (new)", func(i int) error { return applyNew(role(fmt.Sprintf("ra%d", i))) }},
		{"Deployment (replicas 0): create", func(i int) error { return cl.Create(ctx, deployment(fmt.Sprintf("dc%d", i))) }},
		{"Deployment (replicas 0): server-side apply (new)", func(i int) error { return applyNew(deployment(fmt.Sprintf("da%d", i))) }},
		{"Callee: server-side apply (new)", func(i int) error {
			c := newCallee(fmt.Sprintf("ca%d", i))
			c.TypeMeta = metav1.TypeMeta{APIVersion: hcpv1alpha1.GroupVersion.String(), Kind: "Callee"}
			return applyNew(c)
		}},
		{"Secret: create", func(i int) error { return cl.Create(ctx, secret(fmt.Sprintf("sc%d", i))) }},
		{"Secret: server-side apply (new)", func(i int) error { return applyNew(secret(fmt.Sprintf("sa%d", i))) }},
	}...)
	for round := 1; round <= 3; round++ {
		steps = append(steps, write{fmt.Sprintf("Callee: status patch %d", round), func(i int) error {
			c := callees[i]
			before := c.DeepCopy()
			c.Status.ObservedGeneration = c.Generation
			pending(&c.Status.Conditions, round, i)
			return cl.Status().Patch(ctx, c, client.MergeFrom(before))
		}})
	}
	policies := make([]*hcpv1alpha1.CapabilityPolicy, n)
	steps = append(steps, []write{
		{"CapabilityPolicy: create", func(i int) error {
			p := policy.DeepCopy()
			p.Namespace, p.Name = ns, fmt.Sprintf("p%d", i)
			policies[i] = p
			return cl.Create(ctx, p)
		}},
		{"CapabilityPolicy: status patch", func(i int) error {
			p := policies[i]
			before := p.DeepCopy()
			p.Status.ObservedGeneration = p.Generation
			pending(&p.Status.Conditions, 1, i)
			return cl.Status().Patch(ctx, p, client.MergeFrom(before))
		}},
	}...)
	for _, st := range steps {
		if err := step(st.what, st.write); err != nil {
			return err
		}
	}
	return nil
}

// apiserverCPU is the CPU time (user and system) of the kube-apiserver
// processes on this machine.
func apiserverCPU() (time.Duration, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var total time.Duration
	found := false
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(comm)) != "kube-apiserver" {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: utime and
		// stime are the 12th and 13th, in clock ticks (100 a second).
		f := strings.Fields(string(stat)[strings.LastIndexByte(string(stat), ')')+2:])
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.Atoi(f[11])
		s, _ := strconv.Atoi(f[12])
		total += time.Duration(u+s) * 10 * time.Millisecond
		found = true
	}
	if !found {
		return 0, fmt.Errorf("no kube-apiserver process on this machine: run it where the API server runs (hack/local-stack.sh up)")
	}
	return total, nil
}
