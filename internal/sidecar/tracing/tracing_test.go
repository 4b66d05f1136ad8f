package tracing

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr/testr"
	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, parent, state string
		want                Context
	}{
		{"valid", valid, "", Context{Parent: valid}},
		{"valid with state", valid, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", Context{Parent: valid, State: "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"}},
		{"not sampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", "", Context{Parent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}},
		{"later version reduced to 00", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds", "", Context{Parent: valid}},
		{"empty", "", "a=b", Context{}},
		{"upper case", strings.ToUpper(valid), "", Context{}},
		{"version ff", "ff" + valid[2:], "", Context{}},
		{"version 00 too long", valid + "-x", "", Context{}},
		{"later version without dash", "01" + valid[2:] + "x", "", Context{}},
		{"too short", valid[:54], "", Context{}},
		{"zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "", Context{}},
		{"zero parent id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "", Context{}},
		{"not hex", "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", "", Context{}},
		{"wrong separators", "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", "", Context{}},
		{"bad flags", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x", "", Context{}},
		{"state with a newline dropped", valid, "a=b\nc=d", Context{Parent: valid}},
		{"state too long dropped", valid, strings.Repeat("a", 513), Context{Parent: valid}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Parse(tc.parent, tc.state); got != tc.want {
				t.Fatalf("Parse(%q, %q) = %+v, want %+v", tc.parent, tc.state, got, tc.want)
			}
		})
	}
	if id := Parse(valid, "").TraceID(); id != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("TraceID = %q", id)
	}
}

func TestFromAMQP(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    amqp.Table
		want Context
	}{
		{"none", nil, Context{}},
		{"valid", amqp.Table{"traceparent": valid, "tracestate": "a=b"}, Context{Parent: valid, State: "a=b"}},
		{"bytes, not a string", amqp.Table{"traceparent": []byte(valid)}, Context{}},
		{"a number", amqp.Table{"traceparent": int64(7)}, Context{}},
		{"nil value", amqp.Table{"traceparent": nil}, Context{}},
		{"state not a string", amqp.Table{"traceparent": valid, "tracestate": int32(1)}, Context{Parent: valid}},
		{"malformed", amqp.Table{"traceparent": "00-xyz"}, Context{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromAMQP(tc.h); got != tc.want {
				t.Fatalf("FromAMQP = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestFromHTTP(t *testing.T) {
	h := http.Header{}
	if got := FromHTTP(h); !got.IsZero() {
		t.Fatalf("no headers: %+v", got)
	}
	h.Set("traceparent", " "+valid+" ")
	h.Add("tracestate", "a=b")
	h.Add("tracestate", "c=d")
	if got := FromHTTP(h); got != (Context{Parent: valid, State: "a=b,c=d"}) {
		t.Fatalf("FromHTTP = %+v", got)
	}
	h.Add("traceparent", valid)
	if got := FromHTTP(h); !got.IsZero() {
		t.Fatalf("two traceparent headers must be ignored, got %+v", got)
	}
	out := http.Header{}
	Context{Parent: valid, State: "a=b"}.SetHTTP(out)
	if out.Get("traceparent") != valid || out.Get("tracestate") != "a=b" {
		t.Fatalf("SetHTTP: %v", out)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(valid, "a=b")
	f.Add("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", "")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, p, s string) {
		c := Parse(p, s)
		if c.IsZero() {
			return
		}
		// Whatever passes is something the SDK's propagator accepts too.
		if again := Parse(c.Parent, c.State); again != c {
			t.Fatalf("not stable: %+v then %+v", c, again)
		}
		Use(sdktrace.NewTracerProvider())
		defer Use(nil)
		_, out := StartSpan("x", trace.SpanKindInternal, c)
		if out.TraceID() != c.TraceID() {
			t.Fatalf("the SDK refused %q: child in trace %q", c.Parent, out.TraceID())
		}
	})
}

func TestStartSpanOff(t *testing.T) {
	Use(nil)
	in := Context{Parent: valid, State: "a=b"}
	sp, out := StartSpan("x", trace.SpanKindConsumer, in)
	if out != in || sp.Recording() {
		t.Fatalf("off: got %+v (recording %v), want the context passed through", out, sp.Recording())
	}
	sp.End() // safe on the zero Span
	if n := testing.AllocsPerRun(100, func() {
		sp, _ := StartSpan("x", trace.SpanKindConsumer, in)
		sp.End()
		_ = FromAMQP(amqp.Table{"traceparent": valid})
	}); n > 1 { // the table literal itself
		t.Fatalf("off: %v allocations", n)
	}
}

func TestStartSpanParents(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	Use(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	defer Use(nil)
	in := Parse(valid, "rojo=1")
	sp, out := StartSpan("parent", trace.SpanKindConsumer, in)
	child, out2 := StartSpan("child", trace.SpanKindInternal, out)
	child.End()
	sp.End()
	if out.TraceID() != in.TraceID() || out.Parent == in.Parent || out.State != "rojo=1" {
		t.Fatalf("child context %+v of %+v", out, in)
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	c, p := spans[0], spans[1]
	if p.Parent.SpanID().String() != "00f067aa0ba902b7" || !p.Parent.IsRemote() {
		t.Fatalf("parent span's parent = %v", p.Parent)
	}
	if c.Parent.SpanID() != p.SpanContext.SpanID() || out2.Parent[36:52] != c.SpanContext.SpanID().String() {
		t.Fatalf("child's parent %v, want %v", c.Parent.SpanID(), p.SpanContext.SpanID())
	}
	// No incoming context: a new trace.
	root, rc := StartSpan("root", trace.SpanKindProducer, Context{})
	root.End()
	if rc.IsZero() || rc.TraceID() == in.TraceID() {
		t.Fatalf("root context %+v", rc)
	}
}

func TestSetup(t *testing.T) {
	log := testr.New(t)
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	stop, err := Setup(env(nil), log)
	if err != nil || Enabled() {
		t.Fatalf("off: err %v, enabled %v", err, Enabled())
	}
	stop()
	if _, err := Setup(env(map[string]string{EnvTracing: "jaeger"}), log); err == nil || Enabled() {
		t.Fatalf("bad mode: err %v, enabled %v", err, Enabled())
	}
	if _, err := Setup(env(map[string]string{EnvTracing: "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "smoke"}), log); err == nil || Enabled() {
		t.Fatalf("bad protocol: err %v, enabled %v", err, Enabled())
	}

	// On: spans reach an OTLP/HTTP collector, at the latest when stop
	// flushes them.
	var got atomic.Int32
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/traces" && len(b) > 0 {
			got.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv(EnvTracing, "otlp")
	t.Setenv("HCP_MODE", "callee")
	stop, err = Setup(os.Getenv, log)
	if err != nil || !Enabled() {
		t.Fatalf("on: err %v, enabled %v", err, Enabled())
	}
	sp, _ := StartSpan("hcp.test", trace.SpanKindInternal, Parse(valid, ""))
	if !sp.Recording() {
		t.Fatal("span not recording")
	}
	sp.End()
	stop()
	if Enabled() {
		t.Fatal("still enabled after stop")
	}
	if got.Load() == 0 {
		t.Fatal("the collector received no spans")
	}
}
