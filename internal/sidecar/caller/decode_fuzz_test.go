package caller

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// fuzzDeliveries are the deliveries of one session as the callee sidecar
// publishes them to caller "alpha" (task_accepted, events marked with
// hcp-confirmed-through, task_completed, task_rejected, task_failed), plus a
// task_submit that does not belong on the event channel.
func fuzzDeliveries(tb testing.TB) []amqp.Delivery {
	tb.Helper()
	now := time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)
	const taskID = "550e8400-e29b-41d4-a716-446655440000"
	sid := topology.SessionID("lab", "alpha", taskID)
	ev := func(seq int64, d session.EventData) session.EventPayload {
		p, err := session.NewEvent(seq, d)
		if err != nil {
			tb.Fatal(err)
		}
		return p
	}
	type msg struct {
		typ     envelope.MessageType
		payload any
		mark    int64
	}
	msgs := []msg{
		{envelope.TypeTaskAccepted, task.TaskAccepted{TaskMessageID: taskID, SessionID: sid, SessionToken: testToken, RiskLevel: task.R1, ExpiresAt: task.NewTimestamp(now.Add(time.Hour))}, -1},
		{envelope.TypeEvent, ev(1, &session.SessionCreatedData{State: session.StateRunning, RiskLevel: task.R1, SessionToken: testToken}), 0},
		{envelope.TypeEvent, ev(2, &session.LogData{Level: session.LogInfo, Message: "step 1"}), 1},
		{envelope.TypeEvent, ev(3, &session.CheckpointCreatedData{CheckpointID: "c1", Description: "d", Resumable: true, CreatedAt: task.NewTimestamp(now)}), 2},
		{envelope.TypeTaskCompleted, task.TaskCompleted{Result: json.RawMessage(`{"ok":true}`), Summary: task.Summary{EventCount: 4}}, 3},
		{envelope.TypeEvent, ev(4, &session.SessionClosedData{FinalState: session.StateCompleted, Reason: "done"}), 3},
		{envelope.TypeTaskRejected, task.TaskRejected{TaskMessageID: taskID, ReasonCode: task.ReasonMalformed, Message: "bad"}, -1},
		{envelope.TypeTaskFailed, task.TaskFailed{Code: "timeout", Message: "m", Recoverable: true}, -1},
	}
	var out []amqp.Delivery
	for _, m := range msgs {
		p, err := envelope.NewPublishing(now, m.typ, sid, m.payload, "callee.lab@/hcp")
		if err != nil {
			tb.Fatalf("%s: %v", m.typ, err)
		}
		if m.mark >= 0 {
			envelope.SetConfirmedThrough(&p, m.mark)
		}
		out = append(out, amqp.Delivery{Headers: p.Headers, ContentType: p.ContentType, ContentEncoding: p.ContentEncoding,
			CorrelationId: p.CorrelationId, MessageId: p.MessageId, Type: p.Type, UserId: p.UserId, Body: p.Body,
			RoutingKey: topology.EventRoutingKey("alpha", sid, m.typ)})
	}
	submit, err := envelope.NewPublishing(now, envelope.TypeTaskSubmit, "", json.RawMessage(`{}`), "callee.lab@/hcp")
	if err != nil {
		tb.Fatal(err)
	}
	out = append(out, amqp.Delivery{ContentType: submit.ContentType, UserId: submit.UserId, Body: submit.Body})
	return out
}

