package controller

import (
	"strings"
	"testing"

	"github.com/hcp-io/hcp-operator/internal/resource"
)

// --sidecar-otlp-endpoint and --sidecar-otlp-protocol reach the sidecars'
// HarnessParams; a protocol the SDK does not speak is refused at start.
func TestManagerFlagsSidecarTracing(t *testing.T) {
	cfg, err := parseManagerFlags("--sidecar-otlp-endpoint=http://otel-collector.observability:4318", "--sidecar-otlp-protocol=http/protobuf")
	if err != nil {
		t.Fatal(err)
	}
	want := resource.SidecarTracing{OTLPEndpoint: "http://otel-collector.observability:4318", Protocol: "http/protobuf"}
	if cfg.SidecarTracing != want || !cfg.SidecarTracing.Enabled() {
		t.Fatalf("SidecarTracing = %+v, want %+v", cfg.SidecarTracing, want)
	}
	if cfg, err := parseManagerFlags(); err != nil || cfg.SidecarTracing.Enabled() {
		t.Fatalf("default: %+v, %v; want tracing off", cfg.SidecarTracing, err)
	}
	if _, err := parseManagerFlags("--sidecar-otlp-protocol=http/json"); err == nil || !strings.Contains(err.Error(), "--sidecar-otlp-protocol") {
		t.Fatalf("http/json: %v", err)
	}
}
