package controller

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// The authorization matrix of the sidecars' ServiceAccounts: the real Roles
// and RoleBindings (resource.Role, resource.RoleBinding) and the real
// ValidatingAdmissionPolicies (config/admission, loaded from the file), on a
// real API server, each request made by impersonating the ServiceAccount.
//
// The target is callee "alpha" in namespace A: its Callee, its sessions,
// the Caller "client" that submits to it, and objects of every other kind
// the Roles mention. Four identities act on it:
//
//	own     hcp-callee-alpha in A (the owner)
//	peer    hcp-callee-beta in A (another Callee of the same namespace)
//	caller  hcp-caller-client in A (the caller of alpha's sessions)
//	foreign hcp-callee-alpha in B (same name, another namespace)
//
// Every cell is allow, RBAC (403 from the authorizer) or policy (denied by
// one of the ValidatingAdmissionPolicies). Writes are server-side dry-runs:
// authorization and admission run in full, nothing is stored, so every row
// sees the same fixtures. docs/rbac.md shows this table: the test fails when
// it differs (HCP_UPDATE_DOCS=1 rewrites it).
//
// HCP_AUTHZ_WITHOUT_POLICY=1 runs the matrix without the policies: every
// "policy" cell then fails, which shows that the policies, not RBAC, make
// those denials.

const (
	allow  = "allow"
	byRBAC = "RBAC"
	byVAP  = "policy"
)

// identity is a sidecar ServiceAccount the matrix impersonates.
type identity struct {
	key, title string
	ns, sa     string
	pod        string
}

// matrixRow is one request and what each identity gets.
type matrixRow struct {
	resource, action string
	// own, peer, caller, foreign
	want [4]string
	do   func(ctx context.Context, f *fixtures, c dynamic.Interface, dryRun []string) error
}

// fixtures are the objects the requests target, in namespace a.
type fixtures struct {
	a, b                       string
	alpha, beta                *hcpv1alpha1.Callee
	client, other              *hcpv1alpha1.Caller
	session                    *hcpv1alpha1.HCPSession // alpha's, caller client, podName alpha-0
	moved                      *hcpv1alpha1.HCPSession // alpha's, podName alpha-1 (another replica)
	otherCallers               *hcpv1alpha1.HCPSession // alpha's, caller "other"
	pod                        *corev1.Pod
	configMap                  *corev1.ConfigMap
	secret                     *corev1.Secret
	event                      *corev1.Event
	lease                      *coordinationv1.Lease
	deployment                 *appsv1.Deployment
	policy                     *hcpv1alpha1.CapabilityPolicy
	scheme                     *runtime.Scheme
	ownPod, peerPod, callerPod string
}

var (
	gvrSessions   = hcpv1alpha1.GroupVersion.WithResource("hcpsessions")
	gvrCallees    = hcpv1alpha1.GroupVersion.WithResource("callees")
	gvrCallers    = hcpv1alpha1.GroupVersion.WithResource("callers")
	gvrPolicies   = hcpv1alpha1.GroupVersion.WithResource("capabilitypolicies")
	gvrPods       = corev1.SchemeGroupVersion.WithResource("pods")
	gvrConfigMaps = corev1.SchemeGroupVersion.WithResource("configmaps")
	gvrSecrets    = corev1.SchemeGroupVersion.WithResource("secrets")
	gvrEvents     = corev1.SchemeGroupVersion.WithResource("events")
	gvrEventsV1   = eventsv1.SchemeGroupVersion.WithResource("events")
	gvrLeases     = coordinationv1.SchemeGroupVersion.WithResource("leases")
	gvrDeploys    = appsv1.SchemeGroupVersion.WithResource("deployments")
)

func TestSidecarAuthorizationMatrix(t *testing.T) {
	withoutPolicy := os.Getenv("HCP_AUTHZ_WITHOUT_POLICY") == "1"
	ctx := t.Context()
	f := setUpMatrix(t)
	ids := []identity{
		{key: "own", title: "own callee", ns: f.a, sa: saName(resource.ForCallee(f.alpha)), pod: f.ownPod},
		{key: "peer", title: "other callee, same namespace", ns: f.a, sa: saName(resource.ForCallee(f.beta)), pod: f.peerPod},
		{key: "caller", title: "caller", ns: f.a, sa: saName(resource.ForCaller(f.client)), pod: f.callerPod},
		{key: "foreign", title: "callee, other namespace", ns: f.b, sa: saName(resource.ForCallee(f.alpha)), pod: f.ownPod},
	}
	clients := make([]dynamic.Interface, len(ids))
	for i, id := range ids {
		clients[i] = impersonate(t, id)
	}
	if !withoutPolicy {
		installAdmissionPolicies(t)
		waitForPolicies(t, f, clients)
	} else {
		t.Log("HCP_AUTHZ_WITHOUT_POLICY=1: the ValidatingAdmissionPolicies are not installed")
	}

	rows := matrixRows()
	dryRun := []string{metav1.DryRunAll}
	got := make([][4]string, len(rows))
	mismatches := 0
	var details []string
	for r, row := range rows {
		for i := range ids {
			err := row.do(ctx, f, clients[i], dryRun)
			cell, cerr := classify(err)
			if cerr != nil {
				t.Errorf("%s %s as %s: unexpected error (a fixture problem, not an authorization answer): %v", row.resource, row.action, ids[i].key, cerr)
				cell = "error"
			}
			got[r][i] = cell
			if cell != row.want[i] {
				mismatches++
				msg := ""
				if err != nil {
					msg = ": " + err.Error()
				}
				details = append(details, fmt.Sprintf("%s | %s | %s: got %s, want %s%s", row.resource, row.action, ids[i].key, cell, row.want[i], msg))
			}
		}
	}
	total := len(rows) * len(ids)
	t.Logf("authorization matrix: %d requests, %d match the expectation (%.1f%%)", total, total-mismatches, 100*float64(total-mismatches)/float64(total))
	if mismatches > 0 {
		gotRows := make([]matrixRow, len(rows))
		for r := range rows {
			gotRows[r] = rows[r]
			gotRows[r].want = got[r]
		}
		t.Errorf("%d of %d cells differ from the expectation:\n%s\n\nthe matrix as observed:\n%s", mismatches, total, strings.Join(details, "\n"), matrixMarkdown(gotRows))
	}
	checkDocsMatrix(t, rows)
	if !withoutPolicy {
		checkUnboundToken(t, f, ids[0], rows)
	}
}

