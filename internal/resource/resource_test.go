package resource

import (
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func sampleCallee() *hcpv1alpha1.Callee {
	return &hcpv1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Name: "lab-cvd", Namespace: "labs", UID: "uid-callee"},
		Spec: hcpv1alpha1.CalleeSpec{
			Broker: hcpv1alpha1.BrokerSpec{
				RabbitmqClusterReference: &hcpv1alpha1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: "rmq"}},
				Vhost:                    "/hcp",
			},
			Capabilities: []hcpv1alpha1.Capability{{Name: "synthesis.cvd", RiskLevel: hcpv1alpha1.RiskR3, DataClassification: hcpv1alpha1.DataT2}},
			CommandQueue: hcpv1alpha1.CommandQueueSpec{MaxLength: new(int64(1000)), DeliveryLimit: new(int32(5))},
			Harness: hcpv1alpha1.HarnessSpec{
				Replicas: new(int32(2)),
				Port:     8080,
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "cvd"}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "harness", Image: "example.com/cvd:1"}}},
				},
			},
			Sidecar: hcpv1alpha1.SidecarSpec{Prefetch: new(int32(4))},
		},
	}
}

func sampleCaller() *hcpv1alpha1.Caller {
	return &hcpv1alpha1.Caller{
		ObjectMeta: metav1.ObjectMeta{Name: "alpha", Namespace: "labs", UID: "uid-caller"},
		Spec: hcpv1alpha1.CallerSpec{
			Broker:     hcpv1alpha1.BrokerSpec{Vhost: "/hcp"},
			EventQueue: hcpv1alpha1.EventQueueSpec{MessageTTL: "PT24H", MaxLength: new(int64(100000)), Overflow: "drop-head"},
			Consumer:   hcpv1alpha1.ConsumerSpec{Prefetch: 10},
			Harness: &hcpv1alpha1.HarnessSpec{
				Port: 3000,
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
					{Name: "app", Image: "example.com/agent:1"},
					{Name: SidecarContainerName, Image: "user-tried-to-override"},
				}}},
			},
		},
	}
}

func connSecret() *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "rmq", Namespace: "labs"},
		Data: map[string][]byte{
			"uri":      []byte("http://RabbitMQ.example.com:15672"),
			"username": []byte("admin"),
			"password": []byte("secret"),
		},
	}
}

func sampleBroker(t *testing.T, spec hcpv1alpha1.BrokerSpec) Broker {
	t.Helper()
	ref, err := Reference(spec, &DefaultBroker{Namespace: "hcp-system", Name: "default-rmq"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := BrokerFromConnectionSecret(ref, spec, connSecret())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// golden compares objs, rendered as a YAML stream, with testdata/name.
func golden(t *testing.T, name string, objs ...runtime.Object) {
	t.Helper()
	var b strings.Builder
	for _, o := range objs {
		gvk := gvkOf(t, o)
		o = o.DeepCopyObject()
		o.GetObjectKind().SetGroupVersionKind(gvk)
		y, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/resource -update to create it)", err)
	}
	if got := b.String(); got != string(want) {
		t.Errorf("%s differs from the golden file (go test ./internal/resource -update rewrites it after review):\n%s", path, lineDiff(string(want), got))
	}
}

var testScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, topologyv1beta1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

func gvkOf(t *testing.T, o runtime.Object) schema.GroupVersionKind {
	t.Helper()
	kinds, _, err := testScheme.ObjectKinds(o)
	if err != nil {
		t.Fatal(err)
	}
	return kinds[0]
}

func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl + "\n")
		}
	}
	return b.String()
}

// The callee uses TLS (a CA and a client certificate), the caller not.
func TestCalleeGolden(t *testing.T) {
	c := sampleCallee()
	c.Spec.Broker.TLS = &hcpv1alpha1.BrokerTLS{CASecret: "rabbitmq-ca", ClientCertSecret: "lab-cvd-amqp-client"}
	b := sampleBroker(t, c.Spec.Broker)
	s := ForCallee(c)
	cmd, evt := Exchanges(c.Namespace, b, b.Reference)
	creds, err := CredentialsSecret(s, b, "p@ss/word")
	if err != nil {
		t.Fatal(err)
	}
	dep := Deployment(HarnessParams{Subject: s, Harness: c.Spec.Harness, Sidecar: c.Spec.Sidecar, Vhost: b.Vhost, Image: "ghcr.io/hcp-io/hcp-operator:v1", Prefetch: 4, SecretsHash: "h1", TLS: c.Spec.Broker.TLS})
	golden(t, "callee.golden.yaml",
		Vhost(c.Namespace, b, b.Reference, DeletionPolicyRetain), cmd, evt,
		CalleeQueue(c, b), CalleeLimitsPolicy(c, b), Binding(s, b), User(s, b), Permission(s, b),
		WithTokenKeys(creds, TokenKeys{PrivatePEM: []byte("PRIVATE"), PublicPEM: []byte("PUBLIC"), VerifyPEM: []byte("PUBLIC"), Rotation: "2026-11-25"}),
		ServiceAccount(s), CalleeRoleBinding(s, DefaultCalleeSidecarClusterRole), dep,
		PodDisruptionBudget(s, hcpv1alpha1.PodDisruptionBudgetSpec{MinAvailable: new(intstr.FromInt32(1))}))
}

func TestCallerGolden(t *testing.T) {
	c := sampleCaller()
	b := sampleBroker(t, c.Spec.Broker)
	s := ForCaller(c)
	q, err := CallerQueue(c, b)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := CredentialsSecret(s, b, "pw")
	if err != nil {
		t.Fatal(err)
	}
	dep := Deployment(HarnessParams{Subject: s, Harness: *c.Spec.Harness, Vhost: b.Vhost, Prefetch: 10, SecretsHash: "h2"})
	p, err := CallerLimitsPolicy(c, b)
	if err != nil || p != nil {
		t.Fatalf("a Caller with the default limits: policy %v, error %v; want none (the vhost's default policy)", p, err)
	}
	golden(t, "caller.golden.yaml", q, DefaultEventLimitsPolicy("hcp-system", b, b.Reference), Binding(s, b), User(s, b), Permission(s, b), creds, ServiceAccount(s), Role(s), RoleBinding(s), dep)
}
