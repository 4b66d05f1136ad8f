package caller

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestSubmitThenStream: a task submitted through the local API reaches the
// callee's command queue as a proper task_submit, and the session's stream
// reaches the app whole, in order, with the sidecar's views following.
func TestSubmitThenStream(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	v := r.submit(t, taskReq("lab"))
	if v.Status != TaskPending || v.Warning != "" || v.SessionID != topology.SessionID("lab", "alpha", v.MessageID) {
		t.Fatalf("POST /hcp/v1/tasks = %+v", v)
	}

	// The command as the callee sees it.
	ch, err := b.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var d amqp.Delivery
	eventually(t, 10*time.Second, "the task_submit in the command queue", func() error {
		var ok bool
		d, ok, err = ch.Get(topology.CommandQueue("lab"), true)
		if err != nil || !ok {
			return fmt.Errorf("empty (%v)", err)
		}
		return nil
	})
	env, err := envelope.FromDelivery(d, 0)
	if err != nil {
		t.Fatal(err)
	}
	var p task.TaskSubmit
	if err := json.Unmarshal(env.Payload, &p); err != nil {
		t.Fatal(err)
	}
	if d.UserId != b.caller.name || d.DeliveryMode != amqp.Persistent || env.MessageID != v.MessageID ||
		env.Type != envelope.TypeTaskSubmit || p.CallerID != b.callerID || p.CalleeID != "lab" || p.Capability != "analyze" {
		t.Fatalf("task_submit: user_id %q mode %d envelope %+v payload %+v", d.UserId, d.DeliveryMode, env, p)
	}

	// The session.
	const n = 20
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	for _, m := range s.msgs {
		c.publish(m)
	}
	eventually(t, 20*time.Second, "the whole stream at the app", func() error { return b.complete(s.sessionID, n) })
	log, _ := b.app.Session(s.sessionID)
	if log.Messages[0].Type != "task_accepted" || log.Messages[len(log.Messages)-2].Type != "task_completed" ||
		log.Messages[len(log.Messages)-1].EventType != "session_closed" {
		t.Errorf("app saw %+v", log.Messages)
	}

	var tv TaskView
	if st := r.call(t, http.MethodGet, "/hcp/v1/tasks/"+v.MessageID, nil, &tv); st != 200 || tv.Status != TaskAccepted || !tv.DeliveredToApp || tv.SessionID != s.sessionID {
		t.Errorf("GET task: %d %+v", st, tv)
	}
	var sv SessionView
	eventually(t, 5*time.Second, "the session view", func() error {
		if st := r.call(t, http.MethodGet, "/hcp/v1/sessions/"+s.sessionID, nil, &sv); st != 200 {
			return fmt.Errorf("HTTP %d", st)
		}
		if sv.State != "COMPLETED" || sv.LastSequence != n || !sv.Finished || sv.CalleeID != "lab" || sv.TokenExpiresAt == nil || sv.Terminal != "task_completed" {
			return fmt.Errorf("%+v", sv)
		}
		return nil
	})
	eventually(t, 10*time.Second, "an empty event queue", func() error {
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("%d messages left", d)
		}
		return nil
	})
}

