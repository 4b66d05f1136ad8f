package callee

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/tracing"
)

// AnnotationTraceparent and AnnotationTracestate on an HCPSession keep the
// W3C trace context the session belongs to (the task_submit's, or with
// tracing on the gate span's), so that a restarted sidecar or another
// replica that adopts the session goes on in the same trace.
const (
	AnnotationTraceparent = "hcp.io/traceparent"
	AnnotationTracestate  = "hcp.io/tracestate"
)

// sessTrace is a session's trace context: what its events, results and
// harness calls carry.
type sessTrace struct {
	// ctx is the session span's context with tracing on, the context the
	// session was created in with tracing off.
	ctx tracing.Context
	// headers is ctx as AMQP headers, built once and shared read-only by
	// every message of the session (no allocation per event).
	headers amqp.Table
	span    tracing.Span
}

// startTrace gives a session built from hs its trace context: the session
// span starts as a child of the one recorded on hs. resumed says the
// session was adopted (a restart or a takeover) rather than just admitted.
func (ss *sess) startTrace(hs *v1alpha1.HCPSession, resumed bool) {
	parent := tracing.Parse(hs.Annotations[AnnotationTraceparent], hs.Annotations[AnnotationTracestate])
	ss.trace.ctx = parent
	if tracing.Enabled() {
		ss.trace.span, ss.trace.ctx = tracing.StartSpan("hcp.session", oteltrace.SpanKindServer, parent,
			attribute.String("hcp.session_id", hs.Name), attribute.String("hcp.callee_id", hs.Spec.CalleeID),
			attribute.String("hcp.caller_id", hs.Spec.CallerID), attribute.String("hcp.capability", hs.Spec.Capability),
			attribute.String("hcp.risk_level", string(hs.Spec.RiskLevel)), attribute.Bool("hcp.resumed", resumed))
	}
	ss.trace.headers = ss.trace.ctx.AMQPHeaders()
}

// endTrace ends the session span (on this replica): the session ended in
// state, or left this replica (moved), or never started.
func (ss *sess) endTrace(state, reason string, failed bool) {
	sp := ss.trace.span
	if !sp.Recording() {
		return
	}
	sp.SetAttributes(attribute.String("hcp.state", state), attribute.String("hcp.reason", reason),
		attribute.Int64("hcp.events", ss.events))
	if failed {
		sp.Fail(reason)
	}
	sp.End()
}

// traceAnnotations records trace on a new HCPSession.
func traceAnnotations(hs *v1alpha1.HCPSession, trace tracing.Context) {
	if trace.IsZero() {
		return
	}
	if hs.Annotations == nil {
		hs.Annotations = map[string]string{}
	}
	hs.Annotations[AnnotationTraceparent] = trace.Parent
	if trace.State != "" {
		hs.Annotations[AnnotationTracestate] = trace.State
	}
}

type traceKey struct{}

// withTrace makes the harness calls made with ctx carry trace.
func withTrace(ctx context.Context, trace tracing.Context) context.Context {
	if trace.IsZero() {
		return ctx
	}
	return context.WithValue(ctx, traceKey{}, trace)
}

func traceOf(ctx context.Context) tracing.Context {
	t, _ := ctx.Value(traceKey{}).(tracing.Context)
	return t
}
