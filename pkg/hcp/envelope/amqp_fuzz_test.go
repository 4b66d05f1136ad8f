package envelope_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// realPublishings are one message of each type as the sidecars publish
// them (envelope.NewPublishing with the payload structs), the callee's
// events marked with the confirmed-through header as its publisher marks
// them: the seeds of the delivery fuzzers.
func realPublishings(tb testing.TB) []amqp.Publishing {
	tb.Helper()
	now := time.Date(2025, 1, 15, 8, 30, 0, 123_000_000, time.UTC)
	taskID := "550e8400-e29b-41d4-a716-446655440000"
	sid := topology.SessionID("lab-cvd", "alpha", taskID)
	const tok = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ0ZXN0In0.c2lnbmF0dXJl"
	event := func(seq int64, d session.EventData) session.EventPayload {
		p, err := session.NewEvent(seq, d)
		if err != nil {
			tb.Fatal(err)
		}
		return p
	}
	pct := 40.0
	msgs := []struct {
		typ     envelope.MessageType
		sid     string
		payload any
		user    string
		mark    int64 // < 0: no confirmed-through header
	}{
		{envelope.TypeTaskSubmit, "", task.TaskSubmit{CallerID: "alpha", CalleeID: "lab-cvd", Capability: "cvd.run-synthesis",
			Intent: "grow a film", Inputs: json.RawMessage(`{"steps":20,"step_ms":500}`),
			Constraints: task.Constraints{MaxDuration: task.Duration(time.Hour), DataClassification: task.T2, Deadline: task.TimestampPtr(now.Add(2 * time.Hour))}},
			"caller.alpha@/hcp", -1},
		{envelope.TypeAbort, sid, task.Abort{SessionToken: tok, Reason: "operator"}, "caller.alpha@/hcp", -1},
		{envelope.TypeTaskAccepted, sid, task.TaskAccepted{TaskMessageID: taskID, SessionID: sid, SessionToken: tok,
			RiskLevel: task.R2, ExpiresAt: task.NewTimestamp(now.Add(time.Hour))}, "callee.lab-cvd@/hcp", -1},
		{envelope.TypeTaskRejected, sid, task.TaskRejected{TaskMessageID: taskID, ReasonCode: task.ReasonNotAuthorized,
			Message: "no CapabilityPolicy admits caller alpha"}, "callee.lab-cvd@/hcp", -1},
		{envelope.TypeEvent, sid, event(1, &session.SessionCreatedData{State: session.StateRunning, RiskLevel: task.R2, SessionToken: tok}), "callee.lab-cvd@/hcp", 0},
		{envelope.TypeEvent, sid, event(2, &session.ProgressData{Stage: "anneal", Percent: &pct, Message: "step 8 of 20"}), "callee.lab-cvd@/hcp", 1},
		{envelope.TypeEvent, sid, event(3, &session.StateChangedData{FromState: session.StateRunning, ToState: session.StatePaused, Reason: "harness_moved"}), "callee.lab-cvd@/hcp", 2},
		{envelope.TypeTaskCompleted, sid, task.TaskCompleted{Result: json.RawMessage(`{"yield":0.93}`),
			Artifacts: []task.Artifact{{URI: "s3://results/run-1/film.tiff", SHA256: strings.Repeat("ab", 32), Size: 1 << 20}},
			Summary:   task.Summary{Duration: task.Duration(3 * time.Minute), EventCount: 4}}, "callee.lab-cvd@/hcp", 3},
		{envelope.TypeEvent, sid, event(4, &session.SessionClosedData{FinalState: session.StateCompleted, Reason: "done"}), "callee.lab-cvd@/hcp", 3},
		{envelope.TypeTaskFailed, sid, task.TaskFailed{Code: "timeout", Message: "exceeded PT1H", Recoverable: true}, "callee.lab-cvd@/hcp", -1},
	}
	var out []amqp.Publishing
	for _, m := range msgs {
		p, err := envelope.NewPublishing(now, m.typ, m.sid, m.payload, m.user)
		if err != nil {
			tb.Fatalf("%s: %v", m.typ, err)
		}
		if m.mark >= 0 {
			envelope.SetConfirmedThrough(&p, m.mark)
		}
		out = append(out, p)
	}
	return out
}