// TestConcurrentSessionsDuplicatesAndReordering: several sessions
// interleaved in one queue, each with redelivered duplicates (same and new
// message ids) and pairs published out of order: every session reaches the
// app exactly once and in order.
func TestConcurrentSessionsDuplicatesAndReordering(t *testing.T) {
	b := newBed(t, "lab", "mill")
	r := b.start()
	const sessions, n = 6, 40
	var scripts []*script
	for i := range sessions {
		callee := []string{"lab", "mill"}[i%2]
		v := r.submit(t, taskReq(callee))
		scripts = append(scripts, newScript(t, callee, v.MessageID, n))
	}
	var wg sync.WaitGroup
	dups := 0
	var dupMu sync.Mutex
	for i, s := range scripts {
		c := b.callee([]string{"lab", "mill"}[i%2])
		wg.Go(func() {
			msgs := s.msgs
			for j := 0; j < len(msgs); j++ {
				m := msgs[j]
				// Swap every fifth pair of events (out-of-order arrival).
				if j%5 == 2 && j+1 < len(msgs) && msgs[j+1].Type == envelope.TypeEvent && m.Type == envelope.TypeEvent {
					c.publish(msgs[j+1])
					c.publish(m)
					j++
					continue
				}
				c.publish(m)
				// A redelivered duplicate: the same message again, or the
				// same sequence under a new message id (a callee republish).
				if j%7 == 3 {
					c.publish(m)
					dup := *m
					dup.MessageID = envelope.NewMessageID()
					c.publish(&dup)
					dupMu.Lock()
					dups += 2
					dupMu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, s := range scripts {
		eventually(t, 30*time.Second, "session "+s.sessionID, func() error { return b.complete(s.sessionID, n) })
	}
	snap := b.app.Snapshot()
	if snap.Duplicates != 0 || snap.Deduplicated != 0 || snap.Problems != 0 {
		t.Errorf("app saw %d duplicates (+%d flagged redelivered), %d problems", snap.Duplicates, snap.Deduplicated, snap.Problems)
	}
	skipped := testutil.ToFloat64(b.metrics.Duplicates.WithLabelValues("sequence")) + testutil.ToFloat64(b.metrics.Duplicates.WithLabelValues("message"))
	t.Logf("sessions %d × %d events; duplicates published %d, skipped by the sidecar %.0f; app received %d messages, 0 duplicates",
		sessions, n, dups, skipped, snap.Total)
	if int(skipped) != dups {
		t.Errorf("sidecar skipped %.0f duplicates, %d were published", skipped, dups)
	}
}

// TestAppFailuresAreRetried: the app answers 500 to every third message the
// first time it sees it; those are nacked, redelivered and delivered again,
// nothing is lost or reordered.
func TestAppFailuresAreRetried(t *testing.T) {
	b := newBed(t, "lab")
	var mu sync.Mutex
	failed := map[string]bool{}
	count := 0
	b.app.FailWhen(func(m samplecaller.Message) bool {
		mu.Lock()
		defer mu.Unlock()
		count++
		if count%3 == 0 && !failed[m.MessageID] {
			failed[m.MessageID] = true
			return true
		}
		return false
	})
	r := b.start()
	const sessions, n = 3, 30
	var wg sync.WaitGroup
	var scripts []*script
	for range sessions {
		v := r.submit(t, taskReq("lab"))
		scripts = append(scripts, newScript(t, "lab", v.MessageID, n))
	}
	for _, s := range scripts {
		c := b.callee("lab")
		wg.Go(func() {
			for _, m := range s.msgs {
				c.publish(m)
			}
		})
	}
	wg.Wait()
	for _, s := range scripts {
		eventually(t, 60*time.Second, "session "+s.sessionID, func() error { return b.complete(s.sessionID, n) })
	}
	snap := b.app.Snapshot()
	errs := testutil.ToFloat64(b.metrics.AppDeliveries.WithLabelValues("error"))
	t.Logf("app failed %d deliveries on purpose (sidecar counted %.0f); received %d messages, %d duplicates", snap.Failed, errs, snap.Total, snap.Duplicates)
	if snap.Failed == 0 || float64(snap.Failed) != errs || snap.Duplicates != 0 || snap.Deduplicated != 0 {
		t.Errorf("failed %d, counted %.0f, duplicates %d", snap.Failed, errs, snap.Duplicates)
	}
}

// TestSpoofedSendersAreDropped: events for a session from a callee that is
// not the session's, from a callee user of another vhost and without a
// user_id never reach the app.
func TestSpoofedSendersAreDropped(t *testing.T) {
	b := newBed(t, "lab", "evil")
	// A user whose name says "callee of another vhost", allowed to write
	// to this vhost's hcp.events.
	other := user{name: topology.Username(topology.RoleCallee, "elsewhere", "lab"), password: "pw-elsewhere"}
	b.mgmt(http.MethodPut, "/api/users/"+urlEsc(other.name), map[string]string{"password": other.password, "tags": ""})
	t.Cleanup(func() { b.mgmtNoFail(http.MethodDelete, "/api/users/"+urlEsc(other.name), nil) })
	p := topology.CalleePermissions("lab")
	b.mgmt(http.MethodPut, "/api/permissions/"+urlEsc(b.vhost)+"/"+urlEsc(other.name), map[string]string{"configure": p.Configure, "write": p.Write, "read": p.Read})
	b.callees["other"] = other

	r := b.start()
	v := r.submit(t, taskReq("lab"))
	const n = 6
	s := newScript(t, "lab", v.MessageID, n)
	legit, evil, foreign := b.callee("lab"), b.callee("evil"), b.callee("other")

	forged := func(seq int64) *envelope.Envelope {
		env, err := envelope.New(envelope.TypeEvent, s.sessionID, mustEvent(t, seq, &session.LogData{Level: session.LogInfo, Message: "forged"}))
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	// Before anything legit: a forged accepted and first event.
	forgedAccepted := *s.msgs[0]
	forgedAccepted.MessageID = envelope.NewMessageID()
	evil.publish(&forgedAccepted)
	evil.publish(forged(1))
	foreign.publish(forged(1))
	// No user_id at all (the admin connection may omit it).
	pub, _ := envelope.EncodePublishing(forged(1), "")
	ach, err := b.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ach.Close()
	if err := ach.Publish(topology.EventsExchange, topology.EventRoutingKey(b.callerID, s.sessionID, envelope.TypeEvent), true, false, pub); err != nil {
		t.Fatal(err)
	}
	for i, m := range s.msgs {
		legit.publish(m)
		if i == 3 {
			evil.publish(forged(int64(i + 5)))
		}
	}
	eventually(t, 20*time.Second, "the legit stream", func() error { return b.complete(s.sessionID, n) })
	spoofed := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonSpoofedSender))
	unauth := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonUnauthSender))
	eventually(t, 10*time.Second, "the counters", func() error {
		spoofed = testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonSpoofedSender))
		unauth = testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonUnauthSender))
		if spoofed != 3 || unauth != 2 {
			return fmt.Errorf("spoofed %.0f (want 3), unauthenticated %.0f (want 2)", spoofed, unauth)
		}
		return nil
	})
	log, _ := b.app.Session(s.sessionID)
	for _, m := range log.Messages {
		if m.EventType == "log" {
			t.Errorf("a forged event reached the app: %+v", m)
		}
	}
	t.Logf("dropped %.0f events from the wrong callee and %.0f from unauthenticated senders; the app got the %d legit events", spoofed, unauth, n)
}

