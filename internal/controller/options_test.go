package controller

import (
	"flag"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// TestCacheOptionsDefaultBrokerNamespace: with watched namespaces and a
// default connection Secret elsewhere (the chart's watchNamespaces with
// defaultBroker.secret.create), Secrets are cached in both, through one
// ByObject entry: a second *corev1.Secret key would leave it to chance
// which of the two controller-runtime keeps, and the manager then failed
// half its starts with "unknown namespace for the cache".
func TestCacheOptionsDefaultBrokerNamespace(t *testing.T) {
	opts := CacheOptions(Options{WatchNamespaces: []string{"team-a"}, DefaultBroker: &resource.DefaultBroker{Namespace: "hcp-system", Name: "broker"}})
	var secretEntries int
	for obj, by := range opts.ByObject {
		if _, ok := obj.(*corev1.Secret); !ok {
			continue
		}
		secretEntries++
		if got := slices.Sorted(maps.Keys(by.Namespaces)); !slices.Equal(got, []string{"hcp-system", "team-a"}) {
			t.Errorf("Secrets cached in %v, want [hcp-system team-a]", got)
		}
		if by.Label == nil || by.Label.String() != resource.LabelTopologyOperator+"="+resource.TopologyOperatorLabelValue {
			t.Errorf("Secret label selector %v", by.Label)
		}
	}
	if secretEntries != 1 {
		t.Errorf("%d ByObject entries for Secrets, want 1", secretEntries)
	}
	if got := slices.Sorted(maps.Keys(opts.DefaultNamespaces)); !slices.Equal(got, []string{"team-a"}) {
		t.Errorf("DefaultNamespaces %v, want [team-a]", got)
	}
}

// parseManagerFlags parses args as cmd/manager does: flags, then Validate.
func parseManagerFlags(args ...string) (ManagerConfig, error) {
	cfg := DefaultManagerConfig()
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// TestManagerFlagsDefaults: without flags the manager is what it was before
// the flags existed: no client-side rate limit, one worker per controller,
// controller-runtime's leader election timings and cache sync timeout,
// metrics off, probes on :8081.
func TestManagerFlagsDefaults(t *testing.T) {
	cfg, err := parseManagerFlags()
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	o := cfg.ManagerOptions(scheme)
	if o.LeaderElection || o.LeaderElectionID != "hcp-operator.hcp.io" || o.LeaderElectionNamespace != "" || !o.LeaderElectionReleaseOnCancel {
		t.Errorf("leader election: %v %q %q release %v", o.LeaderElection, o.LeaderElectionID, o.LeaderElectionNamespace, o.LeaderElectionReleaseOnCancel)
	}
	if *o.LeaseDuration != 15*time.Second || *o.RenewDeadline != 10*time.Second || *o.RetryPeriod != 2*time.Second {
		t.Errorf("lease %v renew %v retry %v, want controller-runtime's 15s 10s 2s", *o.LeaseDuration, *o.RenewDeadline, *o.RetryPeriod)
	}
	want := map[string]int{"Callee.hcp.io": 1, "Caller.hcp.io": 1, "CapabilityPolicy.hcp.io": 1, "HCPSession.hcp.io": 1}
	if !maps.Equal(o.Controller.GroupKindConcurrency, want) {
		t.Errorf("GroupKindConcurrency %v, want %v", o.Controller.GroupKindConcurrency, want)
	}
	if o.Controller.CacheSyncTimeout != 2*time.Minute {
		t.Errorf("CacheSyncTimeout %v", o.Controller.CacheSyncTimeout)
	}
	if o.Metrics.BindAddress != "0" || !o.Metrics.SecureServing || o.Metrics.FilterProvider == nil || o.HealthProbeBindAddress != ":8081" {
		t.Errorf("metrics %q secure %v filter %v, probes %q", o.Metrics.BindAddress, o.Metrics.SecureServing, o.Metrics.FilterProvider != nil, o.HealthProbeBindAddress)
	}
	if o.PprofBindAddress != "" {
		t.Errorf("pprof served on %q by default; want off", o.PprofBindAddress)
	}
	if o.Cache.DefaultTransform == nil {
		t.Error("no default cache transform: managed fields are cached")
	}
	// ctrl.GetConfig disables the client-side limiter (QPS -1); it stays so.
	rc := cfg.RESTConfig(&rest.Config{QPS: -1})
	if rc.QPS != -1 || rc.Burst != 0 {
		t.Errorf("QPS %v burst %d, want -1 0 (unlimited, as before)", rc.QPS, rc.Burst)
	}
}

// TestManagerFlags: every tuning flag reaches the manager's options or its
// REST config.
func TestManagerFlags(t *testing.T) {
	cfg, err := parseManagerFlags(
		"--kube-api-qps=50", "--kube-api-burst=80",
		"--max-concurrent-reconciles=Callee=4,capabilityPolicy=2", "--max-concurrent-reconciles=hcpsession=8",
		"--leader-elect", "--leader-election-id=hcp-a", "--leader-election-namespace=ops",
		"--leader-election-lease-duration=60s", "--leader-election-renew-deadline=40s", "--leader-election-retry-period=5s",
		"--cache-sync-timeout=10m", "--watch-namespaces=team-a, team-b,team-a", "--default-connection-secret=hcp-system/rmq",
		"--metrics-bind-address=:8443", "--metrics-secure=false", "--sidecar-image=example.com/hcp:1",
		"--pprof-bind-address=127.0.0.1:6060",
	)
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.ManagerOptions(runtime.NewScheme())
	if !o.LeaderElection || o.LeaderElectionID != "hcp-a" || o.LeaderElectionNamespace != "ops" {
		t.Errorf("leader election %v %q %q", o.LeaderElection, o.LeaderElectionID, o.LeaderElectionNamespace)
	}
	if *o.LeaseDuration != time.Minute || *o.RenewDeadline != 40*time.Second || *o.RetryPeriod != 5*time.Second {
		t.Errorf("lease %v renew %v retry %v", *o.LeaseDuration, *o.RenewDeadline, *o.RetryPeriod)
	}
	want := map[string]int{"Callee.hcp.io": 4, "Caller.hcp.io": 1, "CapabilityPolicy.hcp.io": 2, "HCPSession.hcp.io": 8}
	if !maps.Equal(o.Controller.GroupKindConcurrency, want) {
		t.Errorf("GroupKindConcurrency %v, want %v", o.Controller.GroupKindConcurrency, want)
	}
	if o.Controller.CacheSyncTimeout != 10*time.Minute {
		t.Errorf("CacheSyncTimeout %v", o.Controller.CacheSyncTimeout)
	}
	if o.Metrics.BindAddress != ":8443" || o.Metrics.SecureServing || o.Metrics.FilterProvider != nil {
		t.Errorf("metrics %q secure %v filter %v", o.Metrics.BindAddress, o.Metrics.SecureServing, o.Metrics.FilterProvider != nil)
	}
	if o.PprofBindAddress != "127.0.0.1:6060" {
		t.Errorf("pprof on %q", o.PprofBindAddress)
	}
	if got := slices.Sorted(maps.Keys(o.Cache.DefaultNamespaces)); !slices.Equal(got, []string{"team-a", "team-b"}) {
		t.Errorf("cached namespaces %v", got)
	}
	if cfg.DefaultBroker == nil || *cfg.DefaultBroker != (resource.DefaultBroker{Namespace: "hcp-system", Name: "rmq"}) || cfg.SidecarImage != "example.com/hcp:1" {
		t.Errorf("reconciler options %+v", cfg.Options)
	}
	base := &rest.Config{Host: "https://example.com", QPS: -1}
	rc := cfg.RESTConfig(base)
	if rc.QPS != 50 || rc.Burst != 80 || rc.Host != base.Host || base.QPS != -1 {
		t.Errorf("QPS %v burst %d host %q (base QPS %v)", rc.QPS, rc.Burst, rc.Host, base.QPS)
	}

	cfg, err = parseManagerFlags("--kube-api-qps=7.5")
	if err != nil {
		t.Fatal(err)
	}
	if rc := cfg.RESTConfig(base); rc.QPS != 7.5 || rc.Burst != 15 {
		t.Errorf("QPS %v burst %d, want 7.5 and twice that", rc.QPS, rc.Burst)
	}
}

// TestManagerFlagsInvalid: a bad value fails at start with a message that
// names the flag and says what is wanted.
func TestManagerFlagsInvalid(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kube-api-qps=-1"}, "--kube-api-qps=-1: want 0 (no client-side limit) or a positive number"},
		{[]string{"--kube-api-qps=abc"}, `invalid value "abc" for flag -kube-api-qps`},
		{[]string{"--kube-api-burst=10"}, "--kube-api-burst=10 needs --kube-api-qps"},
		{[]string{"--kube-api-qps=5", "--kube-api-burst=-2"}, "--kube-api-burst=-2: want 0"},
		{[]string{"--max-concurrent-reconciles=callee=0"}, "callee=0: want a whole number of at least 1"},
		{[]string{"--max-concurrent-reconciles=callee=two"}, "callee=two: want a whole number of at least 1"},
		{[]string{"--max-concurrent-reconciles=callees=2"}, `unknown controller "callees": want one of callee, caller, capabilitypolicy, hcpsession`},
		{[]string{"--max-concurrent-reconciles=4"}, `"4": want callee=N,caller=N,capabilitypolicy=N,hcpsession=N`},
		{[]string{"--leader-election-lease-duration=10s"}, "--leader-election-renew-deadline=10s must be shorter than --leader-election-lease-duration=10s"},
		{[]string{"--leader-election-retry-period=9s"}, "--leader-election-renew-deadline=10s must be longer than 1.2 × --leader-election-retry-period=9s"},
		{[]string{"--leader-election-retry-period=0s"}, "all must be positive"},
		{[]string{"--leader-election-lease-duration=fast"}, `invalid value "fast" for flag -leader-election-lease-duration`},
		{[]string{"--leader-election-id=Not_A_Name"}, `--leader-election-id="Not_A_Name": not a valid Lease name`},
		{[]string{"--leader-election-namespace=a.b"}, `--leader-election-namespace="a.b"`},
		{[]string{"--cache-sync-timeout=0s"}, "--cache-sync-timeout=0s: must be positive"},
		{[]string{"--watch-namespaces=team-a,Team_B"}, `namespace "Team_B"`},
		{[]string{"--default-connection-secret=/rmq"}, `default connection secret "/rmq": want NAMESPACE/NAME or NAME`},
		{[]string{"--sidecar-image="}, "--sidecar-image: must not be empty"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := parseManagerFlags(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	// Every problem at once, not one per start.
	_, err := parseManagerFlags("--kube-api-qps=-1", "--cache-sync-timeout=-1s")
	if err == nil || !strings.Contains(err.Error(), "--kube-api-qps") || !strings.Contains(err.Error(), "--cache-sync-timeout") {
		t.Errorf("error %v, want both problems", err)
	}
}

// TestControllerKinds: the kinds the concurrency flag maps to are the
// hcp.io kinds registered in the scheme (a renamed kind would silently
// fall back to one worker).
func TestControllerKinds(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for name, kind := range controllerKinds {
		if !scheme.Recognizes(hcpv1alpha1.GroupVersion.WithKind(kind)) {
			t.Errorf("controller %s: kind %s is not in hcp.io", name, kind)
		}
		if name != strings.ToLower(kind) {
			t.Errorf("controller %s reconciles %s: the builder names a controller after its kind, lower-cased", name, kind)
		}
	}
}

// TestCacheTransforms: what the cache keeps of each kind.
func TestCacheTransforms(t *testing.T) {
	opts := CacheOptions(Options{})
	transform := func(obj client.Object) client.Object {
		t.Helper()
		f := opts.DefaultTransform
		for key, by := range opts.ByObject {
			if reflect.TypeOf(key) == reflect.TypeOf(obj) && by.Transform != nil {
				f = by.Transform
			}
		}
		out, err := f(obj)
		if err != nil {
			t.Fatal(err)
		}
		return out.(client.Object)
	}
	meta := func(labels map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{
			Name: "x", Namespace: "ns", Labels: labels,
			Annotations:   map[string]string{corev1.LastAppliedConfigAnnotation: `{"big":"copy"}`, "keep": "me"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
		}
	}
	managed := map[string]string{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue}
	now := metav1.Now()
	for _, tc := range []struct {
		name        string
		obj         client.Object
		lastApplied bool // kept
		check       func(client.Object) string
	}{
		{"Callee", &hcpv1alpha1.Callee{ObjectMeta: meta(nil), Spec: hcpv1alpha1.CalleeSpec{CalleeID: "lab"}}, false, func(o client.Object) string {
			if o.(*hcpv1alpha1.Callee).Spec.CalleeID != "lab" {
				return "spec lost"
			}
			return ""
		}},
		{"Caller", &hcpv1alpha1.Caller{ObjectMeta: meta(nil)}, false, nil},
		{"CapabilityPolicy", &hcpv1alpha1.CapabilityPolicy{ObjectMeta: meta(nil)}, false, nil},
		{"HCPSession", &hcpv1alpha1.HCPSession{ObjectMeta: meta(nil), Spec: hcpv1alpha1.HCPSessionSpec{CalleeID: "lab"}, Status: hcpv1alpha1.HCPSessionStatus{
			State: hcpv1alpha1.SessionCompleted, PodName: "p", CompletedAt: &now, LastEventAt: &now,
			Result:   &hcpv1alpha1.SessionResult{Summary: "done"},
			Progress: &hcpv1alpha1.SessionProgress{Stage: "s"}, LastCheckpoint: &hcpv1alpha1.SessionCheckpoint{ID: "c"},
			Error: &hcpv1alpha1.SessionError{Code: "e"},
		}}, false, func(o client.Object) string {
			s := o.(*hcpv1alpha1.HCPSession).Status
			if s.Result != nil || s.Progress != nil || s.LastCheckpoint != nil || s.Error != nil {
				return "harness reports kept"
			}
			if s.State != hcpv1alpha1.SessionCompleted || s.PodName != "p" || s.CompletedAt == nil || s.LastEventAt == nil ||
				o.(*hcpv1alpha1.HCPSession).Spec.CalleeID != "lab" {
				return "what the operator reads was dropped"
			}
			return ""
		}},
		// A connection Secret someone kubectl-applied: its data stays,
		// the copy of it in the annotation goes.
		{"Secret unmanaged", &corev1.Secret{ObjectMeta: meta(nil), Data: map[string][]byte{"uri": []byte("http://x")}}, false, func(o client.Object) string {
			if string(o.(*corev1.Secret).Data["uri"]) != "http://x" {
				return "data lost"
			}
			return ""
		}},
		// The operator updates its own Secrets whole: nothing but managed
		// fields may go.
		{"Secret managed", &corev1.Secret{ObjectMeta: meta(managed)}, true, nil},
		// A harness Deployment: what deploymentUpToDate, the status and the
		// /scale selector read stays; the pod spec (the largest part of it,
		// which no cached read needs) goes.
		{"Deployment", &appsv1.Deployment{ObjectMeta: meta(managed), Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}, Annotations: map[string]string{hcpv1alpha1.AnnotationConfigHash: "h"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "harness", Image: "i"}, {Name: "hcp-sidecar", Image: "s"}}},
			},
		}, Status: appsv1.DeploymentStatus{ReadyReplicas: 2}}, true, func(o client.Object) string {
			d := o.(*appsv1.Deployment)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 || d.Spec.Selector == nil || d.Status.ReadyReplicas != 2 ||
				d.Spec.Template.Labels["app"] != "x" || d.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash] != "h" {
				return "what the operator reads was dropped"
			}
			if len(d.Spec.Template.Spec.Containers) != 0 {
				return "pod spec kept"
			}
			return ""
		}},
		{"Queue", &topologyv1beta1.Queue{ObjectMeta: meta(managed)}, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := transform(tc.obj.DeepCopyObject().(client.Object))
			if o.GetManagedFields() != nil {
				t.Error("managed fields kept")
			}
			if _, ok := o.GetAnnotations()[corev1.LastAppliedConfigAnnotation]; ok != tc.lastApplied {
				t.Errorf("last-applied-configuration kept: %v, want %v", ok, tc.lastApplied)
			}
			if o.GetAnnotations()["keep"] != "me" {
				t.Error("other annotations dropped")
			}
			if tc.check != nil {
				if msg := tc.check(o); msg != "" {
					t.Error(msg)
				}
			}
			// Idempotent: informers may transform an object twice.
			again := transform(o.DeepCopyObject().(client.Object))
			if !equality.Semantic.DeepEqual(again, o) {
				t.Error("transform not idempotent")
			}
		})
	}
}
