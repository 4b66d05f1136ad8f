package controller

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	autoscalingv1 "k8s.io/api/autoscaling/v1"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// TestCalleeLifecycle: create, converge, report, edit, delete.
func TestCalleeLifecycle(t *testing.T) {
	ns := newNamespace(t, "callee-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "lab-cvd", func(c *hcpv1alpha1.Callee) {
		c.Spec.CommandQueue.MaxLength = new(int64(100))
		c.Spec.CommandQueue.DeliveryLimit = new(int32(5))
	})
	create(t, callee)
	base, credsName, legacyToken := childNames("callee", "lab-cvd")

	// Everything appears, owned by the Callee.
	topo := topologyChildren(ns, base)
	harness := harnessChildren(ns, base)
	creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: credsName}}
	// The token keys are in the credentials Secret.
	tok := creds
	declarePrerequisites(t, ns, base)
	children := append(append(slices.Clone(topo), harness...), creds)
	checks := make([]func(context.Context) error, 0, len(children))
	for _, o := range children {
		checks = append(checks, exists(o, callee))
	}
	eventually(t, "every child exists with the Callee as controller", all(checks...))
	for _, o := range []client.Object{&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: legacyToken}},
		&topologyv1beta1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base + "-dlq"}}} {
		if err := gone(o)(t.Context()); err != nil {
			t.Errorf("a child of an earlier version was created: %v", err)
		}
	}

	eventually(t, "the Callee holds its id", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(callee), callee); err != nil {
			return err
		}
		if !controllerutil.ContainsFinalizer(callee, TopologyFinalizer) || callee.Labels[hcpv1alpha1.LabelVhostKey] == "" {
			return fmt.Errorf("finalizers %v labels %v", callee.Finalizers, callee.Labels)
		}
		return nil
	})
	vhostKey := callee.Labels[hcpv1alpha1.LabelVhostKey]

	// Topology objects as DESIGN section 3 says.
	q := topo[0].(*topologyv1beta1.Queue)
	vhost := testVhost(ns)
	if q.Spec.Name != "hcp.cmd.lab-cvd" || q.Spec.Type != "quorum" || q.Spec.Vhost != vhost ||
		!reflect.DeepEqual(queueArgs(q), resource.DeadLetterArguments("hcp.cmd.lab-cvd")) {
		t.Errorf("queue %+v args %v", q.Spec, queueArgs(q))
	}
	if !managedBy(q, resource.FieldManager) {
		t.Errorf("the Queue was not written with field manager %q: %+v", resource.FieldManager, q.ManagedFields)
	}
	ref := q.Spec.RabbitmqClusterReference
	if ref.Namespace != suiteBrokerNamespace || ref.ConnectionSecret == nil || ref.ConnectionSecret.Name != suiteBrokerSecret {
		t.Errorf("default broker reference not used: %+v", ref)
	}
	if p := topo[3].(*topologyv1beta1.Permission).Spec; p.User != "callee.lab-cvd@"+vhost || p.Vhost != vhost || p.Permissions.Configure != "^$" ||
		p.Permissions.Write != `^hcp\.events$` || p.Permissions.Read != `^hcp\.cmd\.lab-cvd$` {
		t.Errorf("permission %+v", p)
	}
	if b := topo[1].(*topologyv1beta1.Binding).Spec; b.Source != "hcp.commands" || b.RoutingKey != "lab-cvd" || b.Destination != "hcp.cmd.lab-cvd" {
		t.Errorf("binding %+v", b)
	}
	if u := topo[2].(*topologyv1beta1.User).Spec; u.ImportCredentialsSecret == nil || u.ImportCredentialsSecret.Name != credsName {
		t.Errorf("user %+v", u)
	}
	if creds.Labels[resource.LabelTopologyOperator] != "true" || string(creds.Data["username"]) != "callee.lab-cvd@"+vhost ||
		string(creds.Data["vhost"]) != vhost || len(creds.Data["password"]) < 24 ||
		!strings.HasPrefix(string(creds.Data["uri"]), "amqp://callee.lab-cvd%40%2F"+ns+":") ||
		!strings.HasSuffix(string(creds.Data["uri"]), "@rabbitmq.hcp-system.svc:5672/%2F"+ns) {
		t.Errorf("credentials Secret labels %v data keys %v uri %q", creds.Labels, slices.Sorted(maps.Keys(creds.Data)), redact(creds.Data["uri"]))
	}
	// Its sidecar's rights: the callee sidecars' ClusterRole, bound to
	// its ServiceAccount; no Role of its own.
	if rb := harness[2].(*rbacv1.RoleBinding); rb.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: resource.DefaultCalleeSidecarClusterRole}) ||
		len(rb.Subjects) != 1 || rb.Subjects[0].Name != base || rb.Subjects[0].Namespace != ns {
		t.Errorf("role binding %+v %+v", rb.RoleRef, rb.Subjects)
	}
	for _, o := range []client.Object{&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}} {
		if err := gone(o)(t.Context()); err != nil {
			t.Errorf("a Callee has a %T of its own: %v", o, err)
		}
	}
	dep := harness[0].(*appsv1.Deployment)
	if ps := dep.Spec.Template.Spec; ps.ServiceAccountName != base || len(ps.Containers) != 1 || len(ps.InitContainers) != 1 ||
		ps.InitContainers[0].Image != suiteSidecarImage || ps.InitContainers[0].RestartPolicy == nil {
		t.Errorf("deployment pod spec %+v", dep.Spec.Template.Spec)
	}

	// Shared exchanges: in the operator's namespace (the suite's is the
	// default broker's), labelled, owned by no one.
	exchanges, err := sharedExchanges(t.Context(), vhostKey)
	if err != nil {
		t.Fatal(err)
	}
	if len(exchanges) != 3 { // hcp.commands, hcp.events, hcp.dlx
		t.Fatalf("want 3 shared exchanges, got %d", len(exchanges))
	}
	for _, x := range exchanges {
		if len(x.OwnerReferences) != 0 || x.Namespace != suiteBrokerNamespace {
			t.Errorf("exchange %s/%s owners %v", x.Namespace, x.Name, x.OwnerReferences)
		}
	}
	// The queue is declared without limits; they are its Policy.
	pol := limitsPolicy(ns, base)
	eventually(t, "the limits Policy", exists(pol, callee))
	if want := map[string]any{"max-length": float64(100), "delivery-limit": float64(5), "overflow": "reject-publish", "dead-letter-exchange": "hcp.dlx"}; !reflect.DeepEqual(policyDefinition(pol), want) ||
		pol.Spec.Pattern != `^hcp\.cmd\.lab-cvd$` || pol.Spec.ApplyTo != "queues" {
		t.Errorf("policy %+v definition %v, want %v", pol.Spec, policyDefinition(pol), want)
	}

	// Honest status while nothing is declared and no pod runs.
	eventually(t, "status says what is pending", all(
		calleeCondition(callee, hcpv1alpha1.ConditionTopologyReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending,
			"Exchange hcp-commands-"+vhostKey+": not yet declared by the messaging-topology-operator"),
		calleeCondition(callee, hcpv1alpha1.ConditionHarnessReady, metav1.ConditionFalse, hcpv1alpha1.ReasonDeploymentProgressing, "Deployment "+base),
		calleeCondition(callee, hcpv1alpha1.ConditionReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, ""),
	))
	st := callee.Status
	if st.ObservedGeneration != callee.Generation || st.CalleeID != "lab-cvd" || st.CommandQueue != "hcp.cmd.lab-cvd" || st.Vhost != vhost ||
		st.CredentialsSecret != credsName || st.Username != "callee.lab-cvd@"+vhost {
		t.Errorf("status %+v", st)
	}
	if _, err := token.ParsePublicKeyPEM([]byte(st.TokenPublicKey)); err != nil || st.TokenPublicKey != string(tok.Data["public.pem"]) {
		t.Errorf("status.tokenPublicKey %q: %v", st.TokenPublicKey, err)
	}

	// Play the topology operator and the Deployment controller.
	for _, o := range topo {
		setTopologyStatus(t, o, true, "")
	}
	declareShared(t, vhostKey)
	eventually(t, "TopologyReady waits for the Policy", calleeCondition(callee, hcpv1alpha1.ConditionTopologyReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending,
		"Policy "+base+": not yet declared by the messaging-topology-operator"))
	setTopologyStatus(t, pol, true, "")
	// 12: the Queue, Binding, User, Permission and Policy, the dead-letter
	// Queue, and the shared hcp.commands, hcp.events, hcp.dlx and the
	// default event, command and dead-letter policies.
	eventually(t, "TopologyReady from the children", calleeCondition(callee, hcpv1alpha1.ConditionTopologyReady, metav1.ConditionTrue, hcpv1alpha1.ReasonReconciled, "12 topology objects ready"))
	setDeploymentAvailable(t, dep, 1)
	eventually(t, "Ready once the Deployment is available", all(
		calleeCondition(callee, hcpv1alpha1.ConditionHarnessReady, metav1.ConditionTrue, hcpv1alpha1.ReasonDeploymentAvailable, "1/1 replicas ready"),
		calleeCondition(callee, hcpv1alpha1.ConditionReady, metav1.ConditionTrue, hcpv1alpha1.ReasonReconciled, ""),
		func(context.Context) error {
			if callee.Status.ReadyReplicas != 1 {
				return fmt.Errorf("readyReplicas %d", callee.Status.ReadyReplicas)
			}
			return nil
		},
	))

	// A child failing shows on the Callee, with its message.
	setTopologyStatus(t, q, false, "Error 403 (access_refused): vhost /hcp not found")
	eventually(t, "TopologyReady names the failing child", all(
		calleeCondition(callee, hcpv1alpha1.ConditionTopologyReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyFailed,
			"Queue "+base+": Error 403 (access_refused): vhost /hcp not found"),
		calleeCondition(callee, hcpv1alpha1.ConditionReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyFailed, "vhost /hcp not found"),
	))
	setTopologyStatus(t, q, true, "")

	// Limits edited in the Callee reach the Queue.
	hash := dep.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash]
	privateKey := string(tok.Data["private.pem"])
	update(t, callee, func(c *hcpv1alpha1.Callee) {
		c.Spec.CommandQueue.MaxLength = new(int64(250))
		c.Spec.CommandQueue.MaxLengthBytes = new(int64(1 << 20))
	})
	// Limits edited in the Callee reach the Policy, never the Queue.
	queueGeneration := q.Generation
	eventually(t, "new limits in the Policy", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pol), pol); err != nil {
			return err
		}
		want := map[string]any{"max-length": float64(250), "max-length-bytes": float64(1 << 20), "delivery-limit": float64(5), "overflow": "reject-publish", "dead-letter-exchange": "hcp.dlx"}
		if got := policyDefinition(pol); !reflect.DeepEqual(got, want) {
			return fmt.Errorf("definition %v, want %v", got, want)
		}
		return nil
	})
	eventually(t, "the new generation is pending until declared", calleeCondition(callee, hcpv1alpha1.ConditionTopologyReady,
		metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, "Policy "+base+": not yet declared at generation 2"))
	if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(q), q); err != nil {
		t.Fatal(err)
	}
	if q.Generation != queueGeneration || !reflect.DeepEqual(queueArgs(q), resource.DeadLetterArguments("hcp.cmd.lab-cvd")) {
		t.Errorf("a limit change updated the Queue: generation %d -> %d, arguments %v", queueGeneration, q.Generation, queueArgs(q))
	}
	setTopologyStatus(t, pol, true, "")
	if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(dep), dep); err != nil {
		t.Fatal(err)
	}
	if got := dep.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash]; got != hash {
		t.Errorf("a queue limit rolled the pods: config hash %s -> %s", hash, got)
	}

	// Scaling does not roll the pods; a harness change does.
	update(t, callee, func(c *hcpv1alpha1.Callee) { c.Spec.Harness.Replicas = new(int32(3)) })
	eventually(t, "replicas reach the Deployment", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
			return err
		}
		if *dep.Spec.Replicas != 3 {
			return fmt.Errorf("replicas %d", *dep.Spec.Replicas)
		}
		if got := dep.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash]; got != hash {
			return fmt.Errorf("scaling changed the config hash %s -> %s", hash, got)
		}
		return nil
	})

	// The /scale subresource (kubectl scale, HPA, KEDA) drives the same
	// field, and reports the pods' selector.
	// As kubectl scale does: read, set, write, again on a conflict (the
	// manager may write the Callee's status in between).
	scale := &autoscalingv1.Scale{}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.SubResource("scale").Get(t.Context(), callee, scale); err != nil {
			return err
		}
		scale.Spec.Replicas = 2
		return k8sClient.SubResource("scale").Update(t.Context(), callee, client.WithSubResourceBody(scale))
	}); err != nil {
		t.Fatalf("GET, PUT callees/scale: %v", err)
	}
	eventually(t, "/scale reaches the Deployment and reports its selector", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
			return err
		}
		if *dep.Spec.Replicas != 2 {
			return fmt.Errorf("Deployment replicas %d, want 2", *dep.Spec.Replicas)
		}
		got := &autoscalingv1.Scale{}
		if err := k8sClient.SubResource("scale").Get(ctx, callee, got); err != nil {
			return err
		}
		want, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
		if err != nil {
			return err
		}
		if got.Spec.Replicas != 2 || got.Status.Selector == "" || got.Status.Selector != want.String() {
			return fmt.Errorf("scale %+v, want spec 2 and selector %q", got, want)
		}
		return nil
	})
	update(t, callee, func(c *hcpv1alpha1.Callee) {
		c.Spec.Harness.Template.Spec.Containers[0].Image = "example.com/harness:2"
		c.Spec.Sidecar.LogLevel = "debug"
	})
	eventually(t, "a harness change rolls the pods", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
			return err
		}
		c := dep.Spec.Template.Spec.Containers
		if got := dep.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash]; got == hash || c[0].Image != "example.com/harness:2" {
			return fmt.Errorf("config hash %s (was %s), image %s", got, hash, c[0].Image)
		}
		return nil
	})
	hash = dep.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash]

	// A changed credential does not roll the pods: the sidecar reads the
	// uri from the mounted Secret and uses the new one at its next dial.
	update(t, creds, func(s *corev1.Secret) { s.Data["password"] = []byte("rotated-by-hand-0123456789") })
	// The kept password is used in the uri.
	eventually(t, "the uri follows the password", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(creds), creds); err != nil {
			return err
		}
		if !strings.Contains(string(creds.Data["uri"]), ":rotated-by-hand-0123456789@") {
			return fmt.Errorf("uri %s", redact(creds.Data["uri"]))
		}
		return nil
	})
	if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(dep), dep); err != nil {
		t.Fatal(err)
	}
	if got := dep.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash]; got != hash {
		t.Errorf("a password rotation rolled the pods: config hash %s → %s", hash, got)
	}
	// The token key is never regenerated.
	if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(tok), tok); err != nil {
		t.Fatal(err)
	}
	if string(tok.Data["private.pem"]) != privateKey {
		t.Error("the token signing key changed")
	}
	// ... unless asked for: a rotation makes a new key, keeps the retired
	// one verifiable, and rolls no pod (the sidecar follows the file).
	dep = &appsv1.Deployment{}
	if err := k8sClient.Get(t.Context(), key(ns, base), dep); err != nil {
		t.Fatal(err)
	}
	hashBefore := dep.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash]
	update(t, callee, func(c *hcpv1alpha1.Callee) {
		metav1.SetMetaDataAnnotation(&c.ObjectMeta, hcpv1alpha1.AnnotationRotateTokenKey, "2026-11-25T12:00:00Z")
	})
	eventually(t, "the token key rotated", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(tok), tok); err != nil {
			return err
		}
		if string(tok.Data["private.pem"]) == privateKey {
			return errors.New("still the first key")
		}
		set, err := token.ParseKeySetPEM(tok.Data["verification-keys.pem"])
		if err != nil {
			return err
		}
		oldPub, _ := token.ParsePrivateKeyPEM([]byte(privateKey))
		newPub, _ := token.ParsePublicKeyPEM(tok.Data["public.pem"])
		ids := set.IDs()
		if len(ids) != 2 || ids[0] != token.KeyID(newPub) || ids[1] != token.KeyID(oldPub.Public().(ed25519.PublicKey)) {
			return fmt.Errorf("verification keys %v", ids)
		}
		if tok.Annotations[hcpv1alpha1.AnnotationTokenKeyRotation] != "2026-11-25T12:00:00Z" {
			return fmt.Errorf("rotation annotation %v", tok.Annotations)
		}
		c := &hcpv1alpha1.Callee{}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(callee), c); err != nil {
			return err
		}
		if c.Status.TokenPublicKey != string(tok.Data["public.pem"]) {
			return errors.New("status.tokenPublicKey is not the new key yet")
		}
		if typ := eventReasons(ctx, ns, "Callee", callee.Name)[reasonTokenKeyRotated]; typ != corev1.EventTypeNormal {
			return errors.New("no TokenKeyRotated Event on the Callee yet")
		}
		return nil
	})
	if err := k8sClient.Get(t.Context(), key(ns, base), dep); err != nil {
		t.Fatal(err)
	}
	if h := dep.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash]; h != hashBefore {
		t.Errorf("the rotation rolled the pods: config hash %s → %s", hashBefore, h)
	}

	// Active sessions.
	running := newSession(ns, "lab-cvd", hcpv1alpha1.SessionRunning, nil)
	done := newSession(ns, "lab-cvd", hcpv1alpha1.SessionCompleted, new(metav1.Now()))
	createSession(t, running)
	createSession(t, done)
	eventually(t, "activeSessions counts the running session", activeSessions(callee, 1))
	setSessionState(t, running, hcpv1alpha1.SessionCompleted)
	eventually(t, "activeSessions drops when it ends", activeSessions(callee, 0))

	// Events on change (no Created: the children were all created in the
	// first rollout, TestCreatedEventsAfterFirstRollout).
	eventually(t, "Events recorded", func(ctx context.Context) error {
		seen := eventReasons(ctx, ns, "Callee", "lab-cvd")
		for _, r := range []string{"Updated", hcpv1alpha1.ReasonTopologyPending, hcpv1alpha1.ReasonReconciled, hcpv1alpha1.ReasonTopologyFailed} {
			if _, ok := seen[r]; !ok {
				return fmt.Errorf("no %s event; seen %v", r, seen)
			}
		}
		return nil
	})

	// Deletion: the finalizer removes the topology objects, then the
	// shared exchanges (last user), then lets the Callee go.
	if err := k8sClient.Delete(t.Context(), callee); err != nil {
		t.Fatal(err)
	}
	checks = append(make([]func(context.Context) error, 0, 1+len(topo)+len(exchanges)), gone(callee))
	for _, o := range topo {
		checks = append(checks, gone(o))
	}
	for i := range exchanges {
		checks = append(checks, gone(&exchanges[i]))
	}
	eventually(t, "the Callee, its topology and the shared exchanges are gone", all(checks...))
	// envtest has no garbage collector: the rest is left to owner
	// references, checked above.

	// The finalizer's deletions make one Event naming its children, not
	// one API write per child.
	eventually(t, "one Deleted Event for the topology objects", func(ctx context.Context) error {
		var list eventsv1.EventList
		if err := k8sClient.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		n := 0
		for _, e := range list.Items {
			if e.Regarding.Kind == "Callee" && e.Regarding.Name == "lab-cvd" && e.Reason == "Deleted" {
				n++
				if !strings.Contains(e.Note, "Queue ") || !strings.Contains(e.Note, "User ") {
					return fmt.Errorf("Deleted Event %q does not name the Queue and the User", e.Note)
				}
			}
		}
		if n != 1 {
			return fmt.Errorf("%d Deleted Events, want 1", n)
		}
		return nil
	})
}