// checkUnboundToken: the own callee's ServiceAccount with a token not bound
// to a pod (no authentication.kubernetes.io/pod-name) still writes its
// sessions, but cannot change status.podName.
func checkUnboundToken(t *testing.T, f *fixtures, own identity, rows []matrixRow) {
	t.Helper()
	own.pod = ""
	cfg := rest.CopyConfig(testEnv.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + own.ns + ":" + own.sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + own.ns, "system:authenticated"},
	}
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"patch (state)":                               allow,
		"patch (sequence ceiling annotation)":         allow,
		"patch (podName: take over from another pod)": byVAP,
		"patch (podName: release own pod's session)":  byVAP,
	}
	for _, r := range rows {
		w, ok := want[r.action]
		if !ok {
			continue
		}
		err := r.do(t.Context(), f, c, []string{metav1.DryRunAll})
		if got, cerr := classify(err); cerr != nil || got != w {
			t.Errorf("%s %s with a token not bound to a pod: got %s (%v), want %s", r.resource, r.action, got, err, w)
		}
	}
}

// classify turns a request's error into a cell: allow, RBAC or policy.
func classify(err error) (string, error) {
	switch {
	case err == nil:
		return allow, nil
	case strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
		return byVAP, nil
	case apierrors.IsForbidden(err):
		return byRBAC, nil
	}
	return "", err
}

func saName(s resource.Subject) string { return resource.ServiceAccount(s).Name }

func impersonate(t *testing.T, id identity) dynamic.Interface {
	t.Helper()
	cfg := rest.CopyConfig(testEnv.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + id.ns + ":" + id.sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + id.ns, "system:authenticated"},
		// What a pod-bound token (the sidecar's projected token) carries.
		Extra: map[string][]string{"authentication.kubernetes.io/pod-name": {id.pod}},
	}
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// setUpMatrix creates the Callees, Callers, their sidecars' ServiceAccounts,
// Roles and RoleBindings, and the target objects.
func setUpMatrix(t *testing.T) *fixtures {
	t.Helper()
	ctx := t.Context()
	f := &fixtures{a: newNamespace(t, "authz-a-"), b: newNamespace(t, "authz-b-"), scheme: testEnv.Scheme,
		ownPod: "hcp-callee-alpha-0", peerPod: "hcp-callee-beta-0", callerPod: "hcp-caller-client-0"}
	dumpOnFailure(t, f.a)
	// Ids differ from names, so the policies must use the ids in effect.
	f.alpha = newCallee(f.a, "alpha", func(c *hcpv1alpha1.Callee) { c.Spec.CalleeID = "alpha-id" })
	f.beta = newCallee(f.a, "beta", func(c *hcpv1alpha1.Callee) { c.Spec.CalleeID = "beta-id" })
	// With a harness: the manager removes the RBAC of a Caller without one.
	f.client = newCaller(f.a, "client", func(c *hcpv1alpha1.Caller) {
		c.Spec.CallerID = "client-id"
		c.Spec.Harness = &hcpv1alpha1.HarnessSpec{Port: 3000, Template: harnessTemplate("example.com/app:1")}
	})
	f.other = newCaller(f.a, "other", func(c *hcpv1alpha1.Caller) { c.Spec.CallerID = "other-id" })
	alphaB := newCallee(f.b, "alpha", func(c *hcpv1alpha1.Callee) { c.Spec.CalleeID = "alpha-id" })
	create(t, f.alpha, f.beta, f.client, f.other, alphaB)
	for _, s := range []resource.Subject{resource.ForCallee(f.alpha), resource.ForCallee(f.beta), resource.ForCaller(f.client), resource.ForCallee(alphaB)} {
		installSidecarRBAC(t, s)
	}

	f.session = f.newSession(uuid.NewString(), "client-id")
	f.moved = f.newSession(uuid.NewString(), "client-id")
	f.otherCallers = f.newSession(uuid.NewString(), "other-id")
	create(t, f.session, f.moved, f.otherCallers)
	setPod := func(hs *hcpv1alpha1.HCPSession, pod string) {
		hs.Status = hcpv1alpha1.HCPSessionStatus{State: hcpv1alpha1.SessionRunning, PodName: pod, LastSequence: 3, EventCount: 3, CallerAckedSequence: 1}
		if err := k8sClient.Status().Update(ctx, hs); err != nil {
			t.Fatalf("status of %s: %v", hs.Name, err)
		}
	}
	setPod(f.session, f.ownPod)
	setPod(f.moved, "hcp-callee-alpha-1")
	setPod(f.otherCallers, f.ownPod)

	f.pod = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: f.ownPod, Namespace: f.a, Labels: map[string]string{"authz": "fixture"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.com/c:1"}}, AutomountServiceAccountToken: ptr.To(false)},
	}
	// alpha's checkpoint of f.session, labelled as its sidecar labels it.
	f.configMap = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hcp-session-" + f.session.Name, Namespace: f.a,
		Labels: map[string]string{hcpv1alpha1.LabelCallee: f.alpha.Name}}, Data: map[string]string{"k": "v"}}
	f.secret = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "authz-fixture", Namespace: f.a}, StringData: map[string]string{"password": "x"}}
	f.event = &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "alpha.fixture", Namespace: f.a},
		InvolvedObject: corev1.ObjectReference{Kind: "HCPSession", Namespace: f.a, Name: f.session.Name},
		Reason:         "Fixture", Message: "fixture", Type: corev1.EventTypeNormal,
	}
	f.lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "hcp-sidecar-" + f.ownPod, Namespace: f.a}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(f.ownPod)}}
	f.deployment = &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "authz-fixture", Namespace: f.a},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"authz": "fixture"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"authz": "fixture"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.com/c:1"}}},
			},
		},
	}
	f.policy = &hcpv1alpha1.CapabilityPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "authz-fixture", Namespace: f.a},
		Spec: hcpv1alpha1.CapabilityPolicySpec{Rules: []hcpv1alpha1.PolicyRule{{
			Callers: hcpv1alpha1.CallerMatch{IDs: []string{"client-id"}}, Capabilities: []string{"cvd.run"}, MaxRiskLevel: hcpv1alpha1.RiskR2,
		}}},
	}
	create(t, f.pod, f.configMap, f.secret, f.event, f.lease, f.deployment, f.policy)
	return f
}

