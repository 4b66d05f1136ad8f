package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hcp-io/hcp-operator/internal/samplecallee"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/callee"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/tracing"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// seen is one HTTP request a sidecar made to the harness or the app: its
// trace headers and, for the app, the trace fields of its body.
type seen struct {
	path, traceparent, tracestate string
	session                       string
	bodyParents                   []string
	types                         []string
}

// recordTrace wraps h, recording the trace context of every POST.
type recordTrace struct {
	h    http.Handler
	mu   sync.Mutex
	reqs []seen
}

func (r *recordTrace) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method == http.MethodPost {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		s := seen{path: req.URL.Path, traceparent: req.Header.Get("traceparent"), tracestate: req.Header.Get("tracestate")}
		var one struct {
			SessionID   string            `json:"session_id"`
			Type        string            `json:"type"`
			Traceparent string            `json:"traceparent"`
			Messages    []json.RawMessage `json:"messages"`
		}
		_ = json.Unmarshal(body, &one)
		s.session = one.SessionID
		if strings.HasSuffix(s.path, "/events") {
			s.bodyParents, s.types = []string{one.Traceparent}, []string{one.Type}
		}
		for _, m := range one.Messages {
			var x struct{ Type, Traceparent string }
			_ = json.Unmarshal(m, &x)
			s.bodyParents, s.types = append(s.bodyParents, x.Traceparent), append(s.types, x.Type)
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, s)
		r.mu.Unlock()
	}
	r.h.ServeHTTP(w, req)
}

func (r *recordTrace) of(session, path string) []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []seen
	for _, s := range r.reqs {
		if s.session == session && strings.HasSuffix(s.path, path) {
			out = append(out, s)
		}
	}
	return out
}

func traceID(traceparent string) string {
	if len(traceparent) != 55 {
		return ""
	}
	return traceparent[3:35]
}

func spanID(traceparent string) string {
	if len(traceparent) != 55 {
		return ""
	}
	return traceparent[36:52]
}

// TestRelayTraceContext submits tasks with a W3C traceparent through the
// caller sidecar and follows the trace to the callee harness and back to
// the app: with tracing off the app's context passes through unchanged;
// with it on every sidecar span is in the app's trace, each the child of
// the one before (app → hcp.task_submit → hcp.gate → hcp.session →
// hcp.deliver), and the harness and the app get the context of the span
// that called them. A malformed traceparent is ignored: the task runs.
func TestRelayTraceContext(t *testing.T) {
	for _, batch := range []int{0, 16} {
		t.Run(fmt.Sprintf("appMaxBatch=%d", batch), func(t *testing.T) { testRelayTraceContext(t, batch) })
	}
}