func managedBy(o client.Object, manager string) bool {
	for _, f := range o.GetManagedFields() {
		if f.Manager == manager {
			return true
		}
	}
	return false
}

func redact(uri []byte) string {
	s := string(uri)
	if i, j := strings.Index(s, "://"), strings.LastIndex(s, "@"); i > 0 && j > i {
		if k := strings.Index(s[i+3:j], ":"); k >= 0 {
			return s[:i+3+k+1] + "***" + s[j:]
		}
	}
	return s
}

func newSession(ns, calleeID string, state hcpv1alpha1.SessionState, completed *metav1.Time) *hcpv1alpha1.HCPSession {
	id := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", rand.Uint32(), rand.Uint32()&0xffff, rand.Uint32()&0xfff, rand.Uint32()&0xfff, rand.Uint64()&0xffffffffffff)
	s := &hcpv1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id, Labels: map[string]string{hcpv1alpha1.LabelCalleeID: calleeID}},
		Spec: hcpv1alpha1.HCPSessionSpec{
			SessionID: id, CalleeID: calleeID, CallerID: "alpha", Capability: "cvd.run",
			TaskMessageID: "6f1c2b1e-8d1a-4c3b-9a8e-1f2d3c4b5a69",
		},
	}
	s.Status.State, s.Status.CompletedAt = state, completed
	return s
}