func urlEsc(s string) string { return url.PathEscape(s) }

// TestMalformedDeliveries: every kind of broken message is acked (the
// queue drains), counted, logged, and never stops the sidecar.
func TestMalformedDeliveries(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	v := r.submit(t, taskReq("lab"))
	const n = 5
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	sid := s.sessionID
	rk := topology.EventRoutingKey(b.callerID, sid, envelope.TypeEvent)
	good, _ := envelope.EncodePublishing(s.msgs[1], c.u.name) // session_created, seq 1
	valid := string(good.Body)
	mutate := func(f func(*amqp.Publishing)) amqp.Publishing {
		p := good
		p.Body = append([]byte(nil), good.Body...)
		f(&p)
		return p
	}
	body := func(js string) func(*amqp.Publishing) {
		return func(p *amqp.Publishing) { p.Body = []byte(js); p.MessageId = ""; p.Type = ""; p.CorrelationId = "" }
	}
	env := func(typ, sess, payload string) string {
		return fmt.Sprintf(`{"hcp_version":"1.0","message_id":%q,"timestamp":"2025-01-15T08:30:00.000Z","session_id":%s,"type":%q,"payload":%s}`,
			envelope.NewMessageID(), sess, typ, payload)
	}
	q := func(s string) string { return `"` + s + `"` }
	cases := []struct {
		name string
		rk   string
		pub  amqp.Publishing
	}{
		{"not JSON", rk, mutate(body("not json at all"))},
		{"empty body", rk, mutate(body(""))},
		{"JSON array", rk, mutate(body(`[1,2,3]`))},
		{"invalid UTF-8", rk, mutate(body("{\"hcp_version\":\"1.0\xff\"}"))},
		{"wrong content type", rk, mutate(func(p *amqp.Publishing) { p.ContentType = "text/plain" })},
		{"no content type", rk, mutate(func(p *amqp.Publishing) { p.ContentType = "" })},
		{"wrong content encoding", rk, mutate(func(p *amqp.Publishing) { p.ContentEncoding = "gzip" })},
		{"unknown envelope field", rk, mutate(body(strings.Replace(valid, `"hcp_version"`, `"extra":1,"hcp_version"`, 1)))},
		{"duplicate key", rk, mutate(body(strings.Replace(valid, `"hcp_version":"1.0"`, `"hcp_version":"1.0","hcp_version":"1.0"`, 1)))},
		{"unsupported version", rk, mutate(body(strings.Replace(valid, `"hcp_version":"1.0"`, `"hcp_version":"2.0"`, 1)))},
		{"bad message id", rk, mutate(body(strings.Replace(valid, good.MessageId, "not-a-uuid", 1)))},
		{"bad timestamp", rk, mutate(body(strings.Replace(valid, `"timestamp":"`, `"timestamp":"yesterday`, 1)))},
		{"null session on an event", rk, mutate(body(env("event", "null", `{"event_type":"progress","sequence":2,"data":{"stage":"x"}}`)))},
		{"unknown type", rk, mutate(body(env("gossip", q(sid), `{}`)))},
		{"command on the event channel", rk, mutate(body(env("abort", q(sid), `{"session_token":"`+testToken+`"}`)))},
		{"payload not an object", rk, mutate(body(env("event", q(sid), `[]`)))},
		{"sequence zero", rk, mutate(body(env("event", q(sid), `{"event_type":"progress","sequence":0,"data":{"stage":"x"}}`)))},
		{"unknown event type", rk, mutate(body(env("event", q(sid), `{"event_type":"telepathy","sequence":2,"data":{}}`)))},
		{"invalid event data", rk, mutate(body(env("event", q(sid), `{"event_type":"progress","sequence":2,"data":{"stage":"","percent":400}}`)))},
		{"event data of the wrong JSON type", rk, mutate(body(env("event", q(sid), `{"event_type":"progress","sequence":"two","data":{"stage":"x"}}`)))},
		{"accepted with a bad token", topology.EventRoutingKey(b.callerID, sid, envelope.TypeTaskAccepted),
			mutate(body(env("task_accepted", q(sid), `{"task_message_id":"`+v.MessageID+`","session_id":"`+sid+`","session_token":"nope","risk_level":"R1","expires_at":"2030-01-01T00:00:00.000Z"}`)))},
		{"accepted for another session", topology.EventRoutingKey(b.callerID, sid, envelope.TypeTaskAccepted),
			mutate(body(env("task_accepted", q(sid), `{"task_message_id":"`+v.MessageID+`","session_id":"`+envelope.NewMessageID()+`","session_token":"`+testToken+`","risk_level":"R1","expires_at":"2030-01-01T00:00:00.000Z"}`)))},
		{"rejected with an unknown reason", topology.EventRoutingKey(b.callerID, sid, envelope.TypeTaskRejected),
			mutate(body(env("task_rejected", q(sid), `{"task_message_id":"`+v.MessageID+`","reason_code":"because","message":"no"}`)))},
		{"failed without a code", topology.EventRoutingKey(b.callerID, sid, envelope.TypeTaskFailed),
			mutate(body(env("task_failed", q(sid), `{"message":"boom"}`)))},
		{"completed with a data: artifact", topology.EventRoutingKey(b.callerID, sid, envelope.TypeTaskCompleted),
			mutate(body(env("task_completed", q(sid), `{"artifacts":[{"uri":"data:text/plain;base64,aGk=","sha256":"`+strings.Repeat("a", 64)+`","size":2}],"summary":{"duration":"PT1S","event_count":1}}`)))},
		{"message_id property mismatch", rk, mutate(func(p *amqp.Publishing) { p.MessageId = envelope.NewMessageID() })},
		{"type property mismatch", rk, mutate(func(p *amqp.Publishing) { p.Type = "task_failed" })},
		{"correlation_id mismatch", rk, mutate(func(p *amqp.Publishing) { p.CorrelationId = envelope.NewMessageID() })},
		{"routing key names another type", topology.EventRoutingKey(b.callerID, sid, envelope.TypeTaskFailed), good},
		{"routing key names another session", topology.EventRoutingKey(b.callerID, envelope.NewMessageID(), envelope.TypeEvent), good},
		{"routing key not three words", b.callerID + ".x", good},
		{"too large", rk, mutate(body(`{"pad":"` + strings.Repeat("x", envelope.MaxEnvelopeBytes) + `"}`))},
		{"deeply nested", rk, mutate(body(env("event", q(sid), `{"event_type":"progress","sequence":2,"data":{"stage":"x","d":`+strings.Repeat("[", 100)+strings.Repeat("]", 100)+`}}`)))},
	}
	for _, tc := range cases {
		c.publishRaw(tc.rk, tc.pub)
	}
	// Then the real stream: it must get through.
	for _, m := range s.msgs {
		c.publish(m)
	}
	eventually(t, 20*time.Second, "the valid stream", func() error { return b.complete(sid, n) })
	eventually(t, 10*time.Second, "every malformed message counted", func() error {
		if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonMalformed)); int(got) != len(cases) {
			return fmt.Errorf("counted %.0f malformed, published %d", got, len(cases))
		}
		return nil
	})
	eventually(t, 15*time.Second, "an empty event queue", func() error {
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("%d messages left", d)
		}
		return nil
	})
	if err := r.sc.Ready(); err != nil {
		t.Errorf("sidecar not ready after the malformed messages: %v", err)
	}
	t.Logf("%d kinds of malformed message acked, counted and logged; the valid stream of %d events was delivered", len(cases), n)
}

