package caller

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// logTap keeps the sidecar's log lines (and passes them to t.Log), so a
// test can assert on what an operator would read.
type logTap struct {
	mu    sync.Mutex
	lines []string
}

func (l *logTap) logger(t testing.TB) logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, prefix+" "+args)
		l.mu.Unlock()
		t.Log(prefix, args)
	}, funcr.Options{})
}

// find returns the first line containing every part, "" if none.
func (l *logTap) find(parts ...string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return line
		}
	}
	return ""
}

// publishInterleaved publishes the scripts' messages round robin, so that
// their sessions are ready at the same time.
func publishInterleaved(c *callee, scripts []*script) {
	for i := range scripts[0].msgs {
		for _, s := range scripts {
			c.publish(s.msgs[i])
		}
	}
}

// streamScripts submits k tasks through r and returns their scripts of n
// events each.
func streamScripts(t *testing.T, r *running, k, n int) []*script {
	var out []*script
	for range k {
		v := r.submit(t, taskReq("lab"))
		out = append(out, newScript(t, "lab", v.MessageID, n))
	}
	return out
}

// (b *bed) allComplete waits for every script's session and checks that
// the app saw no duplicate or problem and that the queue ends empty.
func (b *bed) allComplete(t *testing.T, scripts []*script, n int) {
	t.Helper()
	for _, s := range scripts {
		eventually(t, 60*time.Second, "session "+s.sessionID, func() error { return b.complete(s.sessionID, n) })
	}
	if snap := b.app.Snapshot(); snap.Duplicates != 0 || snap.Problems != 0 {
		t.Errorf("the app saw %d duplicates and %d problems", snap.Duplicates, snap.Problems)
	}
	eventually(t, 10*time.Second, "every delivery acked", func() error {
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("%d messages still in the event queue", d)
		}
		return nil
	})
}

// TestAppStreamDelivery: with AppStream, every message of several
// sessions running at once reaches the app over one stream, once and in
// order per session, with no request; the sessions' deliveries share the
// stream (the app sees them interleaved); every delivery is acked.
func TestAppStreamDelivery(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.AppStream = true; o.Config.Prefetch = 100 })
	const sessions, n = 4, 100
	scripts := streamScripts(t, r, sessions, n)
	publishInterleaved(b.callee("lab"), scripts)
	b.allComplete(t, scripts, n)

	snap := b.app.Snapshot()
	if snap.Streams != 1 || snap.Requests != 0 {
		t.Errorf("%d streams and %d requests; want everything on one stream", snap.Streams, snap.Requests)
	}
	if want := sessions * (n + 2); snap.Total != want || snap.StreamDeliveries != want {
		t.Errorf("%d messages in %d stream deliveries; want %d in as many", snap.Total, snap.StreamDeliveries, want)
	}
	var all []samplecaller.Received
	sessionOf := map[string]string{}
	for id, l := range snap.Sessions {
		for _, m := range l.Messages {
			sessionOf[m.MessageID] = id
			all = append(all, m)
		}
	}
	slices.SortFunc(all, func(a, b samplecaller.Received) int { return a.At.Compare(b.At) })
	switches := 0
	for i := 1; i < len(all); i++ {
		if sessionOf[all[i].MessageID] != sessionOf[all[i-1].MessageID] {
			switches++
		}
	}
	if switches < 10*sessions {
		t.Errorf("the app saw the sessions switch %d times; want them interleaved on the stream", switches)
	}
	t.Logf("%d messages on one stream, sessions switching %d times", snap.Total, switches)
}

