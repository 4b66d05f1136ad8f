package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// TestManagerCache: in a watched namespace the manager's cache holds the
// operator's children and the Secrets labelled for the topology operator,
// not the namespace's other Secrets and Deployments; what it holds is
// trimmed (no managed fields, no kubectl last-applied copies, no session
// results, no harness pod spec), the trimming never reaches the API
// server, and reconciling still works from the trimmed copies.
func TestManagerCache(t *testing.T) {
	ns := newNamespace(t, "cache-")
	dumpOnFailure(t, ns)
	ctx := t.Context()
	cache := suiteManager.GetCache()

	lastApplied := map[string]string{corev1.LastAppliedConfigAnnotation: `{"apiVersion":"v1","kind":"Secret","stringData":{"password":"in-the-clear"}}`}
	plain := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}, StringData: map[string]string{"k": "v"}}
	conn := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "conn", Labels: map[string]string{resource.LabelTopologyOperator: "true"}, Annotations: lastApplied},
		StringData: map[string]string{"uri": "http://rabbitmq:15672", "username": "u", "password": "in-the-clear"},
	}
	foreign := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "foreign"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "foreign"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "foreign"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.com/foreign:1"}}},
			},
		},
	}
	callee := newCallee(ns, "lab", func(c *hcpv1alpha1.Callee) {
		c.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: `{"kind":"Callee","spec":"a second copy"}`}
	})
	// A Caller for a Role (a Callee's sidecar has none: it is bound to a
	// ClusterRole).
	caller := newCaller(ns, "agent", func(c *hcpv1alpha1.Caller) {
		c.Spec.Harness = &hcpv1alpha1.HarnessSpec{Template: harnessTemplate("example.com/agent:1"), Replicas: new(int32(0))}
	})
	create(t, plain, conn, foreign, callee, caller)
	base, credsName, _ := childNames("callee", "lab")
	callerBase, callerCreds, _ := childNames("caller", "agent")
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}
	eventually(t, "the Callee's children exist", all(
		exists(dep, callee),
		exists(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: credsName}}, callee),
	))

	names := func(l client.ObjectList) []string {
		var out []string
		for _, o := range mustExtract(t, l) {
			out = append(out, o.GetName())
		}
		slices.Sort(out)
		return out
	}
	eventually(t, "the cache holds exactly the labelled Secrets and the operator's Deployment", func(ctx context.Context) error {
		var secrets corev1.SecretList
		if err := cache.List(ctx, &secrets, client.InNamespace(ns)); err != nil {
			return err
		}
		var deps appsv1.DeploymentList
		if err := cache.List(ctx, &deps, client.InNamespace(ns)); err != nil {
			return err
		}
		if got, want := names(&secrets), []string{"conn", credsName, callerCreds}; !slices.Equal(got, want) {
			return fmt.Errorf("cached Secrets %v, want %v", got, want)
		}
		if got, want := names(&deps), []string{base, callerBase}; !slices.Equal(got, want) {
			return fmt.Errorf("cached Deployments %v, want %v", got, want)
		}
		return nil
	})
	for _, o := range []client.Object{plain, foreign} {
		if err := cache.Get(ctx, client.ObjectKeyFromObject(o), o.DeepCopyObject().(client.Object)); !apierrors.IsNotFound(err) {
			t.Errorf("cache.Get %T %s: %v, want NotFound (not cached)", o, o.GetName(), err)
		}
	}

	// Trimmed in the cache, whole on the server.
	var cachedConn, liveConn corev1.Secret
	mustGet(t, cache, key(ns, "conn"), &cachedConn)
	mustGet(t, k8sClient, key(ns, "conn"), &liveConn)
	if _, ok := cachedConn.Annotations[corev1.LastAppliedConfigAnnotation]; ok || cachedConn.ManagedFields != nil {
		t.Errorf("cached connection Secret keeps annotations %v, managed fields %d", cachedConn.Annotations, len(cachedConn.ManagedFields))
	}
	if string(cachedConn.Data["uri"]) != "http://rabbitmq:15672" {
		t.Errorf("cached connection Secret lost its data: %v", cachedConn.Data)
	}
	if _, ok := liveConn.Annotations[corev1.LastAppliedConfigAnnotation]; !ok || len(liveConn.ManagedFields) == 0 {
		t.Errorf("the server's connection Secret changed: annotations %v, managed fields %d", liveConn.Annotations, len(liveConn.ManagedFields))
	}

	// The harness Deployment: cached without its pod spec, whole on the
	// server.
	var cachedDep, liveDep appsv1.Deployment
	mustGet(t, cache, key(ns, base), &cachedDep)
	mustGet(t, k8sClient, key(ns, base), &liveDep)
	if n := len(cachedDep.Spec.Template.Spec.Containers); n != 0 || cachedDep.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash] == "" {
		t.Errorf("cached Deployment: %d containers (want none), template annotations %v (want the hashes)", n, cachedDep.Spec.Template.Annotations)
	}
	if len(liveDep.Spec.Template.Spec.Containers) == 0 {
		t.Errorf("the server's Deployment lost its containers: %v", liveDep.Spec.Template.Spec.Containers)
	}

	// The caller sidecar's Role: cached with a digest of its rules in
	// their place; a rule changed on the server changes the digest, and
	// the operator applies the Role again.
	var cachedRole, liveRole rbacv1.Role
	eventually(t, "the Caller's Role", exists(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: callerBase}}, caller))
	mustGet(t, cache, key(ns, callerBase), &cachedRole)
	mustGet(t, k8sClient, key(ns, callerBase), &liveRole)
	if len(cachedRole.Rules) != 0 || cachedRole.Annotations[cachedRulesDigest] != rulesDigest(liveRole.Rules) {
		t.Errorf("cached Role: %d rules (want none), digest %q (want %q)", len(cachedRole.Rules), cachedRole.Annotations[cachedRulesDigest], rulesDigest(liveRole.Rules))
	}
	if _, ok := liveRole.Annotations[cachedRulesDigest]; ok || len(liveRole.Rules) == 0 {
		t.Errorf("the server's Role: annotations %v, %d rules", liveRole.Annotations, len(liveRole.Rules))
	}
	wantRules := liveRole.Rules
	edited := liveRole.DeepCopy()
	edited.Rules[0].Verbs = append(edited.Rules[0].Verbs, "delete")
	if err := k8sClient.Update(ctx, edited, client.FieldOwner("someone")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the operator restores the Role's rules", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, key(ns, callerBase), &liveRole); err != nil {
			return err
		}
		if !equality.Semantic.DeepEqual(liveRole.Rules, wantRules) {
			return fmt.Errorf("rules %+v", liveRole.Rules)
		}
		return nil
	})

	// The operator patched the Callee (id claim) from a cached copy without
	// the annotation: the server's copy keeps it.
	eventually(t, "the Callee is claimed and keeps its last-applied annotation", func(ctx context.Context) error {
		live := &hcpv1alpha1.Callee{}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(callee), live); err != nil {
			return err
		}
		if live.Labels[hcpv1alpha1.LabelVhostKey] == "" {
			return errors.New("not claimed yet")
		}
		if live.Annotations[corev1.LastAppliedConfigAnnotation] != callee.Annotations[corev1.LastAppliedConfigAnnotation] {
			return fmt.Errorf("annotations on the server %v", live.Annotations)
		}
		return nil
	})
	cachedCallee := &hcpv1alpha1.Callee{}
	mustGet(t, cache, client.ObjectKeyFromObject(callee), cachedCallee)
	if _, ok := cachedCallee.Annotations[corev1.LastAppliedConfigAnnotation]; ok || cachedCallee.ManagedFields != nil {
		t.Errorf("cached Callee keeps annotations %v, managed fields %d", cachedCallee.Annotations, len(cachedCallee.ManagedFields))
	}

	// A live session with a report: cached without it, counted all the
	// same.
	s := newSession(ns, "lab", hcpv1alpha1.SessionRunning, nil)
	s.Status.Progress = &hcpv1alpha1.SessionProgress{Stage: "synthesis", Message: "step 3 of 20"}
	s.Status.LastCheckpoint = &hcpv1alpha1.SessionCheckpoint{ID: "cp-3", Description: "after step 3"}
	createSession(t, s)
	eventually(t, "the cached session has its state but not the harness's report", func(ctx context.Context) error {
		c := &hcpv1alpha1.HCPSession{}
		if err := cache.Get(ctx, client.ObjectKeyFromObject(s), c); err != nil {
			return err
		}
		if c.Status.State != hcpv1alpha1.SessionRunning || c.Status.Progress != nil || c.Status.LastCheckpoint != nil || c.ManagedFields != nil {
			return fmt.Errorf("cached status %+v, managed fields %d", c.Status, len(c.ManagedFields))
		}
		return nil
	})
	eventually(t, "the Callee counts the session", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(callee), callee); err != nil {
			return err
		}
		if callee.Status.ActiveSessions != 1 {
			return fmt.Errorf("activeSessions %d", callee.Status.ActiveSessions)
		}
		return nil
	})
	live := &hcpv1alpha1.HCPSession{}
	mustGet(t, k8sClient, client.ObjectKeyFromObject(s), live)
	if live.Status.Progress == nil || live.Status.LastCheckpoint == nil {
		t.Errorf("the server's session lost its report: %+v", live.Status)
	}

	// The Deployment is updated whole from its cached copy, which has no
	// managed fields: the server keeps its own.
	update(t, callee, func(c *hcpv1alpha1.Callee) { c.Spec.Harness.Replicas = new(int32(3)) })
	eventually(t, "the Deployment follows the Callee and keeps its field managers", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
			return err
		}
		if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
			return fmt.Errorf("replicas %v", dep.Spec.Replicas)
		}
		if len(dep.ManagedFields) == 0 {
			return errors.New("the Deployment lost its managed fields")
		}
		return nil
	})
}