// TestDuplicatesAfterRestart: events the app already acknowledged, arriving
// again after a restart (a callee republish), are recognised from the
// store and skipped.
func TestDuplicatesAfterRestart(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	v := r.submit(t, taskReq("lab"))
	const n = 12
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	half := 7 // accepted + events 1..6
	for _, m := range s.msgs[:half] {
		c.publish(m)
	}
	eventually(t, 10*time.Second, "the first half", func() error {
		if l, _ := b.app.Session(s.sessionID); l.LastSequence != 6 {
			return fmt.Errorf("last %d", l.LastSequence)
		}
		return nil
	})
	r.stop(t)
	// While the caller is down the callee republishes everything (new
	// message ids, same sequences), then goes on.
	for _, m := range s.msgs[:half] {
		dup := *m
		dup.MessageID = envelope.NewMessageID()
		c.publish(&dup)
	}
	for _, m := range s.msgs[half:] {
		c.publish(m)
	}
	b.start()
	eventually(t, 20*time.Second, "the whole stream", func() error { return b.complete(s.sessionID, n) })
	if got := testutil.ToFloat64(b.metrics.Duplicates.WithLabelValues("sequence")) + testutil.ToFloat64(b.metrics.Duplicates.WithLabelValues("message")); int(got) != half {
		t.Errorf("skipped %.0f duplicates after the restart, want %d", got, half)
	}
}

// TestGapIsSkippedAfterTimeout: from a sender that does not mark its
// events (envelope.HeaderConfirmedThrough), an event that never arrives
// holds the later ones for GapTimeout, then the gap is skipped with a
// warning, the app is told with the next event, and a late copy is
// dropped.
func TestGapIsSkippedAfterTimeout(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.GapTimeout = 500 * time.Millisecond })
	v := r.submit(t, taskReq("lab"))
	const n = 8
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	var missing *envelope.Envelope
	start := time.Now()
	for _, m := range s.msgs {
		if m.Type == envelope.TypeEvent && seqOf(t, m) == 4 {
			missing = m
			continue
		}
		c.publish(m)
	}
	eventually(t, 10*time.Second, "the stream minus one", func() error {
		l, _ := b.app.Session(s.sessionID)
		if l.LastSequence != n || l.Terminal != "task_completed" {
			return fmt.Errorf("last %d terminal %q", l.LastSequence, l.Terminal)
		}
		return nil
	})
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("gap skipped after %s, before the gap timeout", took)
	}
	c.publish(missing)
	eventually(t, 10*time.Second, "the late event dropped", func() error {
		if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonLateEvent)); got != 1 {
			return fmt.Errorf("late %.0f", got)
		}
		return nil
	})
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped)); got != 1 {
		t.Errorf("gap_skipped %.0f, want 1", got)
	}
	l, _ := b.app.Session(s.sessionID)
	want := []int64{1, 2, 3, 5, 6, 7, 8}
	if got := l.Sequences(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("app got sequences %v, want %v", got, want)
	}
	if want := []samplecaller.Lost{{From: 4, To: 4, Reason: LostGapTimeout}}; fmt.Sprint(l.Lost) != fmt.Sprint(want) {
		t.Errorf("app was told of lost %v, want %v", l.Lost, want)
	}
}