// TestAppStreamOffer: without AppStream the sidecar POSTs until the app
// offers the stream (HeaderStream on an answer), then delivers over it;
// when the app withdraws (its stream endpoint answers 404) the sidecar
// goes back to requests, the delivery the stream took with it included,
// and ignores the app's offers for batchRefusalHold. Every message
// reaches the app once and in order throughout.
func TestAppStreamOffer(t *testing.T) {
	b := newBed(t, "lab")
	var tap logTap
	r := b.start(func(o *Options) { o.Config.Prefetch = 50; o.Log = tap.logger(t) })
	const n = 120
	s := streamScripts(t, r, 1, n)[0]
	c := b.callee("lab")
	// phase publishes s.msgs[from:to] (event k is msgs[k]), waits for
	// sequence upTo and returns what the app counted meanwhile.
	phase := func(what string, from, to int, upTo int64) (msgs int, d samplecaller.Snapshot) {
		t.Helper()
		before := b.app.Snapshot()
		for _, m := range s.msgs[from:to] {
			c.publish(m)
		}
		eventually(t, 30*time.Second, what, func() error {
			if l, _ := b.app.Session(s.sessionID); l.LastSequence < upTo {
				return fmt.Errorf("the app has sequence %d, want %d", l.LastSequence, upTo)
			}
			return nil
		})
		after := b.app.Snapshot()
		return after.Total - before.Total, samplecaller.Snapshot{Requests: after.Requests - before.Requests,
			Streams: after.Streams - before.Streams, StreamDeliveries: after.StreamDeliveries - before.StreamDeliveries}
	}

	if msgs, d := phase("the events before any offer", 0, 21, 20); d.Requests != msgs || d.Streams != 0 {
		t.Errorf("without an offer: %d messages, %d requests, %d streams; want one request each", msgs, d.Requests, d.Streams)
	}
	b.app.OfferStream()
	if msgs, d := phase("the events after the offer", 21, 61, 60); d.Requests != 1 || d.Streams != 1 || d.StreamDeliveries != msgs-1 {
		t.Errorf("after the offer: %d messages, %d requests, %d streams, %d stream deliveries; want the first by request (its answer offers), the rest on one stream",
			msgs, d.Requests, d.Streams, d.StreamDeliveries)
	}
	// The app withdraws: the open stream ends at its next delivery,
	// unprocessed, and the endpoint answers 404.
	b.app.WithdrawStream()
	if msgs, d := phase("the events after the withdrawal", 61, 91, 90); d.Requests != msgs || d.StreamDeliveries != 0 {
		t.Errorf("after the withdrawal: %d messages, %d requests, %d stream deliveries; want one request each", msgs, d.Requests, d.StreamDeliveries)
	}
	if tap.find("does not serve its stream endpoint", "404") == "" {
		t.Error("no log line says the app does not serve its stream endpoint")
	}
	// Offered again right away: held off.
	b.app.OfferStream()
	if msgs, d := phase("the rest, offered again within the hold", 91, len(s.msgs), n); d.Requests != msgs || d.Streams != 0 {
		t.Errorf("within the hold: %d messages, %d requests, %d streams; want one request each, no stream", msgs, d.Requests, d.Streams)
	}
	b.allComplete(t, []*script{s}, n)
}

// TestAppStreamNack: a delivery the app nacks is retried (the stream stays
// open) until the app takes it; it counts as refused.
func TestAppStreamNack(t *testing.T) {
	b := newBed(t, "lab")
	var refused atomic.Int32
	b.app.FailWhen(func(m samplecaller.Message) bool { return m.Sequence == 10 && refused.Add(1) <= 2 })
	r := b.start(func(o *Options) { o.AppStream = true })
	const n = 40
	scripts := streamScripts(t, r, 2, n)
	publishInterleaved(b.callee("lab"), scripts)
	b.allComplete(t, scripts, n)
	snap := b.app.Snapshot()
	if snap.Failed != 2 || snap.Streams != 1 {
		t.Errorf("%d nacked, %d streams; want 2 nacks on one stream", snap.Failed, snap.Streams)
	}
	if failed := testutil.ToFloat64(b.metrics.AppDeliveries.WithLabelValues("error")); failed != 2 {
		t.Errorf("%.0f deliveries counted as failed, want the 2 nacked", failed)
	}
}

// TestAppStreamTimeout: a delivery the app does not answer within
// AppTimeout counts as refused and closes the stream; the other session's
// delivery in flight behind it fails with it, and both are delivered on a
// new stream, once and in order.
func TestAppStreamTimeout(t *testing.T) {
	b := newBed(t, "lab")
	var tap logTap
	r := b.start(func(o *Options) { o.AppStream = true; o.AppTimeout = time.Second; o.Log = tap.logger(t) })
	const n = 40
	scripts := streamScripts(t, r, 2, n)
	var hung atomic.Bool
	b.app.FailWhen(func(m samplecaller.Message) bool {
		if m.SessionID == scripts[0].sessionID && m.Sequence == 15 && hung.CompareAndSwap(false, true) {
			time.Sleep(1500 * time.Millisecond) // past AppTimeout; then refused, so not recorded
			return true
		}
		return false
	})
	publishInterleaved(b.callee("lab"), scripts)
	b.allComplete(t, scripts, n)
	if snap := b.app.Snapshot(); snap.Streams < 2 {
		t.Errorf("%d streams; want the stream reopened after the timeout", snap.Streams)
	}
	if tap.find("did not answer delivery", "within 1s") == "" || tap.find("stream to the app closed", "unanswered for 1s") == "" {
		t.Error("no log lines say that the delivery went unanswered and the stream was closed")
	}
}

// cut, answered by handApp's misbehave, closes the connection at once.
const cut = "\x00cut"

