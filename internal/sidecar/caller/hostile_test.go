package caller

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

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