func mustGet(t *testing.T, r client.Reader, k client.ObjectKey, o client.Object) {
	t.Helper()
	if err := r.Get(t.Context(), k, o); err != nil {
		t.Fatalf("get %T %s: %v", o, k, err)
	}
}

func mustExtract(t *testing.T, l client.ObjectList) []client.Object {
	t.Helper()
	var out []client.Object
	switch x := l.(type) {
	case *corev1.SecretList:
		for i := range x.Items {
			out = append(out, &x.Items[i])
		}
	case *appsv1.DeploymentList:
		for i := range x.Items {
			out = append(out, &x.Items[i])
		}
	default:
		t.Fatalf("list %T", l)
	}
	return out
}

// TestManagerMetrics scrapes the suite manager's metrics endpoint, served
// as in production (HTTPS; a TokenReview and a SubjectAccessReview per
// scrape): a ServiceAccount bound to config/rbac's metrics reader role
// gets controller-runtime's reconcile, workqueue and REST client series,
// and the concurrency each controller was configured with; no token gets
// 401, a token without the role 403.
func TestManagerMetrics(t *testing.T) {
	ns := newNamespace(t, "metrics-")
	dumpOnFailure(t, ns)
	ctx := t.Context()

	callee := newCallee(ns, "lab")
	create(t, callee)
	_, credsName, _ := childNames("callee", "lab")
	eventually(t, "the Callee is reconciled", exists(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: credsName}}, callee))

	reader, err := rbacFromRepo[*rbacv1.ClusterRole]("metrics_reader_role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	reader.Name = ns + "-metrics-reader"
	prometheus := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prometheus"}}
	nosy := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nosy"}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: reader.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: prometheus.Name}},
	}
	create(t, reader, binding, prometheus, nosy)
	t.Cleanup(func() {
		for _, o := range []client.Object{binding, reader} {
			if err := k8sClient.Delete(context.Background(), o); client.IgnoreNotFound(err) != nil {
				t.Error(err)
			}
		}
	})
	// The manager caches a denial for 30 s: scrape once RBAC allows it.
	eventually(t, "RBAC lets prometheus read /metrics", func(ctx context.Context) error {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:                  "system:serviceaccount:" + ns + ":prometheus",
			Groups:                []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
		}}
		if err := k8sClient.Create(ctx, sar); err != nil {
			return err
		}
		if !sar.Status.Allowed {
			return fmt.Errorf("not allowed: %s", sar.Status.Reason)
		}
		return nil
	})
	token := func(sa *corev1.ServiceAccount) string {
		tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(600))}}
		if err := k8sClient.SubResource("token").Create(ctx, sa, tr); err != nil {
			t.Fatalf("token for %s: %v", sa.Name, err)
		}
		return tr.Status.Token
	}
	httpClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		// The manager's certificate is self-signed, as by default in production.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
	url := "https://" + suiteManagerConfig.MetricsAddr + "/metrics"
	scrape := func(bearer string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}

	if code, _ := scrape(""); code != http.StatusUnauthorized {
		t.Errorf("scrape without a token: %d, want 401", code)
	}
	if code, _ := scrape(token(nosy)); code != http.StatusForbidden {
		t.Errorf("scrape by a ServiceAccount without the metrics reader role: %d, want 403", code)
	}
	code, body := scrape(token(prometheus))
	if code != http.StatusOK {
		t.Fatalf("scrape by the metrics reader: %d: %s", code, body)
	}
	series := parseMetrics(body)
	positive := func(name string, labels ...string) {
		t.Helper()
		if v, ok := series.value(name, labels...); !ok || v <= 0 {
			t.Errorf("%s%v: %v (found %v), want > 0", name, labels, v, ok)
		}
	}
	present := func(name string, labels ...string) {
		t.Helper()
		if _, ok := series.value(name, labels...); !ok {
			t.Errorf("no series %s%v", name, labels)
		}
	}
	positive("controller_runtime_reconcile_total", `controller="callee"`, `result="success"`)
	positive("controller_runtime_reconcile_time_seconds_count", `controller="callee"`)
	present("controller_runtime_reconcile_errors_total", `controller="callee"`)
	present("workqueue_depth", `name="callee"`)
	present("workqueue_adds_total", `name="callee"`)
	positive("rest_client_requests_total")
	for name := range controllerKinds {
		want := float64(suiteManagerConfig.MaxConcurrentReconciles[name])
		if v, ok := series.value("controller_runtime_max_concurrent_reconciles", `controller="`+name+`"`); !ok || v != want {
			t.Errorf("controller_runtime_max_concurrent_reconciles{controller=%q} = %v (found %v), want %v (configured)", name, v, ok, want)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", body)
	}
}

// metricLines are the samples of a Prometheus text exposition.
type metricLines []string

func parseMetrics(body string) metricLines {
	var out metricLines
	for line := range strings.SplitSeq(body, "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	return out
}

// value sums the samples of name whose labels include every one given.
func (m metricLines) value(name string, labels ...string) (float64, bool) {
	var sum float64
	found := false
	for _, line := range m {
		i := strings.LastIndex(line, " ")
		if i < 0 {
			continue
		}
		n, rest, _ := strings.Cut(line[:i], "{")
		if n != name || slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(rest, l) }) {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		sum, found = sum+v, true
	}
	return sum, found
}