func createSession(t *testing.T, s *hcpv1alpha1.HCPSession) {
	t.Helper()
	st := s.Status
	create(t, s)
	s.Status = st
	if err := k8sClient.Status().Update(t.Context(), s); err != nil {
		t.Fatal(err)
	}
}

func setSessionState(t *testing.T, s *hcpv1alpha1.HCPSession, state hcpv1alpha1.SessionState) {
	t.Helper()
	eventually(t, "set session state", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return err
		}
		s.Status.State = state
		if state.IsTerminal() {
			s.Status.CompletedAt = new(metav1.Now())
		}
		return k8sClient.Status().Update(ctx, s)
	})
}

func activeSessions(c *hcpv1alpha1.Callee, want int32) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(c), c); err != nil {
			return err
		}
		if c.Status.ActiveSessions != want {
			return fmt.Errorf("activeSessions %d, want %d", c.Status.ActiveSessions, want)
		}
		return nil
	}
}

// eventReasons are the reasons of the Events about an object, by type.
func eventReasons(ctx context.Context, ns, kind, name string) map[string]string {
	var list eventsv1.EventList
	if err := k8sClient.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil
	}
	seen := map[string]string{}
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name {
			seen[e.Reason] = e.Type
		}
	}
	return seen
}

// TestSharedExchanges: two users of one vhost in two namespaces. The
// shared exchanges and vhost live in the operator's namespace (the
// suite's: the default broker's), not in either tenant's, reach the broker
// through the operator's own copy of the connection Secret, survive the
// first user's deletion and go with the last.
func TestSharedExchanges(t *testing.T) {
	ns1, ns2 := newNamespace(t, "shared-a-"), newNamespace(t, "shared-b-")
	dumpOnFailure(t, ns1)
	dumpOnFailure(t, ns2)
	dumpOnFailure(t, suiteBrokerNamespace)
	callee := newCallee(ns1, "worker", func(c *hcpv1alpha1.Callee) {
		c.Spec.Broker = hcpv1alpha1.BrokerSpec{Vhost: "/shared-" + ns1, CreateVhost: true}
	})
	caller := newCaller(ns2, "agent", func(c *hcpv1alpha1.Caller) {
		c.Spec.Broker = hcpv1alpha1.BrokerSpec{Vhost: "/shared-" + ns1, CreateVhost: true, VhostDeletionPolicy: "delete"}
	})
	create(t, callee, caller)

	var key string
	eventually(t, "both hold their ids in one vhost key", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(callee), callee); err != nil {
			return err
		}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(caller), caller); err != nil {
			return err
		}
		k1, k2 := callee.Labels[hcpv1alpha1.LabelVhostKey], caller.Labels[hcpv1alpha1.LabelVhostKey]
		if k1 == "" || k1 != k2 {
			return fmt.Errorf("vhost keys %q %q", k1, k2)
		}
		key = k1
		return nil
	})
	cmd, evt := resource.ExchangeNames(key)
	home := suiteBrokerNamespace
	vh := &topologyv1beta1.Vhost{ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: resource.VhostObjectName(key)}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: resource.SharedConnectionSecretName(key)}}
	objs := []client.Object{
		&topologyv1beta1.Exchange{ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: cmd}},
		&topologyv1beta1.Exchange{ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: evt}},
		vh, secret,
	}
	checks := make([]func(context.Context) error, 0, len(objs))
	for _, o := range objs {
		checks = append(checks, exists(o, nil))
	}
	eventually(t, "the operator's namespace has the exchanges, the vhost and the connection Secret copy", all(checks...))
	for _, ns := range []string{ns1, ns2} {
		var xs topologyv1beta1.ExchangeList
		var vs topologyv1beta1.VhostList
		if err := k8sClient.List(t.Context(), &xs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if err := k8sClient.List(t.Context(), &vs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if len(xs.Items)+len(vs.Items) != 0 {
			t.Errorf("tenant namespace %s holds shared objects: %d Exchanges, %d Vhosts", ns, len(xs.Items), len(vs.Items))
		}
	}
	for _, o := range objs[:3] {
		if len(o.GetOwnerReferences()) != 0 {
			t.Errorf("%T %s has owners %v", o, o.GetName(), o.GetOwnerReferences())
		}
	}
	x := objs[0].(*topologyv1beta1.Exchange)
	if r := x.Spec.RabbitmqClusterReference; r.ConnectionSecret == nil || r.ConnectionSecret.Name != secret.Name || r.Namespace != "" {
		t.Errorf("shared exchange reaches the broker through %+v, want the Secret copy %s", r, secret.Name)
	}
	// Garbage collection takes the copy after the last shared object (the
	// topology operator needs it to delete them on the broker).
	eventually(t, "the copy is owned by every shared object", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(secret), secret); err != nil {
			return err
		}
		var uids []types.UID
		for _, r := range secret.OwnerReferences {
			if r.Controller != nil && *r.Controller {
				return fmt.Errorf("the copy has a controller: %+v", r)
			}
			uids = append(uids, r.UID)
		}
		for _, o := range objs[:3] {
			if !slices.Contains(uids, o.GetUID()) {
				return fmt.Errorf("owner references %+v lack %T %s", secret.OwnerReferences, o, o.GetName())
			}
		}
		return nil
	})
	if secret.Annotations[resource.AnnotationCopiedFrom] != suiteBrokerNamespace+"/"+suiteBrokerSecret ||
		string(secret.Data["uri"]) != "http://rabbitmq.hcp-system.svc:15672" || secret.Labels[resource.LabelTopologyOperator] != "true" {
		t.Errorf("connection Secret copy %+v data keys %v", secret.ObjectMeta, slices.Sorted(maps.Keys(secret.Data)))
	}
	// One user does not ask for delete: retain, whatever the other asks
	// (the first to apply the Vhost may not see the other's claim yet: the
	// other applies it again once it holds its id).
	eventually(t, "the vhost is retained", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(vh), vh); err != nil {
			return err
		}
		if vh.Spec.DeletionPolicy != "retain" || vh.Spec.Name != "/shared-"+ns1 {
			return fmt.Errorf("vhost: policy %s name %s, want retain", vh.Spec.DeletionPolicy, vh.Spec.Name)
		}
		return nil
	})

	// The first user goes (as with its namespace): everything shared stays.
	if err := k8sClient.Delete(t.Context(), callee); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Callee is gone", gone(callee))
	for _, o := range objs {
		if err := exists(o, nil)(t.Context()); err != nil {
			t.Errorf("shared object deleted while still in use: %v", err)
		}
		if !o.GetDeletionTimestamp().IsZero() {
			t.Errorf("%T %s/%s is being deleted while still in use", o, o.GetNamespace(), o.GetName())
		}
	}
	// The last user goes: everything shared goes.
	if err := k8sClient.Delete(t.Context(), caller); err != nil {
		t.Fatal(err)
	}
	checks = append(make([]func(context.Context) error, 0, 1+len(objs)), gone(caller))
	for _, o := range objs[:3] {
		checks = append(checks, gone(o))
	}
	eventually(t, "the last user took the shared objects with it", all(checks...))
}

