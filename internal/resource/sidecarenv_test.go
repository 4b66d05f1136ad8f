package resource

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	hcpv1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
)

// spec.sidecar.env reaches the sidecar container after the operator's own
// variables: a new name is appended, a tracing variable the operator sets
// takes the user's value (once, in place), and an HCP_* name, the
// operator's contract with the sidecar, never replaces the operator's.
func TestSidecarUserEnv(t *testing.T) {
	cr := sampleCaller()
	proxy := corev1.EnvVar{Name: "HTTPS_PROXY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "proxy"}, Key: "url"}}}
	user := []corev1.EnvVar{
		{Name: "GODEBUG", Value: "schedtrace=2147483647"},
		proxy,
		{Name: "OTEL_SERVICE_NAME", Value: "lab-caller"},
		{Name: config.EnvPrefetch, Value: "100"},
	}
	plain := SidecarContainer(HarnessParams{Subject: ForCaller(cr), Harness: *cr.Spec.Harness, Vhost: "/hcp", Prefetch: 10,
		Tracing: SidecarTracing{OTLPEndpoint: "http://otel:4317"}})
	c := SidecarContainer(HarnessParams{Subject: ForCaller(cr), Harness: *cr.Spec.Harness, Vhost: "/hcp", Prefetch: 10,
		Tracing: SidecarTracing{OTLPEndpoint: "http://otel:4317"}, Sidecar: hcpv1.SidecarSpec{Env: user}})
	names := map[string]int{}
	values := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		names[e.Name]++
		values[e.Name] = e
	}
	for n, k := range names {
		if k > 1 {
			t.Errorf("%s set %d times", n, k)
		}
	}
	if v := values["GODEBUG"].Value; v != "schedtrace=2147483647" {
		t.Errorf("GODEBUG = %q", v)
	}
	if got := values["HTTPS_PROXY"]; got.ValueFrom == nil || got.ValueFrom.SecretKeyRef == nil || got.ValueFrom.SecretKeyRef.Name != "proxy" {
		t.Errorf("HTTPS_PROXY = %+v, want the Secret reference", got)
	}
	if v := values["OTEL_SERVICE_NAME"].Value; v != "lab-caller" {
		t.Errorf("OTEL_SERVICE_NAME = %q, want the user's", v)
	}
	if v := values[config.EnvPrefetch].Value; v != "10" {
		t.Errorf("%s = %q: the user's HCP_ variable replaced the operator's", config.EnvPrefetch, v)
	}
	// The operator's variables keep their order; the user's come after.
	if len(c.Env) != len(plain.Env)+2 {
		t.Fatalf("%d variables, want the operator's %d and 2 more", len(c.Env), len(plain.Env))
	}
	for i, e := range plain.Env {
		if c.Env[i].Name != e.Name {
			t.Fatalf("variable %d is %s, want the operator's %s", i, c.Env[i].Name, e.Name)
		}
	}
	if got := []string{c.Env[len(c.Env)-2].Name, c.Env[len(c.Env)-1].Name}; !slices.Equal(got, []string{"GODEBUG", "HTTPS_PROXY"}) {
		t.Errorf("appended %v", got)
	}
	// The builder does not share the spec's objects.
	c.Env[len(c.Env)-1].ValueFrom.SecretKeyRef.Name = "changed"
	if user[1].ValueFrom.SecretKeyRef.Name != "proxy" {
		t.Error("the container's env aliases the spec's")
	}
}