// TestGapFromConfirmedMarks: with events marked by the callee sidecar
// (envelope.HeaderConfirmedThrough) time alone never skips a gap, however
// short GapTimeout is: a missing event the callee had not got confirmed
// when it published the later ones is waited for and delivered in order
// when its republished copy arrives; missing events the marks show were
// queued before (and are gone: TTL, overflow) are given up at once, and
// the app is told which, with the next event.
func TestGapFromConfirmedMarks(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.GapTimeout = 50 * time.Millisecond })
	v := r.submit(t, taskReq("lab"))
	const n = 10
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	ev := map[int64]*envelope.Envelope{}
	for _, m := range s.msgs {
		if m.Type == envelope.TypeEvent {
			ev[seqOf(t, m)] = m
		}
	}
	c.publish(s.msgs[0]) // task_accepted
	c.publishMarked(ev[1], 0)
	c.publishMarked(ev[2], 1)
	// 3 and 4 were confirmed and then dropped by the broker; 5 was
	// published before their confirms came, 6 after.
	c.publishMarked(ev[5], 2)
	time.Sleep(300 * time.Millisecond) // six gap timeouts
	if l, _ := b.app.Session(s.sessionID); l.LastSequence != 2 {
		t.Fatalf("the app has up to %d; want 2: 3-4 are not known to be gone yet", l.LastSequence)
	}
	c.publishMarked(ev[6], 4)
	eventually(t, 10*time.Second, "3-4 given up", func() error {
		if l, _ := b.app.Session(s.sessionID); l.LastSequence != 6 {
			return fmt.Errorf("last %d", l.LastSequence)
		}
		return nil
	})
	// 7 lost its confirm with the connection; 8 went out before its
	// republished copy.
	c.publishMarked(ev[8], 6)
	time.Sleep(300 * time.Millisecond)
	if l, _ := b.app.Session(s.sessionID); l.LastSequence != 6 {
		t.Fatalf("the app has up to %d; want 6: 7 is on its way", l.LastSequence)
	}
	c.publishMarked(ev[7], 6)
	c.publishMarked(ev[9], 8)
	c.publish(s.msgs[len(s.msgs)-2]) // task_completed
	c.publishMarked(ev[10], 9)
	eventually(t, 10*time.Second, "the whole stream", func() error {
		if l, _ := b.app.Session(s.sessionID); l.LastSequence != n || l.Terminal != "task_completed" {
			return fmt.Errorf("last %d terminal %q", l.LastSequence, l.Terminal)
		}
		return nil
	})
	l, _ := b.app.Session(s.sessionID)
	if want := []int64{1, 2, 5, 6, 7, 8, 9, 10}; fmt.Sprint(l.Sequences()) != fmt.Sprint(want) {
		t.Errorf("app got sequences %v, want %v", l.Sequences(), want)
	}
	if want := []samplecaller.Lost{{From: 3, To: 4, Reason: LostNotInQueue}}; fmt.Sprint(l.Lost) != fmt.Sprint(want) {
		t.Errorf("app was told of lost %v, want %v", l.Lost, want)
	}
	for _, m := range l.Messages {
		if m.Lost != nil && m.Sequence != 5 {
			t.Errorf("event %d carries lost %+v; only 5 should", m.Sequence, *m.Lost)
		}
	}
	if len(l.Problems) != 0 {
		t.Errorf("app saw problems: %v", l.Problems)
	}
	if got := testutil.ToFloat64(b.metrics.Rejects.WithLabelValues(ReasonGapSkipped)); got != 2 {
		t.Errorf("gap_skipped %.0f, want 2", got)
	}
}