// installSidecarRBAC creates the sidecar's ServiceAccount and its rights
// exactly as resource builds them (the manager may have applied them
// already): a callee's RoleBinding to the callee sidecars' ClusterRole
// (installed by the suite from config/rbac), a caller's Role and
// RoleBinding.
func installSidecarRBAC(t *testing.T, s resource.Subject) {
	t.Helper()
	ctx := t.Context()
	objs := []client.Object{resource.ServiceAccount(s)}
	if s.Role == topology.RoleCallee {
		objs = append(objs, resource.CalleeRoleBinding(s, resource.DefaultCalleeSidecarClusterRole))
	} else {
		objs = append(objs, resource.Role(s), resource.RoleBinding(s))
	}
	for _, o := range objs {
		if err := k8sClient.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// newSession is an HCPSession of alpha, as the callee sidecar creates it
// (internal/sidecar/callee newHCPSession).
func (f *fixtures) newSession(sid, callerID string) *hcpv1alpha1.HCPSession {
	return &hcpv1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{
			Name: sid, Namespace: f.a,
			Labels: map[string]string{
				hcpv1alpha1.LabelCalleeID: f.alpha.ID(), hcpv1alpha1.LabelCallerID: callerID,
				hcpv1alpha1.LabelCallee: f.alpha.Name, hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue,
				hcpv1alpha1.LabelSessionState: string(hcpv1alpha1.SessionPending),
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: hcpv1alpha1.GroupVersion.String(), Kind: "Callee", Name: f.alpha.Name, UID: f.alpha.UID, Controller: ptr.To(true),
			}},
		},
		Spec: hcpv1alpha1.HCPSessionSpec{
			SessionID: sid, CalleeID: f.alpha.ID(), CallerID: callerID, Capability: "cvd.run",
			TaskMessageID: uuid.NewString(), RiskLevel: hcpv1alpha1.RiskR2, MaxDuration: "PT1H",
		},
	}
}