// handApp is an app whose stream endpoint is written by hand (the rest is
// the bed's recorder): each delivery's messages are recorded and acked,
// unless misbehave, given the stream's number (from 1) and the delivery's,
// returns a line to answer instead (nothing recorded), or cut (the
// connection is closed, nothing recorded). It returns the app's URL and
// how many streams were opened.
func (b *bed) handApp(t *testing.T, misbehave func(stream int, delivery int64) string) (string, *atomic.Int32) {
	var streams atomic.Int32
	mux := http.NewServeMux()
	mux.Handle("/", b.app.Handler())
	mux.HandleFunc("POST "+StreamPath, func(w http.ResponseWriter, req *http.Request) {
		k := int(streams.Add(1))
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil {
			t.Error(err)
			return
		}
		w.Header().Set("Content-Type", server.ContentTypeNDJSON)
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		sc := bufio.NewScanner(req.Body)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			var d struct {
				Delivery int64                  `json:"delivery"`
				Messages []samplecaller.Message `json:"messages"`
			}
			if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
				t.Errorf("stream %d: undecodable line %q: %v", k, sc.Bytes(), err)
				return
			}
			answer := misbehave(k, d.Delivery)
			switch answer {
			case cut:
				if conn, _, err := rc.Hijack(); err == nil {
					_ = conn.Close()
				}
				return
			case "":
				for _, m := range d.Messages {
					b.app.Record(m)
				}
				answer = fmt.Sprintf(`{"ack":%d}`, d.Delivery)
			}
			if _, err := fmt.Fprintln(w, answer); err != nil || rc.Flush() != nil {
				return
			}
		}
	})
	app := httptest.NewServer(mux)
	t.Cleanup(app.Close)
	return app.URL, &streams
}

// TestAppStreamBroken: the app closing the connection mid-stream, with
// several sessions' deliveries in flight, fails them all; they are
// retried on a new stream: nothing lost, nothing twice, order kept.
func TestAppStreamBroken(t *testing.T) {
	b := newBed(t, "lab")
	url, streams := b.handApp(t, func(k int, n int64) string {
		if k <= 2 && n == 30 {
			time.Sleep(100 * time.Millisecond) // the other sessions' next deliveries come meanwhile
			return cut
		}
		return ""
	})
	var tap logTap
	r := b.start(func(o *Options) { o.AppStream = true; o.Config.HarnessURL = url; o.Log = tap.logger(t) })
	const n = 60
	scripts := streamScripts(t, r, 3, n)
	publishInterleaved(b.callee("lab"), scripts)
	b.allComplete(t, scripts, n)
	if got := streams.Load(); got < 3 {
		t.Errorf("%d streams; want a new one after each of the 2 cuts", got)
	}
	if line := tap.find("stream to the app closed", "reading the app's answers"); line == "" {
		t.Error("no log line says the stream closed at the cut")
	}
	if tap.find("stream to the app closed", `"inFlight"=3`) == "" {
		t.Error("no cut failed the 3 sessions' deliveries in flight")
	}
}

// TestAppStreamHostileAnswers: an app that answers on its stream with
// something other than an ack or a nack of a delivery in flight has the
// stream closed with a log line naming the problem; nothing is lost or
// delivered twice. Each stream answers its third delivery with one bad
// line (recording nothing), until the bad lines are used up.
func TestAppStreamHostileAnswers(t *testing.T) {
	bad := []struct{ line, want string }{
		{`<html>oops</html>`, "malformed line"},
		{`{"ack":"3"}`, "malformed line"},
		{`{"ack":3,"nack":3}`, "malformed line"},
		{`{}`, "malformed line"},
		{`{"ack":99}`, "answered delivery 99 on its stream; deliveries 1 to 3 were sent"},
		{`{"ack":0}`, "answered delivery 0 on its stream"},
		{`{"nack":1,"error":"late"}`, "refused delivery 1 on its stream, which was answered already"},
		{strings.Repeat("x", maxAckLine+1), "longer than"},
	}
	b := newBed(t, "lab")
	url, streams := b.handApp(t, func(k int, n int64) string {
		if k <= len(bad) && n == 3 {
			return bad[k-1].line
		}
		return ""
	})
	var tap logTap
	r := b.start(func(o *Options) { o.AppStream = true; o.Config.HarnessURL = url; o.Log = tap.logger(t) })
	const n = 60
	s := streamScripts(t, r, 1, n)
	publishInterleaved(b.callee("lab"), s)
	b.allComplete(t, s, n)
	if got := int(streams.Load()); got <= len(bad) {
		t.Errorf("%d streams; want one per bad line and a good one", got)
	}
	for _, c := range bad {
		if tap.find("stream to the app closed", c.want) == "" {
			t.Errorf("no log line says the stream closed because %q (after %.40q)", c.want, c.line)
		}
	}
}