// TestBatchDelivery: with AppMaxBatch the events of a session that are
// ready go to the app together, in order, each once, in far fewer requests
// than events; task_completed still comes after every event before it and
// before session_closed; every delivery is acked (the queue ends empty).
func TestBatchDelivery(t *testing.T) {
	b := newBed(t, "lab")
	b.app.SetDelay(20 * time.Millisecond) // a slow app: events pile up meanwhile
	r := b.start(func(o *Options) { o.AppMaxBatch = 50; o.Config.Prefetch = 100 })
	v := r.submit(t, taskReq("lab"))
	const n = 300
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	for _, m := range s.msgs {
		c.publish(m)
	}
	eventually(t, 30*time.Second, "the whole stream", func() error { return b.complete(s.sessionID, n) })
	l, _ := b.app.Session(s.sessionID)
	if len(l.Problems) != 0 {
		t.Fatalf("app saw problems: %v", l.Problems)
	}
	var types []string
	for _, m := range l.Messages[len(l.Messages)-3:] {
		types = append(types, fmt.Sprintf("%s/%d", m.Type, m.Sequence))
	}
	if want := fmt.Sprintf("[event/%d task_completed/0 event/%d]", n-1, n); fmt.Sprint(types) != want {
		t.Errorf("the stream ends %v, want %s", types, want)
	}
	snap := b.app.Snapshot()
	if snap.Requests*4 > snap.Total {
		t.Errorf("%d messages came in %d requests; want batches (at least 4 per request on average)", snap.Total, snap.Requests)
	}
	t.Logf("%d messages in %d requests", snap.Total, snap.Requests)
	eventually(t, 10*time.Second, "every delivery acked", func() error {
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("%d messages still in the event queue", d)
		}
		return nil
	})
}

// TestBatchOffer: with AppMaxBatch 1 (the default) the sidecar POSTs one
// event per request until the app offers batches (HeaderBatchMax on its
// answers), then the events of a session that are ready together go in
// one request; when the app withdraws (its batch endpoint answers 404) the
// sidecar goes back to single requests, the refused batch included. Every
// event reaches the app once and in order throughout, and every delivery
// is acked.
func TestBatchOffer(t *testing.T) {
	b := newBed(t, "lab")
	b.app.SetDelay(20 * time.Millisecond) // a slow app: events pile up meanwhile
	r := b.start(func(o *Options) { o.Config.Prefetch = 100 })
	v := r.submit(t, taskReq("lab"))
	const n = 300
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	// phase publishes s.msgs[from:to] (event seq k is msgs[k]), waits until
	// the app has sequence upTo and returns the messages and requests the
	// app counted meanwhile.
	phase := func(what string, from, to int, upTo int64) (msgs, reqs int) {
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
		return after.Total - before.Total, after.Requests - before.Requests
	}

	if msgs, reqs := phase("the events before any offer", 0, 21, 20); reqs != msgs {
		t.Errorf("without an offer: %d messages in %d requests, want one per request", msgs, reqs)
	}
	b.app.OfferBatches(50)
	msgs, reqs := phase("the events after the offer", 21, 221, 220)
	if reqs*4 > msgs {
		t.Errorf("after the offer: %d messages in %d requests; want batches (at least 4 per request on average)", msgs, reqs)
	}
	t.Logf("after the offer: %d messages in %d requests", msgs, reqs)
	// The app withdraws while it processes the first event of the last
	// part (its answer still offers batches), so the next request is a
	// batch, answered 404, and retried as single requests.
	b.app.FailWhen(func(m samplecaller.Message) bool {
		if m.Sequence == 221 {
			b.app.WithdrawBatches()
		}
		return false
	})
	if msgs, reqs := phase("the events after the withdrawal", 221, len(s.msgs), n); reqs != msgs {
		t.Errorf("after the withdrawal: %d messages in %d requests, want one per request", msgs, reqs)
	}
	if failed := testutil.ToFloat64(b.metrics.AppDeliveries.WithLabelValues("error")); failed < 2 {
		t.Errorf("%.0f event deliveries failed; want the batch refused with 404 after the withdrawal", failed)
	}
	eventually(t, 10*time.Second, "the whole stream", func() error { return b.complete(s.sessionID, n) })
	if l, _ := b.app.Session(s.sessionID); l.Duplicates != 0 || len(l.Problems) != 0 {
		t.Errorf("app saw %d duplicates, problems %v", l.Duplicates, l.Problems)
	}
	eventually(t, 10*time.Second, "every delivery acked", func() error {
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("%d messages still in the event queue", d)
		}
		return nil
	})
}

func seqOf(t *testing.T, env *envelope.Envelope) int64 {
	var p session.EventPayload
	if err := json.Unmarshal(env.Payload, &p); err != nil {
		t.Fatal(err)
	}
	return p.Sequence
}

