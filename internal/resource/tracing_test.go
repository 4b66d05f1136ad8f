package resource

import (
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/hcp-io/hcp-operator/internal/sidecar/tracing"
)

// The tracing environment the operator gives a sidecar is what the
// sidecar's tracing setup reads: off by default, OTLP export when the
// manager has an endpoint.
func TestSidecarTracingEnv(t *testing.T) {
	if envTracing != tracing.EnvTracing || tracingOTLP != tracing.ModeOTLP || tracingServiceName != tracing.DefaultServiceName {
		t.Fatal("the tracing environment names drifted from internal/sidecar/tracing")
	}
	cr := sampleCaller()
	for _, tc := range []struct {
		name    string
		tracing SidecarTracing
		want    map[string]string
	}{
		{"off", SidecarTracing{}, map[string]string{envTracing: "", "OTEL_EXPORTER_OTLP_ENDPOINT": ""}},
		{"grpc", SidecarTracing{OTLPEndpoint: "http://otel-collector.observability:4317"},
			map[string]string{envTracing: "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "", "OTEL_SERVICE_NAME": "hcp-sidecar"}},
		{"http", SidecarTracing{OTLPEndpoint: "http://otel-collector.observability:4318", Protocol: "http/protobuf"},
			map[string]string{envTracing: "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := SidecarContainer(HarnessParams{Subject: ForCaller(cr), Harness: *cr.Spec.Harness, Vhost: "/hcp", Prefetch: 10, Tracing: tc.tracing})
			env := map[string]string{}
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					env[e.Name] = e.Value
				}
			}
			for k, v := range tc.want {
				if env[k] != v {
					t.Errorf("env %s = %q, want %q", k, env[k], v)
				}
			}
			stop, err := tracing.Setup(func(k string) string { return env[k] }, testr.New(t))
			if err != nil {
				t.Fatalf("the sidecar's tracing setup refuses this env: %v", err)
			}
			if tracing.Enabled() != tc.tracing.Enabled() {
				t.Errorf("tracing on = %v, want %v", tracing.Enabled(), tc.tracing.Enabled())
			}
			stop()
		})
	}
	if err := ParseOTLPProtocol("http/json"); err == nil {
		t.Error("http/json accepted")
	}
}
