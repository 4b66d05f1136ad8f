// Package tracing carries W3C trace context (traceparent, tracestate)
// through the sidecars and, when switched on, records their spans with the
// OpenTelemetry SDK and exports them over OTLP.
//
// Propagation never depends on tracing being on: a traceparent that comes
// in (the caller app's submit, a task_submit's AMQP headers, an event's
// AMQP headers) is validated and passed on as it is, at the cost of a
// string check. With tracing on, each sidecar starts its own spans as
// children of what came in and passes their context on instead.
//
// A malformed traceparent is ignored, never an error: trace context is
// advisory and must not make a task or an event fail.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// ScopeName is the instrumentation scope of the sidecars' spans.
const ScopeName = "github.com/hcp-io/hcp-operator/internal/sidecar"

// HTTP header names (canonical form) of the harness APIs.
const (
	HTTPTraceparent = "Traceparent"
	HTTPTracestate  = "Tracestate"
)

// maxTracestate bounds a tracestate passed on (W3C: 32 members of at most
// 256 characters; vendors may truncate, 512 is the common limit).
const maxTracestate = 512

// Context is a W3C trace context as it travels: a valid traceparent and
// its tracestate. The zero value means none.
type Context struct {
	Parent string
	State  string
}

// IsZero reports whether c carries no trace context.
func (c Context) IsZero() bool { return c.Parent == "" }

// TraceID is the trace id (32 hex digits), "" for none.
func (c Context) TraceID() string {
	if c.IsZero() {
		return ""
	}
	return c.Parent[3:35]
}

// Parse validates a traceparent (and its tracestate) as W3C Trace Context
// level 1 defines them. Anything malformed gives the zero Context; a
// tracestate that is too long or not printable ASCII is dropped on its
// own. A traceparent of a later version is reduced to the fields version
// 00 defines, as the recommendation says. Parse allocates only for such a
// later version.
func Parse(traceparent, tracestate string) Context {
	p, ok := validParent(traceparent)
	if !ok {
		return Context{}
	}
	if !validState(tracestate) {
		tracestate = ""
	}
	return Context{Parent: p, State: tracestate}
}

func validParent(s string) (string, bool) {
	if len(s) < 55 {
		return "", false
	}
	if !isHex(s[0:2]) || s[0:2] == "ff" {
		return "", false
	}
	if s[0:2] == "00" && len(s) != 55 {
		return "", false
	}
	if len(s) > 55 && s[55] != '-' {
		return "", false
	}
	if s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return "", false
	}
	tid, sid, flags := s[3:35], s[36:52], s[53:55]
	if !isHex(tid) || !isHex(sid) || !isHex(flags) || allZero(tid) || allZero(sid) {
		return "", false
	}
	f, _ := strconv.ParseUint(flags, 16, 8)
	if s[0:2] != "00" {
		// A later version, read as 00: of its flags, only sampled is known.
		return fmt.Sprintf("00%s%02x", s[2:53], f&0x01), true
	}
	// Version 00 defines sampled (01) and, in Level 2, random (02); a
	// header with other flags set is refused, as the OpenTelemetry SDK's
	// propagator refuses it (a fuzz finding: we accepted 10).
	if f > 0x02 {
		return "", false
	}
	return s, true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func allZero(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '0' {
			return false
		}
	}
	return true
}