// headerValue builds the confirmed-through header value a fuzz input picks:
// absent, each integer type amqp091 decodes a table field into, and types
// a foreign publisher might put there instead. want/ok is what
// ConfirmedThrough must make of it.
func headerValue(kind byte, v int64) (val any, present bool, want int64, ok bool) {
	switch kind % 13 {
	case 0:
		return nil, false, 0, false
	case 1:
		return v, true, v, v >= 0
	case 2:
		return int32(v), true, int64(int32(v)), int32(v) >= 0
	case 3:
		return int16(v), true, int64(int16(v)), int16(v) >= 0
	case 4:
		return int8(v), true, int64(int8(v)), int8(v) >= 0
	case 5:
		return uint8(v), true, int64(uint8(v)), true
	case 6:
		return uint16(v), true, int64(uint16(v)), true
	case 7:
		return uint32(v), true, int64(uint32(v)), true
	case 8:
		return "7", true, 0, false
	case 9:
		return float64(v), true, 0, false
	case 10:
		return v != 0, true, 0, false
	case 11:
		return uint64(v), true, 0, false // not an AMQP table type
	default:
		return nil, true, 0, false
	}
}

// FuzzFromDelivery: a delivery with any body, any properties and any
// confirmed-through header. FromDelivery never panics, fails only with
// this package's error types, accepts only what Decode accepts and what
// its properties agree with, and accepts every valid body whose optional
// properties are unset; ConfirmedThrough returns exactly the non-negative
// integer the header holds, and SetConfirmedThrough round-trips.
func FuzzFromDelivery(f *testing.F) {
	for i, p := range realPublishings(f) {
		d := deliveryOf(p)
		if _, err := envelope.FromDelivery(d, 0); err != nil {
			f.Fatalf("real %s: %v", d.Type, err)
		}
		mark, _ := envelope.ConfirmedThrough(d.Headers)
		f.Add(d.Body, d.ContentType, d.ContentEncoding, d.MessageId, d.Type, d.CorrelationId, byte(1+i%7), mark)
		// The same message with properties that contradict it.
		f.Add(d.Body, "application/json; charset=latin1", "gzip", strings.ToUpper(d.MessageId), "event", sessID, byte(9), int64(-1))
	}
	f.Add([]byte(`{}`), "", "", "", "", "", byte(0), int64(0))
	f.Add([]byte(`not json`), "text/plain", "utf-8", "x", "y", "z", byte(11), int64(1)<<40)
	f.Fuzz(func(t *testing.T, body []byte, ct, enc, mid, typ, corr string, kind byte, hv int64) {
		d := amqp.Delivery{ContentType: ct, ContentEncoding: enc, MessageId: mid, Type: typ, CorrelationId: corr,
			Body: body, Headers: amqp.Table{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
		val, present, want, wantOK := headerValue(kind, hv)
		if present {
			d.Headers[envelope.HeaderConfirmedThrough] = val
		}

		got, ok := envelope.ConfirmedThrough(d.Headers)
		if ok != wantOK || (ok && got != want) {
			t.Fatalf("ConfirmedThrough(%T %v) = %d, %v; want %d, %v", val, val, got, ok, want, wantOK)
		}
		p := amqp.Publishing{Headers: d.Headers}
		envelope.SetConfirmedThrough(&p, hv)
		if got, ok := envelope.ConfirmedThrough(p.Headers); ok != (hv >= 0) || (ok && got != hv) {
			t.Fatalf("SetConfirmedThrough(%d) reads back as %d, %v", hv, got, ok)
		}
		if v, had := d.Headers[envelope.HeaderConfirmedThrough]; had != present || (present && v != val) {
			t.Fatal("SetConfirmedThrough changed the header table it copied")
		}

		env, err := envelope.FromDelivery(d, 0)
		decoded, derr := envelope.Decode(body)
		if err != nil {
			var pe *envelope.PropertyError
			var fe *envelope.FieldError
			var se *envelope.SyntaxError
			if !errors.As(err, &pe) && !errors.As(err, &fe) && !errors.As(err, &se) && !errors.Is(err, envelope.ErrTooLarge) {
				t.Fatalf("untyped error %T: %v", err, err)
			}
			if derr == nil && ct == envelope.ContentType && enc == "" && mid == "" && typ == "" && corr == "" {
				t.Fatalf("refused a valid body with no optional properties: %v", err)
			}
			return
		}
		if derr != nil || !env.Equal(decoded) {
			t.Fatalf("FromDelivery accepted what Decode says is %v", derr)
		}
		if mid != "" && !strings.EqualFold(mid, env.MessageID) {
			t.Fatalf("message_id property %q accepted for %q", mid, env.MessageID)
		}
		if typ != "" && typ != string(env.Type) {
			t.Fatalf("type property %q accepted for %q", typ, env.Type)
		}
		if corr != "" && !strings.EqualFold(corr, env.Session()) {
			t.Fatalf("correlation_id %q accepted for session %q", corr, env.Session())
		}
	})
}