// unstructuredOf converts a typed object for the dynamic client.
func (f *fixtures) unstructuredOf(o client.Object) *unstructured.Unstructured {
	gvk, err := apiutil.GVKForObject(o, f.scheme)
	if err != nil {
		panic(err)
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		panic(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	u.SetResourceVersion("")
	u.SetUID("")
	u.SetCreationTimestamp(metav1.Time{})
	u.SetManagedFields(nil)
	return u
}

// Request builders. Each returns the error of one request.

func get(gvr schema.GroupVersionResource, ns func(*fixtures) string, name func(*fixtures) string, sub ...string) func(context.Context, *fixtures, dynamic.Interface, []string) error {
	return func(ctx context.Context, f *fixtures, c dynamic.Interface, _ []string) error {
		_, err := c.Resource(gvr).Namespace(ns(f)).Get(ctx, name(f), metav1.GetOptions{}, sub...)
		return err
	}
}

func list(gvr schema.GroupVersionResource, byName func(*fixtures) string) func(context.Context, *fixtures, dynamic.Interface, []string) error {
	return func(ctx context.Context, f *fixtures, c dynamic.Interface, _ []string) error {
		opts := metav1.ListOptions{}
		if byName != nil {
			opts.FieldSelector = "metadata.name=" + byName(f)
		}
		_, err := c.Resource(gvr).Namespace(f.a).List(ctx, opts)
		return err
	}
}

func watch(gvr schema.GroupVersionResource, byName func(*fixtures) string) func(context.Context, *fixtures, dynamic.Interface, []string) error {
	return func(ctx context.Context, f *fixtures, c dynamic.Interface, _ []string) error {
		opts := metav1.ListOptions{TimeoutSeconds: ptr.To[int64](1)}
		if byName != nil {
			opts.FieldSelector = "metadata.name=" + byName(f)
		}
		w, err := c.Resource(gvr).Namespace(f.a).Watch(ctx, opts)
		if err == nil {
			w.Stop()
		}
		return err
	}
}

// createOf creates (dry-run) the object build returns, under a new name.
func createOf(gvr schema.GroupVersionResource, build func(*fixtures) client.Object) func(context.Context, *fixtures, dynamic.Interface, []string) error {
	return func(ctx context.Context, f *fixtures, c dynamic.Interface, dryRun []string) error {
		u := f.unstructuredOf(build(f))
		_, err := c.Resource(gvr).Namespace(f.a).Create(ctx, u, metav1.CreateOptions{DryRun: dryRun})
		return err
	}
}

// updateOf reads the object (as the admin), changes it and PUTs it.
func updateOf(gvr schema.GroupVersionResource, obj func(*fixtures) client.Object, mutate func(*unstructured.Unstructured), sub ...string) func(context.Context, *fixtures, dynamic.Interface, []string) error {
	return func(ctx context.Context, f *fixtures, c dynamic.Interface, dryRun []string) error {
		o := obj(f)
		admin, err := dynamic.NewForConfig(testEnv.Config)
		if err != nil {
			return err
		}
		u, err := admin.Resource(gvr).Namespace(o.GetNamespace()).Get(ctx, o.GetName(), metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("fixture: %w", err)
		}
		mutate(u)
		if len(sub) > 0 {
			_, err = c.Resource(gvr).Namespace(o.GetNamespace()).UpdateStatus(ctx, u, metav1.UpdateOptions{DryRun: dryRun})
		} else {
			_, err = c.Resource(gvr).Namespace(o.GetNamespace()).Update(ctx, u, metav1.UpdateOptions{DryRun: dryRun})
		}
		return err
	}
}

// patchOf sends a JSON merge patch.
func patchOf(gvr schema.GroupVersionResource, obj func(*fixtures) client.Object, patch string, sub ...string) func(context.Context, *fixtures, dynamic.Interface, []string) error {
	return func(ctx context.Context, f *fixtures, c dynamic.Interface, dryRun []string) error {
		o := obj(f)
		_, err := c.Resource(gvr).Namespace(o.GetNamespace()).Patch(ctx, o.GetName(), types.MergePatchType, []byte(patch), metav1.PatchOptions{DryRun: dryRun}, sub...)
		return err
	}
}

func deleteOf(gvr schema.GroupVersionResource, obj func(*fixtures) client.Object) func(context.Context, *fixtures, dynamic.Interface, []string) error {
	return func(ctx context.Context, f *fixtures, c dynamic.Interface, dryRun []string) error {
		o := obj(f)
		return c.Resource(gvr).Namespace(o.GetNamespace()).Delete(ctx, o.GetName(), metav1.DeleteOptions{DryRun: dryRun})
	}
}

func deleteCollectionOf(gvr schema.GroupVersionResource) func(context.Context, *fixtures, dynamic.Interface, []string) error {
	return func(ctx context.Context, f *fixtures, c dynamic.Interface, dryRun []string) error {
		return c.Resource(gvr).Namespace(f.a).DeleteCollection(ctx, metav1.DeleteOptions{DryRun: dryRun}, metav1.ListOptions{LabelSelector: "authz=none"})
	}
}

func nsA(f *fixtures) string { return f.a }

// renamed returns a fresh copy of o (metadata reset, new name).
func renamed[T client.Object](o T, name string) T {
	c := o.DeepCopyObject().(T)
	c.SetName(name)
	c.SetResourceVersion("")
	c.SetUID("")
	return c
}

// standardRows are the verbs on a kind the policies do not cover.
func standardRows(res string, gvr schema.GroupVersionResource, obj func(*fixtures) client.Object, mutate func(*unstructured.Unstructured), patch string,
	read, write [4]string, fresh func(*fixtures) client.Object,
) []matrixRow {
	name := func(f *fixtures) string { return obj(f).GetName() }
	return []matrixRow{
		{res, "get", read, get(gvr, nsA, name)},
		{res, "list", read, list(gvr, nil)},
		{res, "watch", read, watch(gvr, nil)},
		{res, "create", write, createOf(gvr, fresh)},
		{res, "update", write, updateOf(gvr, obj, mutate)},
		{res, "patch", write, patchOf(gvr, obj, patch)},
		{res, "delete", write, deleteOf(gvr, obj)},
	}
}

func row(own, peer, caller, foreign string) [4]string { return [4]string{own, peer, caller, foreign} }

// matrixRows is the expectation: every request, and what each identity
// gets (own, peer, caller, foreign).
func matrixRows() []matrixRow {
	sess := func(f *fixtures) client.Object { return f.session }
	moved := func(f *fixtures) client.Object { return f.moved }
	otherCallers := func(f *fixtures) client.Object { return f.otherCallers }
	sessName := func(f *fixtures) string { return f.session.Name }
	const (
		hs  = "hcpsessions"
		hss = "hcpsessions/status"
	)
	label := func(k, v string) func(*unstructured.Unstructured) {
		return func(u *unstructured.Unstructured) {
			l := u.GetLabels()
			if l == nil {
				l = map[string]string{}
			}
			l[k] = v
			u.SetLabels(l)
		}
	}
	status := func(field string, v any) func(*unstructured.Unstructured) {
		return func(u *unstructured.Unstructured) {
			if err := unstructured.SetNestedField(u.Object, v, "status", field); err != nil {
				panic(err)
			}
		}
	}
	newSession := func(calleeID string) func(*fixtures) client.Object {
		return func(f *fixtures) client.Object {
			hs := f.newSession(uuid.NewString(), "client-id")
			hs.Spec.CalleeID = calleeID
			hs.Labels[hcpv1alpha1.LabelCalleeID] = calleeID
			return hs
		}
	}
	rows := []matrixRow{
		// The sessions of alpha.
		{hs, "get", row(allow, allow, allow, byRBAC), get(gvrSessions, nsA, sessName)},
		{hs, "list", row(allow, allow, allow, byRBAC), list(gvrSessions, nil)},
		{hs, "watch", row(allow, allow, allow, byRBAC), watch(gvrSessions, nil)},
		{hs, "create (a session of alpha)", row(allow, byVAP, byRBAC, byRBAC), createOf(gvrSessions, newSession("alpha-id"))},
		{hs, "create (label hcp.io/callee alpha, spec.calleeID of beta)", row(byVAP, byVAP, byRBAC, byRBAC), createOf(gvrSessions, newSession("beta-id"))},
		{hs, "create (owned by another object)", row(byVAP, byVAP, byRBAC, byRBAC), createOf(gvrSessions, func(f *fixtures) client.Object {
			hs := f.newSession(uuid.NewString(), "client-id")
			hs.OwnerReferences[0].Kind, hs.OwnerReferences[0].Name, hs.OwnerReferences[0].UID = "Callee", f.beta.Name, f.beta.UID
			return hs
		})},
		{hs, "update (label hcp.io/state)", row(allow, byVAP, byRBAC, byRBAC), updateOf(gvrSessions, sess, label(hcpv1alpha1.LabelSessionState, "RUNNING"))},
		{hs, "patch (sequence ceiling annotation)", row(allow, byVAP, byRBAC, byRBAC), patchOf(gvrSessions, sess, `{"metadata":{"annotations":{"hcp.io/sequence-ceiling":"2048"}}}`)},
		{hs, "patch (annotation hcp.io/admitted)", row(byVAP, byVAP, byRBAC, byRBAC), patchOf(gvrSessions, sess, `{"metadata":{"annotations":{"hcp.io/admitted":"true"}}}`)},
		{hs, "patch (spec.abortRequested)", row(allow, byVAP, byRBAC, byRBAC), patchOf(gvrSessions, sess, `{"spec":{"abortRequested":true}}`)},
		{hs, "patch (label hcp.io/callee to beta)", row(byVAP, byVAP, byRBAC, byRBAC), patchOf(gvrSessions, sess, `{"metadata":{"labels":{"hcp.io/callee":"beta"}}}`)},
		{hs, "patch (label hcp.io/caller-id)", row(byVAP, byVAP, byRBAC, byRBAC), patchOf(gvrSessions, sess, `{"metadata":{"labels":{"hcp.io/caller-id":"other-id"}}}`)},
		{hs, "patch (remove ownerReferences)", row(byVAP, byVAP, byRBAC, byRBAC), patchOf(gvrSessions, sess, `{"metadata":{"ownerReferences":null}}`)},
		{hs, "delete", row(allow, byVAP, byRBAC, byRBAC), deleteOf(gvrSessions, sess)},
		{hs, "delete (a session of another replica)", row(allow, byVAP, byRBAC, byRBAC), deleteOf(gvrSessions, moved)},
		{hs, "deletecollection", row(byRBAC, byRBAC, byRBAC, byRBAC), deleteCollectionOf(gvrSessions)},

		{hss, "get", row(allow, allow, allow, byRBAC), get(gvrSessions, nsA, sessName, "status")},
		{hss, "update (lastSequence)", row(allow, byVAP, byVAP, byRBAC), updateOf(gvrSessions, sess, status("lastSequence", int64(4)), "status")},
		{hss, "patch (state)", row(allow, byVAP, byVAP, byRBAC), patchOf(gvrSessions, sess, `{"status":{"state":"COMPLETED"}}`, "status")},
		{hss, "patch (callerAckedSequence)", row(allow, byVAP, allow, byRBAC), patchOf(gvrSessions, sess, `{"status":{"callerAckedSequence":2}}`, "status")},
		{hss, "patch (callerAckedSequence of a session of another caller)", row(allow, byVAP, byVAP, byRBAC), patchOf(gvrSessions, otherCallers, `{"status":{"callerAckedSequence":2}}`, "status")},
		{hss, "patch (podName: take over from another pod)", row(allow, byVAP, byVAP, byRBAC), patchOf(gvrSessions, moved, `{"status":{"podName":"hcp-callee-alpha-0"}}`, "status")},
		{hss, "patch (podName: release own pod's session)", row(allow, byVAP, byVAP, byRBAC), patchOf(gvrSessions, sess, `{"status":{"podName":""}}`, "status")},
		{hss, "patch (podName: to another pod)", row(byVAP, byVAP, byVAP, byRBAC), patchOf(gvrSessions, sess, `{"status":{"podName":"hcp-callee-alpha-2"}}`, "status")},
		{hss, "patch (podName: release another pod's session)", row(byVAP, byVAP, byVAP, byRBAC), patchOf(gvrSessions, moved, `{"status":{"podName":""}}`, "status")},

		// alpha's Callee, and the Caller client.
		// Every callee sidecar holds one ClusterRole: it reads the Callees
		// of its namespace, as it reads their Callers.
		{"callees", "get", row(allow, allow, byRBAC, byRBAC), get(gvrCallees, nsA, func(f *fixtures) string { return f.alpha.Name })},
		{"callees", "list", row(allow, allow, byRBAC, byRBAC), list(gvrCallees, nil)},
		{"callees", "list (metadata.name=alpha)", row(allow, allow, byRBAC, byRBAC), list(gvrCallees, func(f *fixtures) string { return f.alpha.Name })},
		{"callees", "watch", row(allow, allow, byRBAC, byRBAC), watch(gvrCallees, nil)},
		{"callees", "watch (metadata.name=alpha)", row(allow, allow, byRBAC, byRBAC), watch(gvrCallees, func(f *fixtures) string { return f.alpha.Name })},
		{"callees", "create", row(byRBAC, byRBAC, byRBAC, byRBAC), createOf(gvrCallees, func(f *fixtures) client.Object { return renamed(f.alpha, "gamma") })},
		{"callees", "update", row(byRBAC, byRBAC, byRBAC, byRBAC), updateOf(gvrCallees, func(f *fixtures) client.Object { return f.alpha }, label("x", "y"))},
		{"callees", "patch", row(byRBAC, byRBAC, byRBAC, byRBAC), patchOf(gvrCallees, func(f *fixtures) client.Object { return f.alpha }, `{"metadata":{"labels":{"x":"y"}}}`)},
		{"callees", "delete", row(byRBAC, byRBAC, byRBAC, byRBAC), deleteOf(gvrCallees, func(f *fixtures) client.Object { return f.alpha })},

		{"callers", "get", row(allow, allow, allow, byRBAC), get(gvrCallers, nsA, func(f *fixtures) string { return f.client.Name })},
		{"callers", "list", row(allow, allow, byRBAC, byRBAC), list(gvrCallers, nil)},
		{"callers", "list (metadata.name=client)", row(allow, allow, allow, byRBAC), list(gvrCallers, func(f *fixtures) string { return f.client.Name })},
		{"callers", "watch", row(allow, allow, byRBAC, byRBAC), watch(gvrCallers, nil)},
		{"callers", "watch (metadata.name=client)", row(allow, allow, allow, byRBAC), watch(gvrCallers, func(f *fixtures) string { return f.client.Name })},
		{"callers", "get (another Caller)", row(allow, allow, byRBAC, byRBAC), get(gvrCallers, nsA, func(f *fixtures) string { return f.other.Name })},
		{"callers", "create", row(byRBAC, byRBAC, byRBAC, byRBAC), createOf(gvrCallers, func(f *fixtures) client.Object { return renamed(f.client, "client2") })},
		{"callers", "update", row(byRBAC, byRBAC, byRBAC, byRBAC), updateOf(gvrCallers, func(f *fixtures) client.Object { return f.client }, label("x", "y"))},
		{"callers", "patch", row(byRBAC, byRBAC, byRBAC, byRBAC), patchOf(gvrCallers, func(f *fixtures) client.Object { return f.client }, `{"metadata":{"labels":{"x":"y"}}}`)},
		{"callers", "delete", row(byRBAC, byRBAC, byRBAC, byRBAC), deleteOf(gvrCallers, func(f *fixtures) client.Object { return f.client })},
	}
	calleeRead, denied := row(allow, allow, byRBAC, byRBAC), row(byRBAC, byRBAC, byRBAC, byRBAC)
	rows = append(rows, standardRows("capabilitypolicies", gvrPolicies, func(f *fixtures) client.Object { return f.policy }, label("x", "y"), `{"metadata":{"labels":{"x":"y"}}}`,
		calleeRead, denied, func(f *fixtures) client.Object { return renamed(f.policy, "authz-new") })...)
	// Pods: get only, for both sidecars.
	rows = append(rows, standardRows("pods", gvrPods, func(f *fixtures) client.Object { return f.pod }, label("x", "y"), `{"metadata":{"labels":{"x":"y"}}}`,
		row(allow, allow, allow, byRBAC), denied, func(f *fixtures) client.Object { return renamed(f.pod, "authz-new") })...)
	rows[len(rows)-6].want = denied // list
	rows[len(rows)-5].want = denied // watch
	// Leases and ConfigMaps: get, create, update (callee sidecars).
	for _, k := range []struct {
		res string
		gvr schema.GroupVersionResource
		obj func(*fixtures) client.Object
	}{
		{"leases", gvrLeases, func(f *fixtures) client.Object { return f.lease }},
		{"configmaps", gvrConfigMaps, func(f *fixtures) client.Object { return f.configMap }},
	} {
		obj := k.obj
		rs := standardRows(k.res, k.gvr, obj, label("x", "y"), `{"metadata":{"labels":{"x":"y"}}}`,
			calleeRead, denied, func(f *fixtures) client.Object { return renamed(obj(f), "authz-new") })
		rs[1].want, rs[2].want = denied, denied // list, watch
		// create (a new name that is neither a checkpoint nor the own
		// pod's Lease), update (alpha's checkpoint, alpha-0's Lease):
		// each callee sidecar only its own (policy 4).
		rs[3].want, rs[4].want = row(byVAP, byVAP, byRBAC, byRBAC), row(allow, byVAP, byRBAC, byRBAC)
		rows = append(rows, rs...)
	}
	rows = append(rows,
		matrixRow{"configmaps", "create (a checkpoint of alpha)", row(allow, byVAP, byRBAC, byRBAC),
			createOf(gvrConfigMaps, func(f *fixtures) client.Object { return renamed(f.configMap, "hcp-session-new") })},
		matrixRow{"configmaps", "update (relabel alpha's checkpoint to beta)", row(byVAP, byVAP, byRBAC, byRBAC),
			updateOf(gvrConfigMaps, func(f *fixtures) client.Object { return f.configMap }, label(hcpv1alpha1.LabelCallee, "beta"))},
	)
	rows = append(rows, standardRows("secrets", gvrSecrets, func(f *fixtures) client.Object { return f.secret }, label("x", "y"), `{"metadata":{"labels":{"x":"y"}}}`,
		denied, denied, func(f *fixtures) client.Object { return renamed(f.secret, "authz-new") })...)
	// Events: create and patch, in both API groups.
	for _, k := range []struct {
		res string
		gvr schema.GroupVersionResource
		new func(*fixtures) client.Object
	}{
		{"events", gvrEvents, func(f *fixtures) client.Object { return renamed(f.event, "alpha.new") }},
		{"events (events.k8s.io)", gvrEventsV1, func(f *fixtures) client.Object {
			return &eventsv1.Event{
				ObjectMeta: metav1.ObjectMeta{Name: "alpha.new", Namespace: f.a}, EventTime: metav1.NewMicroTime(time.Now()),
				ReportingController: "hcp.io/hcp-sidecar", ReportingInstance: f.ownPod, Action: "Fixture", Reason: "Fixture", Type: corev1.EventTypeNormal,
				Regarding: corev1.ObjectReference{Kind: "HCPSession", Namespace: f.a, Name: f.session.Name},
			}
		}},
	} {
		rs := standardRows(k.res, k.gvr, func(f *fixtures) client.Object { return f.event }, label("x", "y"), `{"metadata":{"labels":{"x":"y"}}}`,
			denied, denied, k.new)
		both := row(allow, allow, allow, byRBAC)
		rs[3].want, rs[5].want = both, both // create, patch
		rows = append(rows, rs...)
	}
	rows = append(rows, standardRows("deployments", gvrDeploys, func(f *fixtures) client.Object { return f.deployment }, label("x", "y"), `{"metadata":{"labels":{"x":"y"}}}`,
		denied, denied, func(f *fixtures) client.Object { return renamed(f.deployment, "authz-new") })...)
	return rows
}

// admissionPolicyFile holds the policies and bindings, as installed by
// config/default and (templated) the chart.
const admissionPolicyFile = "config/admission/sidecar-sessions.yaml"

// readAdmissionObjects parses a multi-document YAML file.
func readAdmissionObjects(t *testing.T, raw []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if len(u.Object) == 0 {
			continue
		}
		objs = append(objs, u)
	}
	return objs
}

func repoFile(t *testing.T, rel string) []byte {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// installAdmissionPolicies creates the policies and bindings of
// config/admission; they go when the test ends (they are cluster-wide).
func installAdmissionPolicies(t *testing.T) {
	t.Helper()
	objs := readAdmissionObjects(t, repoFile(t, admissionPolicyFile))
	if len(objs) != 8 {
		t.Fatalf("%s: %d objects, want 4 policies and 4 bindings", admissionPolicyFile, len(objs))
	}
	for _, u := range objs {
		if err := k8sClient.Create(t.Context(), u); err != nil {
			t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := k8sClient.Delete(ctx, u); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s %s: %v", u.GetKind(), u.GetName(), err)
			}
		})
	}
}