// TestLegacySharedObjectsAdopted: shared objects an earlier version made
// in a tenant namespace, with the topology operator's finalizer, are
// deleted without that finalizer ever running (it would delete the
// broker's exchanges and vhost), once the shared topology lives in the
// operator's namespace.
func TestLegacySharedObjectsAdopted(t *testing.T) {
	ns := newNamespace(t, "legacy-")
	dumpOnFailure(t, ns)
	vhost := "/legacy-" + ns
	b := resource.Broker{Identity: "rabbitmq.hcp-system.svc:15672", Vhost: vhost,
		Reference: topologyv1beta1.RabbitmqClusterReference{Namespace: suiteBrokerNamespace, ConnectionSecret: &corev1.LocalObjectReference{Name: suiteBrokerSecret}}}
	key := b.Key()
	const mtoExchangeFinalizer, mtoVhostFinalizer = "deletion.finalizers.exchanges.rabbitmq.com", "deletion.finalizers.vhosts.rabbitmq.com"
	cmd, evt := resource.Exchanges(ns, b, b.Reference)
	vh := resource.Vhost(ns, b, b.Reference, resource.DeletionPolicyDelete)
	cmd.Finalizers, evt.Finalizers, vh.Finalizers = []string{mtoExchangeFinalizer}, []string{mtoExchangeFinalizer}, []string{mtoVhostFinalizer}
	create(t, cmd, evt, vh)

	callee := newCallee(ns, "old", func(c *hcpv1alpha1.Callee) { c.Spec.Broker = hcpv1alpha1.BrokerSpec{Vhost: vhost, CreateVhost: true} })
	create(t, callee)
	homeCmd := &topologyv1beta1.Exchange{ObjectMeta: metav1.ObjectMeta{Namespace: suiteBrokerNamespace, Name: cmd.Name}}
	eventually(t, "the shared objects move to the operator's namespace; the legacy ones go without their finalizer running",
		all(exists(homeCmd, nil), gone(cmd), gone(evt), gone(vh)))
	eventually(t, "the Callee holds its id", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(callee), callee); err != nil {
			return err
		}
		if callee.Labels[hcpv1alpha1.LabelVhostKey] != key {
			return fmt.Errorf("vhost key %q, want %q (the test's broker identity is wrong)", callee.Labels[hcpv1alpha1.LabelVhostKey], key)
		}
		return nil
	})
}

