package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/util/csaupgrade"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// applyChildren applies the desired children of one group in table order
// and deletes the unwanted ones the owner controls. It returns the live
// children that were applied, in order; a child whose creation is held
// back (childKind.createAfter) is not among them.
func (c *core) applyChildren(ctx context.Context, owner client.Object, children []desiredChild) ([]client.Object, error) {
	var live []client.Object
	for _, ch := range children {
		if ch.obj == nil {
			if err := c.deleteOwned(ctx, owner, ch.empty); err != nil {
				return nil, err
			}
			continue
		}
		o, err := c.applyChild(ctx, owner, ch.kind, ch.obj, live)
		if err != nil {
			return nil, err
		}
		if o != nil {
			live = append(live, o)
		}
	}
	return live, nil
}

// applyChild applies desired with server-side apply under the operator's
// field manager (resource.FieldManager), forcing ownership of the fields
// it sets: it owns exactly what the builder sets, every other field
// (another controller's, a user's label) stays with its manager, and a
// field the builder stops setting is removed. A child the cache does not
// have is created instead (cheaper for the API server), and its fields
// move to the apply entry before its first apply (ownFieldsByApply), so
// the same holds. No request is sent when the cached live child already
// holds what desired sets (kind.upToDate, or holdsApplied), so a
// reconcile with nothing to change writes nothing. It
// returns the live child and notes the change for the owner's Event
// (noteChange); nil when its creation is held back (kind.createAfter
// over the children applied before it).
func (c *core) applyChild(ctx context.Context, owner client.Object, kind *childKind, desired client.Object, applied []client.Object) (client.Object, error) {
	gvk, err := apiutil.GVKForObject(desired, c.scheme)
	if err != nil {
		return nil, err
	}
	live := emptyLike(desired)
	key := client.ObjectKeyFromObject(desired)
	exists, viaAPI := true, false
	switch err := c.Get(ctx, key, live); {
	case apierrors.IsNotFound(err) && c.created.recent(gvk, key):
		// Created by this manager, not yet in the cache (createMemo).
		switch err := c.apiReader.Get(ctx, key, live); {
		case apierrors.IsNotFound(err):
			exists = false
		case err != nil:
			return nil, err
		default:
			viaAPI = true
			exists = metav1.IsControlledBy(live, owner)
		}
	case apierrors.IsNotFound(err):
		exists = false
	case err != nil:
		return nil, err
	default:
		c.created.seen(gvk, key)
	}
	if !exists && !viaAPI {
		if kind != nil && kind.createAfter != nil && !kind.createAfter(applied) {
			ctrl.LoggerFrom(ctx).V(1).Info("Child held back until what it needs is ready", "kind", gvk.Kind, "child", klog.KObj(desired))
			return nil, nil
		}
		// A create costs the API server less than an apply that creates
		// (0.1–2 ms of its CPU less per child: hack/apicost); at 200
		// Callees + 200 Callers the time to Ready fell by about 6 %
		// (docs/performance.md). The fields are the operator's through an
		// update entry until the first apply (ownFieldsByApply).
		obj := desired.DeepCopyObject().(client.Object)
		switch err := c.Create(ctx, obj); {
		case err == nil:
			c.created.created(gvk, key)
			c.noteApplied(ctx, owner, obj, gvk.Kind, controllerutil.OperationResultCreated)
			return obj, nil
		case !apierrors.IsAlreadyExists(err):
			return nil, fmt.Errorf("%s %s: %w", gvk.Kind, klog.KObj(desired), err)
		}
		// Created after the cached read (by another worker, or by this
		// owner's previous reconcile, whose create the cache has not
		// shown yet): apply over it, unless it already holds desired.
		if err := c.apiReader.Get(ctx, client.ObjectKeyFromObject(desired), live); err != nil {
			return nil, fmt.Errorf("%s %s: %w", gvk.Kind, klog.KObj(desired), err)
		}
		exists = metav1.IsControlledBy(live, owner)
	}
	cfg, err := applyConfiguration(desired, gvk.GroupVersion().String(), gvk.Kind)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk.Kind, klog.KObj(desired), err)
	}
	if exists {
		same := false
		if kind != nil && kind.upToDate != nil {
			same = kind.upToDate(live, desired)
		} else {
			same, err = holdsApplied(live, cfg)
			if err != nil {
				return nil, err
			}
		}
		if same {
			return live, nil
		}
	}
	if err := c.ownFieldsByApply(ctx, desired); err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk.Kind, klog.KObj(desired), err)
	}
	u := &unstructured.Unstructured{Object: cfg}
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(resource.FieldManager), client.ForceOwnership); err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk.Kind, klog.KObj(desired), err)
	}
	out := emptyLike(desired)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk.Kind, klog.KObj(desired), err)
	}
	op := controllerutil.OperationResultUpdated
	if !exists {
		op = controllerutil.OperationResultCreated
	}
	c.noteApplied(ctx, owner, out, gvk.Kind, op)
	return out, nil
}

// noteApplied logs a child's create or update and notes it for the
// owner's Event.
func (c *core) noteApplied(ctx context.Context, owner, obj client.Object, kind string, op controllerutil.OperationResult) {
	ctrl.LoggerFrom(ctx).Info("Applied child", "kind", kind, "child", klog.KObj(obj), "operation", op)
	c.noteChange(ctx, owner, obj, kind, verbOf(op))
}