// waitForPolicies polls until a request each policy alone denies is denied:
// bindings and their parameters reach the admission plugin asynchronously.
func waitForPolicies(t *testing.T, f *fixtures, clients []dynamic.Interface) {
	t.Helper()
	rows := matrixRows()
	probes := map[string]int{}                                               // action -> identity
	probes["create (a session of alpha)"] = 1                                // policy 1 (peer)
	probes["create (label hcp.io/callee alpha, spec.calleeID of beta)"] = 0  // policy 2 (own)
	probes["patch (callerAckedSequence of a session of another caller)"] = 2 // policy 3 (caller)
	probes["create (a checkpoint of alpha)"] = 1                             // policy 4 (peer)
	for _, r := range rows {
		i, ok := probes[r.action]
		if !ok {
			continue
		}
		eventually(t, "policies in effect ("+r.action+")", func(ctx context.Context) error {
			err := r.do(ctx, f, clients[i], []string{metav1.DryRunAll})
			if cell, _ := classify(err); cell != byVAP {
				return fmt.Errorf("not yet denied by a policy: %v", err)
			}
			return nil
		})
	}
}

// matrixMarkdown renders rows as the table in docs/rbac.md.
func matrixMarkdown(rows []matrixRow) string {
	var b strings.Builder
	b.WriteString("| resource | request | own callee | other callee, same namespace | caller | callee, other namespace |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s |", r.resource, r.action)
		for _, c := range r.want {
			switch c {
			case allow:
				b.WriteString(" allow |")
			default:
				fmt.Fprintf(&b, " **%s** |", c)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

const (
	docsMatrixFile  = "docs/rbac.md"
	docsMatrixBegin = "<!-- authz-matrix:begin (generated by TestSidecarAuthorizationMatrix; HCP_UPDATE_DOCS=1 rewrites it) -->\n"
	docsMatrixEnd   = "<!-- authz-matrix:end -->\n"
)

// checkDocsMatrix fails when docs/rbac.md's table is not the expectation.
func checkDocsMatrix(t *testing.T, rows []matrixRow) {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, docsMatrixFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, docsMatrixBegin), strings.Index(doc, docsMatrixEnd)
	if i < 0 || j < i {
		t.Fatalf("%s: no %q ... %q section", docsMatrixFile, docsMatrixBegin, docsMatrixEnd)
	}
	want := matrixMarkdown(rows)
	if doc[i+len(docsMatrixBegin):j] == want {
		return
	}
	if os.Getenv("HCP_UPDATE_DOCS") == "1" {
		doc = doc[:i+len(docsMatrixBegin)] + want + doc[j:]
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: matrix rewritten", docsMatrixFile)
		return
	}
	t.Errorf("%s: the matrix differs from the test's expectation (HCP_UPDATE_DOCS=1 rewrites it); want:\n%s", docsMatrixFile, want)
}

// TestAdmissionPolicyListsEveryStatusField: the caller rule of
// hcp-sidecar-sessions lists every HCPSessionStatus field but
// callerAckedSequence; a field added to the API must be added there.
func TestAdmissionPolicyListsEveryStatusField(t *testing.T) {
	policy := string(repoFile(t, admissionPolicyFile))
	typ := reflect.TypeFor[hcpv1alpha1.HCPSessionStatus]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if name == "callerAckedSequence" {
			continue
		}
		clause := fmt.Sprintf("object.?status.?%s == oldObject.?status.?%s", name, name)
		if !strings.Contains(policy, clause) {
			t.Errorf("%s: the caller rule does not compare status.%s (%q)", admissionPolicyFile, name, clause)
		}
	}
}

// TestChartAdmissionPolicyMatchesConfig: the chart's template is
// config/admission with the chart's names and labels.
func TestChartAdmissionPolicyMatchesConfig(t *testing.T) {
	const tpl = "charts/hcp-operator/templates/sidecar-admission-policy.yaml"
	raw := string(repoFile(t, tpl))
	if !strings.HasPrefix(raw, "{{- if .Values.sidecarAdmissionPolicy.enabled }}\n") {
		t.Fatalf("%s: not guarded by .Values.sidecarAdmissionPolicy.enabled", tpl)
	}
	// Undo the templating: the guard, the labels, the name prefix.
	var lines []string
	for _, l := range strings.Split(raw, "\n") {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "{{- if") || strings.HasPrefix(trimmed, "{{- end") || strings.HasPrefix(trimmed, `{{- include "hcp-operator.labels"`) || trimmed == "labels:" {
			continue
		}
		lines = append(lines, strings.ReplaceAll(l, `{{ include "hcp-operator.fullname" . }}-`, ""))
	}
	rendered := strings.Join(lines, "\n")
	if strings.Contains(rendered, "{{") {
		t.Fatalf("%s: templating left after normalisation: %s", tpl, regexp.MustCompile(`.*\{\{.*`).FindString(rendered))
	}
	chart := readAdmissionObjects(t, []byte(rendered))
	config := readAdmissionObjects(t, repoFile(t, admissionPolicyFile))
	if len(chart) != len(config) {
		t.Fatalf("%s: %d objects, %s: %d", tpl, len(chart), admissionPolicyFile, len(config))
	}
	for i := range config {
		a, _ := yaml.Marshal(chart[i].Object)
		b, _ := yaml.Marshal(config[i].Object)
		if !bytes.Equal(a, b) {
			t.Errorf("%s object %d differs from %s:\n--- chart\n%s\n--- config\n%s", tpl, i, admissionPolicyFile, a, b)
		}
	}
}
