package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Environment of the sidecar that switches tracing on. Everything else is
// the OpenTelemetry SDK's own environment, honoured as it documents it:
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
// OTEL_EXPORTER_OTLP_PROTOCOL (grpc, the default here, or http/protobuf),
// OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_INSECURE,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG),
// OTEL_BSP_*.
const (
	// EnvTracing: "otlp" records spans and exports them over OTLP; "" or
	// "off" records none (trace context is still passed on).
	EnvTracing = "HCP_TRACING"
	// ModeOTLP is EnvTracing's value that switches export on.
	ModeOTLP = "otlp"
	// DefaultServiceName is service.name unless OTEL_SERVICE_NAME says
	// otherwise.
	DefaultServiceName = "hcp-sidecar"
)

// shutdownTimeout bounds the flush of the spans not yet exported at stop.
const shutdownTimeout = 5 * time.Second

// Setup switches tracing on as the environment says (EnvTracing and the
// SDK's variables, read through getenv) and returns the function that
// flushes and stops it. With tracing off, or misconfigured (logged: a
// sidecar never stops for its traces), it does nothing and stop is a
// no-op. The exporter connects lazily: a collector that is down costs
// dropped spans, never a blocked relay.
func Setup(getenv func(string) string, log logr.Logger) (stop func(), err error) {
	noop := func() {}
	mode := strings.ToLower(strings.TrimSpace(getenv(EnvTracing)))
	switch mode {
	case "", "off", "none", "false":
		return noop, nil
	case ModeOTLP:
	default:
		return noop, fmt.Errorf("%s=%q: want %q or off", EnvTracing, mode, ModeOTLP)
	}
	ctx := context.Background()
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp sdktrace.SpanExporter
	switch proto {
	case "", "grpc":
		exp, err = otlptracegrpc.New(ctx)
	case "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	default:
		return noop, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: want grpc or http/protobuf", proto)
	}
	if err != nil {
		return noop, fmt.Errorf("creating the OTLP exporter: %w", err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", DefaultServiceName)}
	for env, key := range map[string]string{
		"HCP_MODE": "hcp.mode", "HCP_ID": "hcp.id", "HCP_VHOST": "hcp.vhost",
		"HCP_NAMESPACE": "k8s.namespace.name", "HCP_POD_NAME": "k8s.pod.name",
	} {
		if v := getenv(env); v != "" {
			attrs = append(attrs, attribute.String(key, v))
		}
	}
	// The environment (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) wins
	// over the defaults above.
	res, err := resource.Merge(resource.NewSchemaless(attrs...), resource.Environment())
	if err != nil {
		log.Info("Ignored part of the OpenTelemetry resource environment", "error", err.Error())
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	Use(tp)
	log.Info("Tracing on: exporting spans over OTLP", "protocol", orDefault(proto, "grpc"),
		"endpoint", orDefault(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), getenv("OTEL_EXPORTER_OTLP_ENDPOINT")))
	return func() {
		Use(nil)
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
			log.Error(err, "Failed to flush the last spans")
		}
	}, nil
}

// Start is Setup with the process environment, for the sidecar's main:
//
//	defer tracing.Start(log)()
//
// A configuration error is logged and tracing stays off.
func Start(log logr.Logger) (stop func()) {
	stop, err := Setup(os.Getenv, log)
	if err != nil {
		log.Error(err, "Tracing stays off")
	}
	return stop
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