// TestAppendDelivery: a stream line is one line, whatever whitespace the
// callee put in a payload, and decodes to the messages.
func TestAppendDelivery(t *testing.T) {
	ms := []AppMessage{
		{SessionID: "s1", MessageID: "m1", Type: "event", Sequence: 7, Data: []byte("{\n  \"a\": 1\r\n}"), Payload: []byte("{\"sequence\":7,\n\"data\":{}}")},
		{SessionID: "s1", MessageID: "m2", Type: "event", Sequence: 8, Payload: []byte(`{"note":"line\nbreak"}`)},
	}
	line := appendDelivery(nil, 42, "s1", ms)
	if i := strings.IndexAny(string(line), "\r\n"); i != len(line)-1 {
		t.Fatalf("a newline at %d of %d: %q", i, len(line), line)
	}
	var d struct {
		Delivery  int64                  `json:"delivery"`
		SessionID string                 `json:"session_id"`
		Messages  []samplecaller.Message `json:"messages"`
	}
	if err := json.Unmarshal(line, &d); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	if d.Delivery != 42 || d.SessionID != "s1" || len(d.Messages) != 2 || d.Messages[1].Sequence != 8 || string(d.Messages[1].Payload) != `{"note":"line\nbreak"}` {
		t.Errorf("decoded %+v", d)
	}
}

// TestStreamAnswers: how ack and nack lines complete the deliveries in
// flight: an ack covers every delivery up to its number, a nack refuses
// its own and acks those before it, an ack of deliveries answered already
// changes nothing, and a nack of one answered already breaks the stream.
func TestStreamAnswers(t *testing.T) {
	st := &appStream{sent: 5}
	for n := int64(1); n <= 5; n++ {
		st.waiting = append(st.waiting, &streamWaiter{n: n, done: make(chan error, 1)})
	}
	ws := slices.Clone(st.waiting)
	outcome := func(n int) string {
		select {
		case err := <-ws[n-1].done:
			switch {
			case err == nil:
				return "ack"
			case isRefusal(err):
				return "refused"
			}
			return "error"
		default:
			return "waiting"
		}
	}
	n := func(v int64) *int64 { return &v }
	steps := []struct {
		a       streamAnswer
		wantErr bool
		want    map[int]string // outcomes that must be set by this step
	}{
		{streamAnswer{Ack: n(2)}, false, map[int]string{1: "ack", 2: "ack", 3: "waiting"}},
		{streamAnswer{Nack: n(4), Error: "no"}, false, map[int]string{3: "ack", 4: "refused", 5: "waiting"}},
		{streamAnswer{Ack: n(3)}, false, map[int]string{5: "waiting"}},
		{streamAnswer{Nack: n(4)}, true, nil},
		{streamAnswer{Ack: n(6)}, true, nil},
		{streamAnswer{Ack: n(5)}, false, map[int]string{5: "ack"}},
	}
	for i, s := range steps {
		if err := st.answer(s.a); (err != nil) != s.wantErr {
			t.Fatalf("step %d: error %v, want an error: %v", i, err, s.wantErr)
		}
		for k, want := range s.want {
			if got := outcome(k); got != want {
				t.Errorf("step %d: delivery %d %s, want %s", i, k, got, want)
			}
		}
	}
	if len(st.waiting) != 0 {
		t.Errorf("%d deliveries still waiting", len(st.waiting))
	}
}

// BenchmarkDeliverStream is BenchmarkDeliverEvent's untraced event over
// the stream: deliver writes a line and waits for its ack from a local app
// that acks each at once.
func BenchmarkDeliverStream(b *testing.B) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		sc := bufio.NewScanner(r.Body)
		var out []byte
		for sc.Scan() {
			var d struct {
				Delivery int64 `json:"delivery"`
			}
			_ = json.Unmarshal(sc.Bytes(), &d)
			out = append(strconv.AppendInt(append(out[:0], `{"ack":`...), d.Delivery, 10), "}\n"...)
			if _, err := w.Write(out); err != nil || rc.Flush() != nil {
				return
			}
		}
	}))
	defer app.Close()
	s := &Sidecar{cfg: &config.Config{HarnessURL: app.URL}, o: Options{AppTimeout: 5 * time.Second, AppStream: true, DrainTimeout: time.Second},
		http: app.Client(), m: metrics.New(prometheus.NewRegistry()), clk: clock.RealClock{}, log: logr.Discard(), runCtx: context.Background()}
	defer s.endStream()
	ev := &session.EventPayload{EventType: session.EventProgress, Sequence: 41, Data: json.RawMessage(`{"stage":"heating","percent":40}`)}
	env, err := envelope.New(envelope.TypeEvent, "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10", ev)
	if err != nil {
		b.Fatal(err)
	}
	it := &item{d: amqp.Delivery{Headers: amqp.Table{envelope.HeaderConfirmedThrough: int64(40)}}, env: env, event: ev}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.deliver(s.appMessage(it, "lab", "550e8400-e29b-41d4-a716-446655440000")); err != nil {
			b.Fatal(err)
		}
	}
}