func validState(s string) bool {
	if len(s) > maxTracestate {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// FromAMQP reads the trace context of a message's AMQP headers
// (envelope.HeaderTraceparent, envelope.HeaderTracestate). Values that are
// not strings, or not valid, are ignored.
func FromAMQP(h amqp.Table) Context {
	if len(h) == 0 {
		return Context{}
	}
	p, _ := h[envelope.HeaderTraceparent].(string)
	if p == "" {
		return Context{}
	}
	st, _ := h[envelope.HeaderTracestate].(string)
	return Parse(p, st)
}

// FromHTTP reads the trace context of an HTTP request's headers. Several
// traceparent headers make it invalid (W3C); several tracestate headers are
// joined.
func FromHTTP(h http.Header) Context {
	ps := h[HTTPTraceparent]
	if len(ps) != 1 {
		return Context{}
	}
	st := ""
	switch ss := h[HTTPTracestate]; len(ss) {
	case 0:
	case 1:
		st = ss[0]
	default:
		st = strings.Join(ss, ",")
	}
	return Parse(strings.TrimSpace(ps[0]), strings.TrimSpace(st))
}

// AMQPHeaders is c as an AMQP header table, nil for none. The table is
// meant to be built once (per session, per task) and shared read-only by
// every publishing: its values are boxed once, so setting it costs no
// allocation per message (see envelope.SetConfirmedThrough, which copies
// it).
func (c Context) AMQPHeaders() amqp.Table {
	if c.IsZero() {
		return nil
	}
	t := amqp.Table{envelope.HeaderTraceparent: c.Parent}
	if c.State != "" {
		t[envelope.HeaderTracestate] = c.State
	}
	return t
}

// SetHTTP sets c on HTTP headers h (nothing for none).
func (c Context) SetHTTP(h http.Header) {
	if c.IsZero() {
		return
	}
	h[HTTPTraceparent] = []string{c.Parent}
	if c.State != "" {
		h[HTTPTracestate] = []string{c.State}
	}
}

// The provider in use; nil while tracing is off.
var (
	enabled atomic.Bool
	tracer  atomic.Pointer[trace.Tracer]
)

// Enabled reports whether the sidecars record spans.
func Enabled() bool { return enabled.Load() }

// Use makes the sidecars record their spans with tp; nil switches span
// recording off (propagation goes on). Start calls it; tests call it with
// an SDK provider and an in-memory exporter.
func Use(tp trace.TracerProvider) {
	if tp == nil {
		enabled.Store(false)
		tracer.Store(nil)
		return
	}
	t := tp.Tracer(ScopeName)
	tracer.Store(&t)
	enabled.Store(true)
}

var w3c = propagation.TraceContext{}

// carrier adapts a Context to the propagator.
type carrier struct{ c *Context }

func (k carrier) Get(key string) string {
	switch key {
	case envelope.HeaderTraceparent:
		return k.c.Parent
	case envelope.HeaderTracestate:
		return k.c.State
	}
	return ""
}

func (k carrier) Set(key, value string) {
	switch key {
	case envelope.HeaderTraceparent:
		k.c.Parent = value
	case envelope.HeaderTracestate:
		k.c.State = value
	}
}

func (carrier) Keys() []string {
	return []string{envelope.HeaderTraceparent, envelope.HeaderTracestate}
}

// Span is a span of a sidecar, or nothing when tracing is off: every
// method is safe on the zero Span.
type Span struct{ s trace.Span }

// StartSpan starts a span named name as a child of parent (the remote context
// that came in) and returns it with the context to pass on: the span's
// when tracing is on, parent unchanged when it is off (no span, no
// allocation).
func StartSpan(name string, kind trace.SpanKind, parent Context, attrs ...attribute.KeyValue) (Span, Context) {
	if !enabled.Load() {
		return Span{}, parent
	}
	t := tracer.Load()
	if t == nil {
		return Span{}, parent
	}
	ctx := context.Background()
	if !parent.IsZero() {
		ctx = w3c.Extract(ctx, carrier{&parent})
	}
	_, sp := (*t).Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	return Span{sp}, contextOf(sp.SpanContext())
}

// StartSpanLinked is StartSpan for a span whose parent is parent and that links to
// the contexts of others (a batch delivered in one request).
func StartSpanLinked(name string, kind trace.SpanKind, parent Context, others []Context, attrs ...attribute.KeyValue) (Span, Context) {
	if !enabled.Load() || len(others) == 0 {
		return StartSpan(name, kind, parent, attrs...)
	}
	links := make([]trace.Link, 0, len(others))
	for i := range others {
		if others[i].IsZero() || others[i] == parent {
			continue
		}
		sc := trace.SpanContextFromContext(w3c.Extract(context.Background(), carrier{&others[i]}))
		if sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	t := tracer.Load()
	if t == nil {
		return Span{}, parent
	}
	ctx := context.Background()
	if !parent.IsZero() {
		ctx = w3c.Extract(ctx, carrier{&parent})
	}
	_, sp := (*t).Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...), trace.WithLinks(links...))
	return Span{sp}, contextOf(sp.SpanContext())
}

func contextOf(sc trace.SpanContext) Context {
	var c Context
	if !sc.IsValid() {
		return c
	}
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier{&c})
	return c
}

// Recording reports whether s records (tracing on and sampled).
func (s Span) Recording() bool { return s.s != nil && s.s.IsRecording() }

// SetAttributes adds attributes to s.
func (s Span) SetAttributes(attrs ...attribute.KeyValue) {
	if s.s != nil {
		s.s.SetAttributes(attrs...)
	}
}

// AddEvent records an event on s.
func (s Span) AddEvent(name string, attrs ...attribute.KeyValue) {
	if s.s != nil {
		s.s.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// Fail marks s as failed with msg.
func (s Span) Fail(msg string) {
	if s.s != nil {
		s.s.SetStatus(codes.Error, msg)
	}
}

// End ends s.
func (s Span) End() {
	if s.s != nil {
		s.s.End()
	}
}