// TestRejectedAndAbort: a rejection reaches the app and the task view; an
// abort carries the session token to the session's callee.
func TestRejectedAndAbort(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	c := b.callee("lab")

	rej := r.submit(t, taskReq("lab"))
	sid := topology.SessionID("lab", "alpha", rej.MessageID)
	env, err := envelope.New(envelope.TypeTaskRejected, sid, task.TaskRejected{TaskMessageID: rej.MessageID, ReasonCode: task.ReasonNotAuthorized, Message: "no rule admits it"})
	if err != nil {
		t.Fatal(err)
	}
	c.publish(env)
	c.publish(env) // the callee answers a duplicate submit again
	eventually(t, 10*time.Second, "the rejection", func() error {
		var tv TaskView
		r.call(t, http.MethodGet, "/hcp/v1/tasks/"+rej.MessageID, nil, &tv)
		if tv.Status != TaskRejected || tv.ReasonCode != string(task.ReasonNotAuthorized) || !tv.DeliveredToApp {
			return fmt.Errorf("%+v", tv)
		}
		return nil
	})
	if l, _ := b.app.Session(sid); l.Answer != "task_rejected" || l.Duplicates != 0 {
		t.Errorf("app: %+v", l)
	}

	v := r.submit(t, taskReq("lab"))
	s := newScript(t, "lab", v.MessageID, 5)
	var e ErrorResponse
	if st := r.call(t, http.MethodPost, "/hcp/v1/sessions/"+s.sessionID+"/abort", nil, &e); st != 404 {
		t.Errorf("abort before anything is known: HTTP %d %+v", st, e)
	}
	for _, m := range s.msgs[:3] {
		c.publish(m)
	}
	eventually(t, 10*time.Second, "the session start", func() error {
		if l, _ := b.app.Session(s.sessionID); l.LastSequence != 2 {
			return fmt.Errorf("%+v", l)
		}
		return nil
	})
	var ar AbortResponse
	if st := r.call(t, http.MethodPost, "/hcp/v1/sessions/"+s.sessionID+"/abort", AbortRequest{Reason: "changed my mind"}, &ar); st != 202 {
		t.Fatalf("abort: HTTP %d", st)
	}
	ch, err := b.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	found := false
	eventually(t, 10*time.Second, "the abort in the command queue", func() error {
		for {
			d, ok, err := ch.Get(topology.CommandQueue("lab"), true)
			if err != nil || !ok {
				return fmt.Errorf("not found (%v)", err)
			}
			if d.Type != string(envelope.TypeAbort) {
				continue
			}
			env, err := envelope.FromDelivery(d, 0)
			if err != nil {
				return err
			}
			var a task.Abort
			_ = json.Unmarshal(env.Payload, &a)
			if env.MessageID != ar.MessageID || env.Session() != s.sessionID || a.SessionToken != testToken || a.Reason != "changed my mind" || d.UserId != b.caller.name {
				return fmt.Errorf("abort %+v payload %+v user %s", env, a, d.UserId)
			}
			found = true
			return nil
		}
	})
	if !found {
		t.Fatal("no abort")
	}
	for _, m := range s.msgs[3:] {
		c.publish(m)
	}
	eventually(t, 10*time.Second, "the end", func() error { return b.complete(s.sessionID, 5) })
	if st := r.call(t, http.MethodPost, "/hcp/v1/sessions/"+s.sessionID+"/abort", nil, &e); st != 409 || e.Error.Code != "session_finished" {
		t.Errorf("abort after the end: HTTP %d %+v", st, e)
	}
}

// TestSubmitRepublishedUntilAnswered: without an answer the task_submit is
// republished with the same message_id and body, across a restart, until
// the answer arrives.
func TestSubmitRepublishedUntilAnswered(t *testing.T) {
	b := newBed(t, "lab")
	retry := func(o *Options) {
		o.SubmitRetry = RetryPolicy{Timeout: 300 * time.Millisecond, MaxTimeout: 300 * time.Millisecond, MaxAttempts: 20}
	}
	r := b.start(retry)
	v := r.submit(t, taskReq("lab"))
	ch, err := b.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var bodies []string
	collect := func(want int) {
		eventually(t, 15*time.Second, fmt.Sprintf("%d copies of the task_submit", want), func() error {
			for {
				d, ok, err := ch.Get(topology.CommandQueue("lab"), true)
				if err != nil {
					return err
				}
				if !ok {
					break
				}
				if d.MessageId != v.MessageID {
					return fmt.Errorf("unexpected message %s", d.MessageId)
				}
				bodies = append(bodies, string(d.Body))
			}
			if len(bodies) < want {
				return fmt.Errorf("%d copies", len(bodies))
			}
			return nil
		})
	}
	collect(3)
	r.stop(t)
	r2 := b.start(retry)
	collect(len(bodies) + 2)
	for _, body := range bodies[1:] {
		if body != bodies[0] {
			t.Fatalf("republished body differs:\n%s\n%s", bodies[0], body)
		}
	}
	var tv TaskView
	r2.call(t, http.MethodGet, "/hcp/v1/tasks/"+v.MessageID, nil, &tv)
	if tv.Attempts < len(bodies) {
		t.Errorf("attempts %d, copies %d", tv.Attempts, len(bodies))
	}
	// The answer stops the republishing.
	s := newScript(t, "lab", v.MessageID, 3)
	b.callee("lab").publish(s.msgs[0])
	eventually(t, 10*time.Second, "accepted", func() error {
		r2.call(t, http.MethodGet, "/hcp/v1/tasks/"+v.MessageID, nil, &tv)
		if tv.Status != TaskAccepted {
			return fmt.Errorf("%+v", tv)
		}
		return nil
	})
	time.Sleep(time.Second)
	_, _ = ch.QueuePurge(topology.CommandQueue("lab"), false)
	time.Sleep(time.Second)
	if d, ok, _ := ch.Get(topology.CommandQueue("lab"), true); ok {
		t.Errorf("still republished after the answer: %s", d.MessageId)
	}
	t.Logf("task_submit published %d times with message_id %s, identical bodies, across one restart", len(bodies), v.MessageID)
}