// TestIDConflict: ids are unique per vhost and broker across namespaces.
func TestIDConflict(t *testing.T) {
	ns1, ns2 := newNamespace(t, "idc-a-"), newNamespace(t, "idc-b-")
	dumpOnFailure(t, ns2)
	vhost := "/idc-" + ns1
	first := newCallee(ns1, "spectro", func(c *hcpv1alpha1.Callee) { c.Spec.Broker.Vhost = vhost })
	create(t, first)
	eventually(t, "the first holds the id", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(first), first); err != nil {
			return err
		}
		if !controllerutil.ContainsFinalizer(first, TopologyFinalizer) {
			return fmt.Errorf("no finalizer yet")
		}
		return nil
	})
	second := newCallee(ns2, "spectro-copy", func(c *hcpv1alpha1.Callee) {
		c.Spec.CalleeID = "spectro"
		c.Spec.Broker.Vhost = vhost
	})
	elsewhere := newCallee(ns2, "spectro-other-vhost", func(c *hcpv1alpha1.Callee) {
		c.Spec.CalleeID = "spectro"
		c.Spec.Broker.Vhost = "/elsewhere-" + ns1
	})
	create(t, second, elsewhere)
	eventually(t, "the second gets IDConflict naming the holder", all(
		calleeCondition(second, hcpv1alpha1.ConditionReady, metav1.ConditionFalse, hcpv1alpha1.ReasonIDConflict,
			fmt.Sprintf(`calleeID "spectro" is already used in vhost %q on this broker by Callee %s/spectro`, vhost, ns1)),
		calleeCondition(second, hcpv1alpha1.ConditionTopologyReady, metav1.ConditionFalse, hcpv1alpha1.ReasonIDConflict, ""),
	))
	eventually(t, "the same id in another vhost is fine", calleeCondition(elsewhere, hcpv1alpha1.ConditionReady,
		metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, ""))
	// The loser created nothing and holds nothing.
	base, creds, legacyTok := childNames("callee", "spectro-copy")
	for _, o := range append(append(topologyChildren(ns2, base), harnessChildren(ns2, base)...),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns2, Name: creds}}, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns2, Name: legacyTok}}) {
		if err := gone(o)(t.Context()); err != nil {
			t.Errorf("the losing Callee created something: %v", err)
		}
	}
	if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(second), second); err != nil {
		t.Fatal(err)
	}
	if len(second.Finalizers) != 0 {
		t.Errorf("the losing Callee holds finalizers %v", second.Finalizers)
	}

	// The holder goes: the second takes over.
	if err := k8sClient.Delete(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the second takes over once the holder is gone", all(
		gone(first),
		calleeCondition(second, hcpv1alpha1.ConditionReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, ""),
		exists(&topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: ns2, Name: base}}, second),
	))
}