func testRelayTraceContext(t *testing.T, appMaxBatch int) {
	app := samplecaller.NewRecorder()
	appRec := &recordTrace{h: app.Handler()}
	var harnessRec *recordTrace
	b := newBed(t, bedOptions{
		Harness: func(url string, log logr.Logger) http.Handler {
			harnessRec = &recordTrace{h: samplecallee.New(url, log).Handler()}
			return harnessRec
		},
		App:         appRec,
		AppMaxBatch: appMaxBatch,
	})
	ctx := t.Context()

	// The harness POSTs to the callee sidecar: record the session id of its
	// task hand-overs from the body (session_id), as for the app.
	submit := func(traceparent, tracestate string) caller.TaskView {
		t.Helper()
		js, _ := json.Marshal(caller.SubmitRequest{
			CalleeID: calleeID, Capability: "analyze", Intent: "traced",
			Inputs: json.RawMessage(`{"steps":3,"step_ms":10}`), Constraints: task.Constraints{DataClassification: task.T1},
		})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.CallerAPI+"/hcp/v1/tasks", bytes.NewReader(js))
		req.Header.Set("Content-Type", "application/json")
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
		}
		if tracestate != "" {
			req.Header.Set("tracestate", tracestate)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var v caller.TaskView
		_ = json.NewDecoder(resp.Body).Decode(&v)
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST /hcp/v1/tasks with traceparent %q: HTTP %d %+v", traceparent, resp.StatusCode, v)
		}
		return v
	}
	finished := func(sid string) {
		t.Helper()
		testbed.Eventually(t, 60*time.Second, "session "+sid+" complete at the app", func(context.Context) error {
			s, ok := app.Session(sid)
			if !ok || s.Terminal == "" || s.FinalState == "" {
				return fmt.Errorf("not finished yet")
			}
			return nil
		})
	}
	// Every message the app got for a session: at least task_accepted,
	// the events and task_completed.
	appGot := func(sid string) []seen {
		t.Helper()
		got := append(appRec.of(sid, "/events"), appRec.of(sid, "/events/batch")...)
		if len(got) < 3 {
			t.Fatalf("the app got %d requests for session %s", len(got), sid)
		}
		return got
	}

	t.Run("off: passed through", func(t *testing.T) {
		tracing.Use(nil)
		const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		v := submit(tp, "vendor=opaque")
		finished(v.SessionID)
		hand := harnessRec.of(v.SessionID, "/hcp/v1/tasks")
		if len(hand) != 1 || hand[0].traceparent != tp || hand[0].tracestate != "vendor=opaque" {
			t.Fatalf("the harness's task hand-over carried %+v, want traceparent %s", hand, tp)
		}
		for _, s := range appGot(v.SessionID) {
			if s.traceparent != tp || s.tracestate != "vendor=opaque" || len(s.bodyParents) == 0 {
				t.Fatalf("the app got %s with traceparent %q tracestate %q, want %s", s.types, s.traceparent, s.tracestate, tp)
			}
			for _, p := range s.bodyParents {
				if p != tp {
					t.Fatalf("the app got %s with body traceparents %v, want %s", s.types, s.bodyParents, tp)
				}
			}
		}
		hs, err := b.hcpSession(ctx, v.SessionID)
		if err != nil || hs.Annotations[callee.AnnotationTraceparent] != tp {
			t.Fatalf("HCPSession annotations %v (%v), want the traceparent", hs.Annotations, err)
		}
	})

	t.Run("malformed: ignored", func(t *testing.T) {
		tracing.Use(nil)
		v := submit("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1", "")
		finished(v.SessionID)
		if hand := harnessRec.of(v.SessionID, "/hcp/v1/tasks"); len(hand) != 1 || hand[0].traceparent != "" {
			t.Fatalf("the harness got %+v, want no traceparent", hand)
		}
		for _, s := range appGot(v.SessionID) {
			if s.traceparent != "" || strings.Join(s.bodyParents, "") != "" {
				t.Fatalf("the app got traceparent %q (body %v), want none", s.traceparent, s.bodyParents)
			}
		}
	})

	t.Run("on: one trace, parented", func(t *testing.T) {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		tracing.Use(tp)
		defer tracing.Use(nil)
		const appTrace, appSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
		v := submit("00-"+appTrace+"-"+appSpan+"-01", "")
		finished(v.SessionID)
		// The session span ends with the session, after its last publish;
		// the deliveries end after the app's answers.
		byName := map[string][]tracetest.SpanStub{}
		testbed.Eventually(t, 10*time.Second, "the sidecars' spans", func(context.Context) error {
			clear(byName)
			for _, s := range exp.GetSpans() {
				if s.SpanContext.TraceID().String() == appTrace {
					byName[s.Name] = append(byName[s.Name], s)
				}
			}
			if len(byName["hcp.session"]) == 0 || len(byName["hcp.deliver task_completed"]) == 0 || len(byName["hcp.deliver event"])+len(byName["hcp.deliver batch"]) == 0 {
				return fmt.Errorf("spans so far: %d", len(exp.GetSpans()))
			}
			return nil
		})
		one := func(name string) tracetest.SpanStub {
			t.Helper()
			if len(byName[name]) != 1 {
				t.Fatalf("%d %q spans in the trace; all: %v", len(byName[name]), name, keys(byName))
			}
			return byName[name][0]
		}
		submitSp, gate, sess := one("hcp.task_submit"), one("hcp.gate"), one("hcp.session")
		if submitSp.Parent.SpanID().String() != appSpan || !submitSp.Parent.IsRemote() {
			t.Errorf("hcp.task_submit's parent %s, want the app's span %s", submitSp.Parent.SpanID(), appSpan)
		}
		if gate.Parent.SpanID() != submitSp.SpanContext.SpanID() {
			t.Errorf("hcp.gate's parent %s, want hcp.task_submit %s", gate.Parent.SpanID(), submitSp.SpanContext.SpanID())
		}
		if sess.Parent.SpanID() != gate.SpanContext.SpanID() {
			t.Errorf("hcp.session's parent %s, want hcp.gate %s", sess.Parent.SpanID(), gate.SpanContext.SpanID())
		}
		attrs := map[string]string{}
		for _, a := range sess.Attributes {
			attrs[string(a.Key)] = a.Value.String()
		}
		if attrs["hcp.state"] != "COMPLETED" || attrs["hcp.session_id"] != v.SessionID {
			t.Errorf("hcp.session attributes %v", attrs)
		}

		// The harness got the session span's context.
		hand := harnessRec.of(v.SessionID, "/hcp/v1/tasks")
		if len(hand) != 1 || traceID(hand[0].traceparent) != appTrace || spanID(hand[0].traceparent) != sess.SpanContext.SpanID().String() {
			t.Fatalf("the harness's task hand-over carried %+v, want the hcp.session span %s of trace %s", hand, sess.SpanContext.SpanID(), appTrace)
		}
		// Every message reached the app in the app's trace: the body
		// names the session span (what the callee published with), the
		// header the caller sidecar's delivery span, a child of it.
		deliveries := map[string]tracetest.SpanStub{}
		for name, ss := range byName {
			if strings.HasPrefix(name, "hcp.deliver ") {
				for _, s := range ss {
					deliveries[s.SpanContext.SpanID().String()] = s
				}
			}
		}
		got := appGot(v.SessionID)
		for _, s := range got {
			if traceID(s.traceparent) != appTrace {
				t.Fatalf("the app got %s with traceparent %q, want trace %s", s.types, s.traceparent, appTrace)
			}
			for _, p := range s.bodyParents {
				if traceID(p) != appTrace || spanID(p) != sess.SpanContext.SpanID().String() {
					t.Fatalf("the app got %s with body traceparents %v, want hcp.session %s of trace %s", s.types, s.bodyParents, sess.SpanContext.SpanID(), appTrace)
				}
			}
			d, ok := deliveries[spanID(s.traceparent)]
			if !ok || d.Parent.SpanID() != sess.SpanContext.SpanID() {
				t.Fatalf("the app's %s traceparent %q is not a delivery span under hcp.session", s.types, s.traceparent)
			}
		}
		if len(deliveries) < len(got) {
			t.Errorf("%d delivery spans for %d requests", len(deliveries), len(got))
		}
		// Adoption continues the trace from the HCPSession.
		hs, err := b.hcpSession(ctx, v.SessionID)
		if err != nil || hs.Annotations[callee.AnnotationTraceparent] != "00-"+appTrace+"-"+gate.SpanContext.SpanID().String()+"-01" {
			t.Fatalf("HCPSession annotations %v (%v), want the hcp.gate span's context", hs.Annotations, err)
		}
		if appMaxBatch > 1 && len(byName["hcp.deliver batch"]) == 0 {
			t.Errorf("no batch delivery span with appMaxBatch %d: %v", appMaxBatch, keys(byName))
		}
		t.Logf("trace %s: %d spans (%v); the app got %d requests, the harness 1, all in it", appTrace, len(exp.GetSpans()), keys(byName), len(got))
	})
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
