package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// appliedBy reports whether manager owns fields of o through server-side
// apply.
func appliedBy(o client.Object, manager string) bool {
	return managedThrough(o, manager, metav1.ManagedFieldsOperationApply)
}

// managedThrough reports whether manager owns fields of o through op.
func managedThrough(o client.Object, manager string, op metav1.ManagedFieldsOperationType) bool {
	for _, f := range o.GetManagedFields() {
		if f.Manager == manager && f.Operation == op {
			return true
		}
	}
	return false
}

// TestChildrenServerSideApply: the children of childKinds are created
// under the operator's field manager, and later written by server-side
// apply, which first takes the create's fields into its own entry; a
// field another manager sets on a child stays through the operator's
// next apply.
func TestChildrenServerSideApply(t *testing.T) {
	ns := newNamespace(t, "ssa-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "ssa")
	create(t, callee)
	base, _, _ := childNames("callee", "ssa")
	declarePrerequisites(t, ns, base)
	children := append(topologyChildren(ns, base), harnessChildren(ns, base)...)
	eventually(t, "every child is created by "+resource.FieldManager, func(ctx context.Context) error {
		for _, o := range children {
			if err := exists(o, callee)(ctx); err != nil {
				return err
			}
			if !managedThrough(o, resource.FieldManager, metav1.ManagedFieldsOperationUpdate) {
				return fmt.Errorf("%T %s: not created by %s: %+v", o, o.GetName(), resource.FieldManager, o.GetManagedFields())
			}
		}
		return nil
	})

	// Another controller labels the ServiceAccount and removes one of the
	// operator's labels, which makes the operator apply it again.
	role := &corev1.ServiceAccount{}
	if err := k8sClient.Get(t.Context(), key(ns, base), role); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"metadata":{"labels":{"other.example/team":"a","` + resource.LabelPartOf + `":null}}}`)
	if err := k8sClient.Patch(t.Context(), role, client.RawPatch(types.MergePatchType, patch), client.FieldOwner("other-controller")); err != nil {
		t.Fatal(err)
	}
	// The change raises an Owns event: the operator applies again.
	eventually(t, "the operator's label is back and the other's stays", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, key(ns, base), role); err != nil {
			return err
		}
		if role.Labels[resource.LabelPartOf] != resource.PartOfValue || role.Labels["other.example/team"] != "a" {
			return fmt.Errorf("labels %v", role.Labels)
		}
		// The create's fields moved to the operator's apply entry.
		if !appliedBy(role, resource.FieldManager) || managedThrough(role, resource.FieldManager, metav1.ManagedFieldsOperationUpdate) {
			return fmt.Errorf("managed fields %+v", role.ManagedFields)
		}
		return nil
	})
}

// TestChildFieldRemovedAfterCreate: a child the operator created (a POST,
// the cheap write at scale) loses a field its builder stops setting on the
// next apply, as if it had been server-side applied from the start: the
// create's field ownership moves to the operator's apply entry first.
// A user removes an environment variable from the harness template; the
// Deployment loses it, and a field another manager set stays.
func TestChildFieldRemovedAfterCreate(t *testing.T) {
	ns := newNamespace(t, "drop-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "drop", func(c *hcpv1alpha1.Callee) {
		c.Spec.Harness.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "KEEP", Value: "1"}, {Name: "DROP", Value: "2"}}
	})
	create(t, callee)
	base, _, _ := childNames("callee", "drop")
	dep := &appsv1.Deployment{}
	envOf := func(d *appsv1.Deployment) []string {
		var names []string
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name == "harness" {
				for _, e := range c.Env {
					names = append(names, e.Name)
				}
			}
		}
		return names
	}
	eventually(t, "the Deployment carries both variables", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, key(ns, base), dep); err != nil {
			return err
		}
		if got := envOf(dep); !slices.Equal(got, []string{"KEEP", "DROP"}) {
			return fmt.Errorf("harness env %v", got)
		}
		return nil
	})
	patch := []byte(`{"metadata":{"annotations":{"other.example/note":"x"}}}`)
	if err := k8sClient.Patch(t.Context(), dep, client.RawPatch(types.MergePatchType, patch), client.FieldOwner("other-controller")); err != nil {
		t.Fatal(err)
	}
	update(t, callee, func(c *hcpv1alpha1.Callee) {
		c.Spec.Harness.Template.Spec.Containers[0].Env = c.Spec.Harness.Template.Spec.Containers[0].Env[:1]
	})
	eventually(t, "the Deployment lost DROP and kept the other manager's annotation", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, key(ns, base), dep); err != nil {
			return err
		}
		if got := envOf(dep); !slices.Equal(got, []string{"KEEP"}) {
			return fmt.Errorf("harness env %v", got)
		}
		if dep.Annotations["other.example/note"] != "x" {
			return fmt.Errorf("annotations %v", dep.Annotations)
		}
		if !appliedBy(dep, resource.FieldManager) {
			return fmt.Errorf("no server-side apply by %s in %+v", resource.FieldManager, dep.ManagedFields)
		}
		return nil
	})
}

// TestCreatedEventsAfterFirstRollout: a new Callee's first rollout
// records no Created Event (its children are all created; Ready says how
// the rollout goes, and at scale the Event is one more API write per
// object), but a child created later, here re-created after a deletion
// once the Callee is Ready, gets one Created Event naming it, and no
// other child. (The check used to find "Binding x" inside
// "RoleBinding x": names() tells them apart.)
func TestCreatedEventsAfterFirstRollout(t *testing.T) {
	ns := newNamespace(t, "events-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "ev", func(c *hcpv1alpha1.Callee) { c.Spec.Harness.Replicas = new(int32(0)) })
	create(t, callee)
	base, _, _ := childNames("callee", "ev")
	key := claimedKey(t, callee)
	declarePrerequisites(t, ns, base)
	for _, o := range topologyChildren(ns, base) {
		setTopologyStatus(t, o, true, "")
	}
	declareShared(t, key)
	eventually(t, "Ready=True ScaledToZero", calleeCondition(callee, hcpv1alpha1.ConditionReady, metav1.ConditionTrue, hcpv1alpha1.ReasonScaledToZero, ""))
	if created, err := eventsOf(t.Context(), ns, "Callee", "ev", verbCreated); err != nil || len(created) != 0 {
		t.Fatalf("the first rollout recorded Created Events %v (%v), want none", created, err)
	}

	rb := base + "-sidecar"
	if err := k8sClient.Delete(t.Context(), &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: rb}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a Created Event names the re-created RoleBinding", func(ctx context.Context) error {
		created, err := eventsOf(ctx, ns, "Callee", "ev", verbCreated)
		if err != nil {
			return err
		}
		var notes []string
		for _, e := range created {
			if names(e.Note, "RoleBinding "+rb) && !names(e.Note, "Binding "+base) {
				return nil
			}
			notes = append(notes, e.Note)
		}
		return fmt.Errorf("no Created Event names RoleBinding %s alone: %q", rb, notes)
	})
}

// TestChangeEventsOfTwoReconcilesAtOneVersion: two reconciles of an owner
// that was not written in between (its cached resourceVersion the same)
// each create a child; each gets its own Created Event with its own note.
// client-go's events recorder keys a recurring Event on everything but
// its note, so the second used to become a count on the first's series,
// its note lost (a PATCH of the first Event).
func TestChangeEventsOfTwoReconcilesAtOneVersion(t *testing.T) {
	ns := newNamespace(t, "events-series-")
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner"}}
	create(t, owner)
	c := &core{recorder: suiteManager.GetEventRecorder(EventRecorderName)}
	for kind, child := range map[string]client.Object{
		"Binding":    &topologyv1beta1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b", UID: "uid-b"}},
		"Permission": &topologyv1beta1.Permission{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p", UID: "uid-p"}},
	} {
		ctx, changes := withChangeLog(t.Context())
		c.noteChange(ctx, owner, child, kind, verbCreated)
		c.emitChanges(owner, changes, false)
	}
	eventually(t, "a Created Event for each reconcile", func(ctx context.Context) error {
		created, err := eventsOf(ctx, ns, "ConfigMap", "owner", verbCreated)
		if err != nil {
			return err
		}
		var notes []string
		for _, e := range created {
			notes = append(notes, e.Note)
			if e.Series != nil {
				return fmt.Errorf("the Event %q counts a series of %d: a later Event was folded into it", e.Note, e.Series.Count)
			}
		}
		slices.Sort(notes)
		if !slices.Equal(notes, []string{"Created Binding b", "Created Permission p"}) {
			return fmt.Errorf("Created Events %q, want one naming the Binding and one naming the Permission", notes)
		}
		return nil
	})
}

// eventsOf lists the Events with reason about the object kind/name in ns.
func eventsOf(ctx context.Context, ns, kind, name, reason string) ([]eventsv1.Event, error) {
	var list eventsv1.EventList
	if err := k8sClient.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out, nil
}

// names: an Event note lists child ("Kind name") as one of its entries,
// not inside another ("RoleBinding x" does not name "Binding x").
func names(note, child string) bool {
	for entry := range strings.SplitSeq(note, ", ") {
		if strings.HasSuffix(entry, " "+child) || entry == child {
			return true
		}
	}
	return false
}

// TestChildAfterPrerequisite: a child the topology operator would fail
// while its prerequisite is not declared yet (and then retry with a
// back-off of up to 1,000 s) is created only once that prerequisite is
// Ready: the Permission after its User (vhost_or_user_not_found), the
// Binding after its Queue (404: no queue).
func TestChildAfterPrerequisite(t *testing.T) {
	for _, tc := range []struct {
		name          string
		child, before func(ns, base string) client.Object
	}{
		{"Permission after User",
			func(ns, base string) client.Object {
				return &topologyv1beta1.Permission{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}
			},
			func(ns, base string) client.Object {
				return &topologyv1beta1.User{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}
			}},
		{"Binding after Queue",
			func(ns, base string) client.Object {
				return &topologyv1beta1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}
			},
			func(ns, base string) client.Object {
				return &topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t, "after-")
			dumpOnFailure(t, ns)
			callee := newCallee(ns, "after")
			create(t, callee)
			base, _, _ := childNames("callee", "after")
			child, before := tc.child(ns, base), tc.before(ns, base)
			kind := strings.TrimPrefix(fmt.Sprintf("%T", before), "*v1beta1.")
			// The Deployment is applied after the topology in the same
			// reconcile: once it exists, the child would exist too.
			eventually(t, "the prerequisite and the Deployment exist", all(exists(before, callee),
				exists(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}, callee)))
			if err := gone(child)(t.Context()); err != nil {
				t.Fatalf("created before its %s is Ready: %v", kind, err)
			}
			eventually(t, "TopologyReady names what it waits for", calleeCondition(callee, hcpv1alpha1.ConditionTopologyReady,
				metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, kind+" "+base+": not yet declared"))
			setTopologyStatus(t, before, true, "")
			eventually(t, "the child follows its Ready prerequisite", exists(child, callee))
		})
	}
}

func testSubject() resource.Subject {
	return resource.Subject{Role: topology.RoleCaller, Name: "c", Namespace: "ns", ID: "c", UID: "u"}
}

// TestDesiredChildren: the pure builders' table, without an API server.
func TestDesiredChildren(t *testing.T) {
	sub := testSubject()
	queue := &topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: sub.BaseName()}}
	in := desiredInput{sub: sub, broker: resource.Broker{Vhost: "/v"}, queue: queue, bindingAnnotations: map[string]string{annotationRedeclare: "1"}}

	kinds := func(children []desiredChild) []string {
		var out []string
		for _, c := range children {
			s := fmt.Sprintf("%T", c.empty)
			if c.obj == nil {
				s += "(delete)"
			} else if c.obj.GetName() != c.empty.GetName() || c.obj.GetNamespace() != "ns" {
				s += "(bad name " + c.obj.GetNamespace() + "/" + c.obj.GetName() + ")"
			}
			out = append(out, s)
		}
		return out
	}
	topo := desiredChildren(groupTopology, in)
	if got, want := kinds(topo), []string{"*v1beta1.Queue", "*v1beta1.Binding", "*v1beta1.Queue", "*v1beta1.Binding", "*v1beta1.User", "*v1beta1.Permission"}; !slices.Equal(got, want) {
		t.Errorf("topology children %v, want %v", got, want)
	}
	if topo[0].obj != queue {
		t.Error("the Queue is not the one declared")
	}
	if topo[1].obj.GetAnnotations()[annotationRedeclare] != "1" {
		t.Errorf("binding annotations %v", topo[1].obj.GetAnnotations())
	}
	// The queue above was declared before its dead letters went straight
	// to its dead-letter queue: it keeps its dead-letter Binding. One
	// declared with its dead-letter routing needs none.
	direct := resource.Queue(sub, in.broker, resource.DeadLetterArguments(sub.QueueName()))
	if got, want := kinds(desiredChildren(groupTopology, desiredInput{sub: sub, broker: in.broker, queue: direct})),
		[]string{"*v1beta1.Queue", "*v1beta1.Binding", "*v1beta1.Queue", "*v1beta1.Binding(delete)", "*v1beta1.User", "*v1beta1.Permission"}; !slices.Equal(got, want) {
		t.Errorf("topology children of a queue with its dead-letter routing %v, want %v", got, want)
	}

	// No harness (an external Caller): every harness child is deleted.
	if got, want := kinds(desiredChildren(groupHarness, in)), []string{
		"*v1.ServiceAccount(delete)", "*v1.RoleBinding(delete)", "*v1.Role(delete)", "*v1.RoleBinding(delete)", "*v1.PodDisruptionBudget(delete)", "*v1.Deployment(delete)",
	}; !slices.Equal(got, want) {
		t.Errorf("external harness children %v, want %v", got, want)
	}

	// A harness without a PodDisruptionBudget.
	in.harness = &resource.HarnessParams{Subject: sub, Harness: hcpv1alpha1.HarnessSpec{Template: harnessTemplate("app:1")}, Vhost: "/v", Image: "sidecar:1"}
	// A caller's sidecar: a Role of its own (it names its Caller) and its
	// binding; no binding to the callee sidecars' ClusterRole.
	if got, want := kinds(desiredChildren(groupHarness, in)), []string{
		"*v1.ServiceAccount", "*v1.RoleBinding(delete)", "*v1.Role", "*v1.RoleBinding", "*v1.PodDisruptionBudget(delete)", "*v1.Deployment",
	}; !slices.Equal(got, want) {
		t.Errorf("harness children %v, want %v", got, want)
	}
	in.pdb = &hcpv1alpha1.PodDisruptionBudgetSpec{}
	if c := desiredChildren(groupHarness, in)[4]; c.obj == nil {
		t.Error("no PodDisruptionBudget when spec.harness.podDisruptionBudget is set")
	}

	// A callee's sidecar: the callee sidecars' ClusterRole, bound first;
	// a Role and RoleBinding of its own (from before) are deleted after.
	callee := resource.Subject{Role: topology.RoleCallee, Name: "e", Namespace: "ns", ID: "e", UID: "u"}
	calleeIn := desiredInput{sub: callee, harness: &resource.HarnessParams{Subject: callee, Harness: in.harness.Harness, Vhost: "/v", Image: "sidecar:1", SidecarClusterRole: "callee-role"}}
	harness := desiredChildren(groupHarness, calleeIn)
	if got, want := kinds(harness), []string{
		"*v1.ServiceAccount", "*v1.RoleBinding", "*v1.Role(delete)", "*v1.RoleBinding(delete)", "*v1.PodDisruptionBudget(delete)", "*v1.Deployment",
	}; !slices.Equal(got, want) {
		t.Errorf("callee harness children %v, want %v", got, want)
	}
	if rb := harness[1].obj.(*rbacv1.RoleBinding); rb.Name != "hcp-callee-e-sidecar" || rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != "callee-role" {
		t.Errorf("callee role binding %s -> %+v", rb.Name, rb.RoleRef)
	}
	if harness[3].empty.GetName() != "hcp-callee-e" {
		t.Errorf("the callee's RoleBinding from before is %s", harness[3].empty.GetName())
	}

	// The finalizer's objects: the topology group, dependents first.
	var names []string
	for _, o := range topologyObjects(sub) {
		names = append(names, fmt.Sprintf("%T %s", o, o.GetName()))
	}
	b := sub.BaseName()
	if want := []string{"*v1beta1.Policy " + b, "*v1beta1.Permission " + b, "*v1beta1.User " + b, "*v1beta1.Binding " + b + "-dlq", "*v1beta1.Queue " + b + "-dlq",
		"*v1beta1.Binding " + b, "*v1beta1.Queue " + b}; !slices.Equal(names, want) {
		t.Errorf("topologyObjects %v, want %v", names, want)
	}
}

// TestHoldsApplied: when the live child needs no apply.
func TestHoldsApplied(t *testing.T) {
	sub := testSubject()
	desired := resource.Role(sub)
	cfg, err := applyConfiguration(desired, "rbac.authorization.k8s.io/v1", "Role")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cfg["metadata"].(map[string]any)["creationTimestamp"]; ok {
		t.Errorf("the apply configuration carries creationTimestamp: %v", cfg["metadata"])
	}
	if cfg["apiVersion"] != "rbac.authorization.k8s.io/v1" || cfg["kind"] != "Role" {
		t.Errorf("apply configuration type %v %v", cfg["apiVersion"], cfg["kind"])
	}
	check := func(what string, live client.Object, want bool) {
		t.Helper()
		got, err := holdsApplied(live, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: holdsApplied = %v, want %v", what, got, want)
		}
	}
	live := desired.DeepCopy()
	live.ResourceVersion, live.UID = "7", "x"
	live.Labels["other.example/team"] = "a" // another manager's
	check("same, with more fields", live, true)

	changed := live.DeepCopy()
	changed.Rules = changed.Rules[1:]
	check("a rule fewer", changed, false)

	changed = live.DeepCopy()
	delete(changed.Labels, resource.LabelPartOf)
	check("a label lost", changed, false)

	changed = live.DeepCopy()
	changed.OwnerReferences = nil
	check("no owner", changed, false)

	// Deployments compare by the rendered hashes and replicas.
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": "b"}, OwnerReferences: []metav1.OwnerReference{sub.OwnerReference()}},
		Spec: appsv1.DeploymentSpec{Replicas: new(int32(1)), Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{
			Annotations: map[string]string{hcpv1alpha1.AnnotationConfigHash: "c1", resource.AnnotationSidecarHash: "s1"}}}}}
	liveDep := dep.DeepCopy()
	liveDep.Spec.Template.Spec.DNSPolicy = corev1.DNSClusterFirst // a default
	if !deploymentUpToDate(liveDep, dep) {
		t.Error("a defaulted Deployment is not up to date")
	}
	liveDep.Spec.Replicas = new(int32(2))
	if deploymentUpToDate(liveDep, dep) {
		t.Error("other replicas are up to date")
	}
	liveDep = dep.DeepCopy()
	liveDep.Spec.Template.Annotations[resource.AnnotationSidecarHash] = "s0"
	if deploymentUpToDate(liveDep, dep) {
		t.Error("another sidecar hash is up to date")
	}
}

// TestBindingKeepsRedeclareAfterRestart: a manager that did not see the
// exchange loss (it started later) keeps the Binding's redeclare
// annotation instead of having server-side apply remove it.
func TestBindingKeepsRedeclareAfterRestart(t *testing.T) {
	ns := newNamespace(t, "redeclare-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "rd")
	create(t, callee)
	base, _, _ := childNames("callee", "rd")
	binding := &topologyv1beta1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}
	declarePrerequisites(t, ns, base)
	eventually(t, "the Binding exists", exists(binding, callee))
	patch := []byte(`{"metadata":{"annotations":{"` + annotationRedeclare + `":"epoch-1"}}}`)
	if err := k8sClient.Patch(t.Context(), binding, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	// A fresh core: no epochs, as after a restart.
	c := newCore(suiteManager.GetClient(), k8sClient, suiteManager.GetScheme(), nil, suiteOptions(), topology.RoleCallee)
	eventually(t, "the annotation is kept", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(callee), callee); err != nil {
			return err
		}
		got, err := c.bindingAnnotations(ctx, calleeView(callee), callee.Labels[hcpv1alpha1.LabelVhostKey])
		if err != nil {
			return err
		}
		if got[annotationRedeclare] != "epoch-1" {
			return fmt.Errorf("binding annotations %v", got)
		}
		return nil
	})
}

// TestChangeNote: an Event's note names the children and stays within the
// API's 1 KiB.
func TestChangeNote(t *testing.T) {
	if got, want := changeNote("Created", []string{"Queue a", "Binding a"}), "Created Queue a, Binding a"; got != want {
		t.Errorf("note %q, want %q", got, want)
	}
	long := make([]string, 12)
	for i := range long {
		long[i] = fmt.Sprintf("Deployment %s-%d", strings.Repeat("x", 190), i)
	}
	note := changeNote("Updated", long)
	if len(note) > maxEventNote || !strings.HasPrefix(note, "Updated Deployment ") || !strings.HasSuffix(note, " more") {
		t.Errorf("note of %d bytes: %q", len(note), note)
	}
}

// staleCache is a client whose reads miss what its writes made: a cache
// that has not yet seen an object another worker just created.
type staleCache struct{ client.Client }

func (s staleCache) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	gvk, _ := apiutil.GVKForObject(obj, s.Scheme())
	return apierrors.NewNotFound(schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(gvk.Kind) + "s"}, key.Name)
}

// TestApplyAfterAnotherWorkerCreated: the Callee and Caller controllers both
// ensure a vhost's shared objects, so one may create an Exchange the
// other's cache does not hold yet. Its create then finds the object there;
// the apply reads it from the API server and goes on, where the reconcile
// used to fail with AlreadyExists (Ready=False ReconcileFailed and a
// Warning Event on a user's first Callee and Caller).
func TestApplyAfterAnotherWorkerCreated(t *testing.T) {
	ns := newNamespace(t, "race-")
	dumpOnFailure(t, ns)
	desired := &topologyv1beta1.Exchange{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "x", Labels: map[string]string{"a": "1"}},
		Spec:       topologyv1beta1.ExchangeSpec{Name: "x", Type: "topic", Durable: true, RabbitmqClusterReference: topologyv1beta1.RabbitmqClusterReference{Name: "rmq"}},
	}
	create(t, desired.DeepCopy()) // by "the other worker"
	c := newCore(staleCache{k8sClient}, k8sClient, suiteManager.GetScheme(), nil, suiteOptions(), topology.RoleCallee)
	want := desired.DeepCopy()
	want.Labels["b"] = "2"
	live, err := c.apply(t.Context(), nil, want)
	if err != nil {
		t.Fatalf("apply over an object the cache has not seen: %v", err)
	}
	got := &topologyv1beta1.Exchange{}
	mustGet(t, k8sClient, client.ObjectKeyFromObject(desired), got)
	if got.Labels["a"] != "1" || got.Labels["b"] != "2" || live.GetUID() != got.UID {
		t.Errorf("after the apply: labels %v, uid %s (the live one %s)", got.Labels, live.GetUID(), got.UID)
	}
}