// TestBrokerReferenceProblems: bad references produce conditions that say
// what to do.
func TestBrokerReferenceProblems(t *testing.T) {
	ns := newNamespace(t, "broker-")
	dumpOnFailure(t, ns)
	withSecret := func(name string) func(*hcpv1alpha1.Callee) {
		return func(c *hcpv1alpha1.Callee) {
			c.Spec.Broker.RabbitmqClusterReference = &hcpv1alpha1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: name}}
		}
	}

	missing := newCallee(ns, "missing", withSecret("nope"))
	create(t, missing)
	eventually(t, "missing Secret", calleeCondition(missing, hcpv1alpha1.ConditionReady, metav1.ConditionFalse,
		hcpv1alpha1.ReasonBrokerSecretNotFound, fmt.Sprintf("connection Secret %s/nope not found: create it with keys uri", ns)))

	unlabelled := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "rmq"},
		StringData: map[string]string{"uri": "http://rabbit:15672", "username": "u", "password": "p"},
	}
	create(t, unlabelled)
	callee := newCallee(ns, "unlabelled", withSecret("rmq"))
	create(t, callee)
	eventually(t, "unlabelled Secret, with the fix", calleeCondition(callee, hcpv1alpha1.ConditionReady, metav1.ConditionFalse,
		hcpv1alpha1.ReasonBrokerSecretUnlabeled, fmt.Sprintf("fix: kubectl label secret -n %s rmq rabbitmq.com/topology-operator=true", ns)))
	base, _, _ := childNames("callee", "unlabelled")
	if err := gone(&topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}})(t.Context()); err != nil {
		t.Errorf("a blocked Callee created topology: %v", err)
	}
	// Applying the fix is noticed at once (the labelled Secret enters the
	// manager's cache).
	update(t, unlabelled, func(s *corev1.Secret) { s.Labels = map[string]string{"rabbitmq.com/topology-operator": "true"} })
	eventually(t, "the label fixes it", all(
		calleeCondition(callee, hcpv1alpha1.ConditionReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTopologyPending, ""),
		exists(&topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}, callee),
	))
	// The Secret's management host gives the AMQP address.
	eventually(t, "AMQP URL from the management uri", func(ctx context.Context) error {
		_, credsName, _ := childNames("callee", "unlabelled")
		s := &corev1.Secret{}
		if err := k8sClient.Get(ctx, key(ns, credsName), s); err != nil {
			return err
		}
		if !strings.HasSuffix(string(s.Data["uri"]), "@rabbit:5672/%2F"+ns) {
			return fmt.Errorf("uri %s", redact(s.Data["uri"]))
		}
		return nil
	})

	incomplete := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "incomplete", Labels: map[string]string{"rabbitmq.com/topology-operator": "true"}},
		StringData: map[string]string{"uri": "http://rabbit:15672"},
	}
	create(t, incomplete)
	bad := newCallee(ns, "incomplete", withSecret("incomplete"))
	create(t, bad)
	eventually(t, "incomplete Secret", calleeCondition(bad, hcpv1alpha1.ConditionReady, metav1.ConditionFalse,
		hcpv1alpha1.ReasonBrokerSecretInvalid, "lacks key(s) username, password"))

	// A Secret of another namespace must allow this one.
	other := newNamespace(t, "broker-other-")
	create(t, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "rmq", Labels: map[string]string{"rabbitmq.com/topology-operator": "true"}},
		StringData: map[string]string{"uri": "http://rabbit:15672", "username": "u", "password": "p"},
	})
	cross := newCallee(ns, "cross", func(c *hcpv1alpha1.Callee) {
		c.Spec.Broker.RabbitmqClusterReference = &hcpv1alpha1.RabbitmqClusterReference{Namespace: other, ConnectionSecret: &corev1.LocalObjectReference{Name: "rmq"}}
	})
	create(t, cross)
	eventually(t, "cross-namespace Secret not allowing us", calleeCondition(cross, hcpv1alpha1.ConditionReady, metav1.ConditionFalse,
		hcpv1alpha1.ReasonBrokerSecretInvalid, fmt.Sprintf("fix: kubectl annotate secret -n %s rmq rabbitmq.com/topology-allowed-namespaces=%s", other, ns)))

	// A Warning Event says it too.
	eventually(t, "Warning Event", func(ctx context.Context) error {
		if typ := eventReasons(ctx, ns, "Callee", "missing")[hcpv1alpha1.ReasonBrokerSecretNotFound]; typ != corev1.EventTypeWarning {
			return fmt.Errorf("no Warning %s event", hcpv1alpha1.ReasonBrokerSecretNotFound)
		}
		return nil
	})

	// Blocked objects hold nothing, so they delete at once.
	for _, c := range []*hcpv1alpha1.Callee{missing, bad, cross} {
		if err := k8sClient.Delete(t.Context(), c); err != nil {
			t.Fatal(err)
		}
		eventually(t, "blocked Callee deleted", gone(c))
	}
}