// FuzzCallerDecode feeds the caller sidecar's decoder deliveries with any
// body, routing key, user_id, content type and confirmed-through header.
// It never panics; a refusal carries one of the discard reasons; what it
// accepts is an event-channel message that envelope.FromDelivery accepts,
// from a callee of the caller's vhost, routed to this caller and this
// session, with the payload of its type decoded (and only that one), a
// lowercase session id, and the confirmed-through mark exactly as
// envelope.ConfirmedThrough reads it: the mark the gap logic trusts.
func FuzzCallerDecode(f *testing.F) {
	s := &Sidecar{cfg: &config.Config{ID: "alpha", Vhost: "/hcp"}, m: metrics.New(prometheus.NewRegistry())}
	ds := fuzzDeliveries(f)
	for i, d := range ds {
		// The seeds are what the decoder must take: every real message but
		// the misdirected task_submit (the last).
		if _, _, err := s.decode(context.Background(), d); (err == nil) != (i < len(ds)-1) {
			f.Fatalf("seed %d (%s): decode error %v", i, d.Type, err)
		}
		mark, _ := d.Headers[envelope.HeaderConfirmedThrough].(int64)
		f.Add(d.Body, d.RoutingKey, d.UserId, d.ContentType, d.Headers != nil, mark)
		f.Add(d.Body, "", "caller.alpha@/hcp", d.ContentType, true, int64(-5))
		f.Add(d.Body, strings.Replace(d.RoutingKey, "alpha", "beta", 1), "callee.lab@/other", d.ContentType, false, int64(0))
	}
	f.Fuzz(func(t *testing.T, body []byte, rk, uid, ct string, marked bool, mark int64) {
		d := amqp.Delivery{Body: body, RoutingKey: rk, UserId: uid, ContentType: ct}
		if marked {
			d.Headers = amqp.Table{envelope.HeaderConfirmedThrough: mark}
		}
		it, reason, err := s.decode(context.Background(), d)
		if err != nil {
			if it != nil || (reason != ReasonMalformed && reason != ReasonUnauthSender) {
				t.Fatalf("refusal with item %v, reason %q: %v", it, reason, err)
			}
			return
		}
		if reason != "" {
			t.Fatalf("accepted with reason %q", reason)
		}
		env, ferr := envelope.FromDelivery(d, 0)
		if ferr != nil || !env.Type.IsEvent() || it.env.Type != env.Type {
			t.Fatalf("accepted a delivery envelope.FromDelivery refuses (%v) or of type %s", ferr, env.Type)
		}
		role, vhost, callee, perr := topology.ParseUsername(uid)
		if perr != nil || role != topology.RoleCallee || vhost != "/hcp" || it.sender != callee {
			t.Fatalf("accepted sender %q as %q", uid, it.sender)
		}
		sid := it.env.Session()
		if sid != strings.ToLower(env.Session()) {
			t.Fatalf("session id %q not in lowercase", sid)
		}
		if rk != "" {
			caller, rsid, typ, rerr := topology.ParseEventRoutingKey(rk)
			if rerr != nil || caller != "alpha" || !strings.EqualFold(rsid, sid) || typ != env.Type {
				t.Fatalf("accepted routing key %q for session %s type %s", rk, sid, env.Type)
			}
		}
		decoded := 0
		for _, set := range []bool{it.event != nil, it.accepted != nil, it.rejected != nil, it.completed != nil, it.failed != nil} {
			if set {
				decoded++
			}
		}
		if decoded != 1 {
			t.Fatalf("%d payloads decoded for a %s", decoded, env.Type)
		}
		switch env.Type {
		case envelope.TypeEvent:
			if it.event == nil || it.eventData == nil || it.event.Sequence < 1 {
				t.Fatalf("event accepted without its data or with sequence %v", it.event)
			}
			want, wantOK := envelope.ConfirmedThrough(d.Headers)
			if it.marked != wantOK || (wantOK && it.mark != want) || (it.marked && it.mark < 0) {
				t.Fatalf("mark %d/%v, header says %d/%v", it.mark, it.marked, want, wantOK)
			}
		case envelope.TypeTaskAccepted:
			if it.accepted == nil || !strings.EqualFold(it.accepted.SessionID, sid) || it.accepted.Validate() != nil {
				t.Fatalf("task_accepted %+v for session %s", it.accepted, sid)
			}
		case envelope.TypeTaskRejected:
			if it.rejected == nil || it.rejected.Validate() != nil {
				t.Fatalf("task_rejected %+v", it.rejected)
			}
		case envelope.TypeTaskCompleted:
			if it.completed == nil || it.completed.Validate() != nil {
				t.Fatalf("task_completed %+v", it.completed)
			}
		case envelope.TypeTaskFailed:
			if it.failed == nil || it.failed.Validate() != nil {
				t.Fatalf("task_failed %+v", it.failed)
			}
		}
		if !it.marked && env.Type != envelope.TypeEvent && it.mark != 0 {
			t.Fatalf("a %s carries a mark", env.Type)
		}
	})
}