// ownFieldsByApply moves the fields the operator owns through an update
// (its create of the child, applyChild) to its server-side apply entry,
// before the apply that follows: without it, a field the builder stopped
// setting would stay, still owned by the update entry. It reads the live
// child from the API server (the cache holds no managed fields) and sends
// a patch only when there is an update entry to move (client-go's
// csaupgrade, as kubectl does for client-side applied objects); the patch
// fails with a conflict if the child changed since the read.
func (c *core) ownFieldsByApply(ctx context.Context, desired client.Object) error {
	live := emptyLike(desired)
	if err := c.apiReader.Get(ctx, client.ObjectKeyFromObject(desired), live); err != nil {
		return client.IgnoreNotFound(err)
	}
	patch, err := csaupgrade.UpgradeManagedFieldsPatch(live, sets.New(resource.FieldManager), resource.FieldManager)
	if err != nil || patch == nil {
		return err
	}
	return c.Patch(ctx, live, client.RawPatch(types.JSONPatchType, patch))
}

// applyConfiguration is desired as a server-side apply configuration: its
// spec-like fields and the metadata the operator sets (name, namespace,
// labels, annotations, owner references), without status and without
// null values (a typed object's unset fields).
func applyConfiguration(desired client.Object, apiVersion, kind string) (map[string]any, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return nil, err
	}
	delete(m, "status")
	meta, _ := m["metadata"].(map[string]any)
	kept := map[string]any{}
	for _, k := range []string{"name", "namespace", "labels", "annotations", "ownerReferences"} {
		if v, ok := meta[k]; ok {
			kept[k] = v
		}
	}
	m["metadata"] = kept
	m["apiVersion"], m["kind"] = apiVersion, kind
	return pruneNulls(m).(map[string]any), nil
}

func pruneNulls(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if e == nil {
				delete(x, k)
				continue
			}
			x[k] = pruneNulls(e)
		}
	case []any:
		for i, e := range x {
			x[i] = pruneNulls(e)
		}
	}
	return v
}

// holdsApplied reports whether live already holds every value of cfg
// (but apiVersion and kind): maps are compared key by key (live may hold
// more keys: defaults, other managers' fields), lists element by element
// with the same length, other values by equality. An empty map in cfg
// holds whatever live has.
func holdsApplied(live client.Object, cfg map[string]any) (bool, error) {
	l, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if err != nil {
		return false, err
	}
	for k, want := range cfg {
		if k == "apiVersion" || k == "kind" {
			continue
		}
		if !contains(l[k], want) {
			return false, nil
		}
	}
	return true, nil
}

func contains(have, want any) bool {
	switch w := want.(type) {
	case map[string]any:
		if len(w) == 0 {
			return true
		}
		h, ok := have.(map[string]any)
		if !ok {
			return false
		}
		for k, wv := range w {
			if !contains(h[k], wv) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return false
		}
		for i := range w {
			if !contains(h[i], w[i]) {
				return false
			}
		}
		return true
	default:
		return equality.Semantic.DeepEqual(have, want)
	}
}

// deploymentUpToDate: a harness Deployment needs no apply while its
// replicas, metadata and the hashes of what the operator renders into the
// pod template (config, sidecar) match. The API server defaults many pod
// fields and other tools (admission, autoscalers) add some; the hashes say
// whether what the operator renders changed.
func deploymentUpToDate(live, desired client.Object) bool {
	l, d := live.(*appsv1.Deployment), desired.(*appsv1.Deployment)
	have, want := l.Spec.Template.Annotations, d.Spec.Template.Annotations
	return equality.Semantic.DeepEqual(l.Spec.Replicas, d.Spec.Replicas) &&
		have[hcpv1alpha1.AnnotationConfigHash] == want[hcpv1alpha1.AnnotationConfigHash] &&
		have[resource.AnnotationSidecarHash] == want[resource.AnnotationSidecarHash] &&
		metaHolds(l, d)
}

// metaHolds: live holds desired's labels, annotations and controller
// reference.
func metaHolds(live, desired client.Object) bool {
	return contains(toMap(live.GetLabels()), toMap(desired.GetLabels())) &&
		contains(toMap(live.GetAnnotations()), toMap(desired.GetAnnotations())) &&
		metaOwnedBy(live, desired)
}

// cachedRulesDigest is the annotation under which the cache keeps a
// Role's rulesDigest in place of its rules (trimRole). It exists only in
// the cache: the operator never writes a Role from a cached copy.
const cachedRulesDigest = "cache.hcp.io/rules-sha256"

// rulesDigest is the SHA-256 of rules as JSON. The API server does not
// default a rule's fields, so the digest of a Role's rules as stored
// equals that of the rules the builder made when they are the same.
func rulesDigest(rules []rbacv1.PolicyRule) string {
	b, err := json.Marshal(rules)
	if err != nil { // a []PolicyRule of strings always marshals
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// roleUpToDate: a Role needs no apply while its rules (their digest, in
// the trimmed cache) and its metadata hold what the builder makes.
func roleUpToDate(live, desired client.Object) bool {
	l, d := live.(*rbacv1.Role), desired.(*rbacv1.Role)
	have, cached := l.Annotations[cachedRulesDigest]
	if !cached { // read around the cache
		have = rulesDigest(l.Rules)
	}
	return have == rulesDigest(d.Rules) && metaHolds(l, d)
}

func toMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// metaOwnedBy: live carries desired's controller reference.
func metaOwnedBy(live, desired client.Object) bool {
	for _, want := range desired.GetOwnerReferences() {
		found := false
		for _, have := range live.GetOwnerReferences() {
			if have.UID == want.UID && equality.Semantic.DeepEqual(have.Controller, want.Controller) {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}