// TestExchangeLossRecovery: an Exchange object deleted behind the
// operator's back while the vhost is in use is re-created, and bindings
// are re-declared.
func TestExchangeLossRecovery(t *testing.T) {
	ns := newNamespace(t, "loss-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "sturdy", func(c *hcpv1alpha1.Callee) { c.Spec.Broker.Vhost = "/loss-" + ns })
	create(t, callee)
	base, _, _ := childNames("callee", "sturdy")
	binding := &topologyv1beta1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}
	declarePrerequisites(t, ns, base)
	eventually(t, "topology exists", exists(binding, callee))
	cmd, _ := resource.ExchangeNames(claimedKey(t, callee))
	x := &topologyv1beta1.Exchange{ObjectMeta: metav1.ObjectMeta{Namespace: suiteBrokerNamespace, Name: cmd}}
	eventually(t, "exchange exists", exists(x, nil))
	oldUID := x.UID
	if err := k8sClient.Delete(t.Context(), x); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the exchange is re-created and the binding re-declared", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(x), x); err != nil {
			return err
		}
		if x.UID == oldUID {
			return fmt.Errorf("not re-created yet")
		}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(binding), binding); err != nil {
			return err
		}
		if binding.Annotations[annotationRedeclare] != string(oldUID) {
			return fmt.Errorf("binding annotations %v", binding.Annotations)
		}
		return nil
	})
}