// TestSubmitValidation: bad requests are refused with field details, an
// unknown callee is 404, a repeated message_id is idempotent.
func TestSubmitValidation(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	var e ErrorResponse
	bad := taskReq("lab")
	bad.Constraints.DataClassification = "T9"
	bad.Capability = "bad capability"
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", bad, &e); st != 400 || len(e.Error.Fields) != 2 {
		t.Errorf("invalid task: HTTP %d %+v", st, e)
	}
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", map[string]any{"callee_id": "lab", "capabilty": "typo"}, &e); st != 400 {
		t.Errorf("unknown field: HTTP %d %+v", st, e)
	}
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", taskReq("nobody"), &e); st != 404 || e.Error.Code != "unknown_callee" {
		t.Errorf("unknown callee: HTTP %d %+v", st, e)
	}
	req := taskReq("lab")
	req.MessageID = envelope.NewMessageID()
	var v1, v2 TaskView
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", req, &v1); st != 202 || v1.MessageID != req.MessageID {
		t.Errorf("first submit: HTTP %d %+v", st, v1)
	}
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", req, &v2); st != 200 || v2.MessageID != req.MessageID || v2.Attempts != 1 {
		t.Errorf("repeated submit: HTTP %d %+v", st, v2)
	}
	req.Capability = "other"
	if st := r.call(t, http.MethodPost, "/hcp/v1/tasks", req, &e); st != 409 {
		t.Errorf("reused message_id: HTTP %d %+v", st, e)
	}
	if st := r.call(t, http.MethodGet, "/hcp/v1/tasks/"+envelope.NewMessageID(), nil, &e); st != 404 {
		t.Errorf("unknown task: HTTP %d", st)
	}
	if st := r.call(t, http.MethodGet, "/hcp/v1/sessions/"+envelope.NewMessageID(), nil, &e); st != 404 {
		t.Errorf("unknown session: HTTP %d", st)
	}
}

// TestSampleCallerClient: the sample caller's submit-and-watch path, which
// uses nothing but the local HTTP API, follows a task to its end.
func TestSampleCallerClient(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	c := samplecaller.NewClient(r.api.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	task, err := c.Submit(ctx, samplecaller.SubmitRequest{CalleeID: "lab", Capability: "analyze", Intent: "demo",
		Inputs: json.RawMessage(`{"steps":2}`), Constraints: samplecaller.Constraints{DataClassification: "T1"}})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		s := newScript(t, "lab", task.MessageID, 6)
		callee := b.callee("lab")
		for _, m := range s.msgs {
			callee.publish(m)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	var out strings.Builder
	final, sess, err := c.Watch(ctx, task.MessageID, 20*time.Millisecond, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sample-caller submit output:\n%s", out.String())
	if final.Status != "accepted" || !sess.Finished || sess.State != "COMPLETED" || sess.LastSequence != 6 {
		t.Errorf("task %+v session %+v", final, sess)
	}
	if _, err := c.Submit(ctx, samplecaller.SubmitRequest{CalleeID: "lab"}); err == nil || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("invalid submit: %v", err)
	}
}

// TestAcceptedArrivingAfterEvents: a task_accepted republished behind the
// session's first events (a lost confirm on the callee side) is still
// delivered first.
func TestAcceptedArrivingAfterEvents(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	v := r.submit(t, taskReq("lab"))
	const n = 6
	s := newScript(t, "lab", v.MessageID, n)
	c := b.callee("lab")
	for _, m := range s.msgs[1:4] {
		c.publish(m)
	}
	time.Sleep(200 * time.Millisecond)
	c.publish(s.msgs[0])
	for _, m := range s.msgs[4:] {
		c.publish(m)
	}
	eventually(t, 20*time.Second, "the stream, answer first", func() error { return b.complete(s.sessionID, n) })
	if l, _ := b.app.Session(s.sessionID); l.Messages[0].Type != "task_accepted" {
		t.Errorf("first message %+v", l.Messages[0])
	}
}

// TestAbortedSessionsArePruned: an aborted session ends with session_closed
// and no task_completed or task_failed; past the retention it is forgotten
// like any other finished session, not kept for ever.
func TestAbortedSessionsArePruned(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start(func(o *Options) { o.Retention = time.Millisecond })
	v := r.submit(t, taskReq("lab"))
	s := newScript(t, "lab", v.MessageID, 3)
	c := b.callee("lab")
	c.publish(s.msgs[0]) // task_accepted
	c.publish(s.msgs[1]) // session_created
	closed, err := envelope.New(envelope.TypeEvent, s.sessionID, mustEvent(t, 2, &session.SessionClosedData{FinalState: session.StateAborted, Reason: "aborted"}))
	if err != nil {
		t.Fatal(err)
	}
	c.publish(closed)
	eventually(t, 10*time.Second, "the aborted session closed", func() error {
		if rec, ok := r.sc.store.Session(s.sessionID); !ok || !rec.Closed || rec.State != string(session.StateAborted) {
			return fmt.Errorf("record %+v (%v)", rec, ok)
		}
		return nil
	})
	eventually(t, 10*time.Second, "the aborted session forgotten", func() error {
		r.sc.prune()
		if rec, ok := r.sc.store.Session(s.sessionID); ok {
			return fmt.Errorf("still kept: %+v", rec)
		}
		return nil
	})
}
