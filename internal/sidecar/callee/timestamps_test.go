package callee

import (
	"bytes"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestSubmitTimestampPrecision: L1 asks for "ISO 8601 format in UTC" and
// gives 2025-01-15T08:30:00.000Z as an example, not as the only precision.
// A task_submit whose envelope timestamp and constraints.deadline are
// written without a fraction, with microseconds, with nanoseconds, or with
// "+00:00" for UTC, published raw over the real broker, is accepted and
// runs to COMPLETED (envelope.ParseTimestamp, one rule for envelope and
// payloads). test/e2e's Timestamps step does the same on the stack.
func TestSubmitTimestampPrecision(t *testing.T) {
	b := newBed(t, bedOptions{})
	for _, form := range []struct{ name, layout string }{
		{"no fraction", "2006-01-02T15:04:05Z"},
		{"microseconds", "2006-01-02T15:04:05.000000Z"},
		{"nanoseconds", "2006-01-02T15:04:05.000000000Z"},
		{"+00:00", "2006-01-02T15:04:05.000+00:00"},
	} {
		t.Run(form.name, func(t *testing.T) {
			// Nanoseconds that every form shows a different part of.
			now := time.Now().UTC().Truncate(time.Second).Add(123456789)
			pub, stamp := rawSubmit(t, now, form.layout, newSubmit(func(ts *task.TaskSubmit) {
				ts.Constraints.Deadline = task.TimestampPtr(now.Add(time.Hour))
			}), b.callerU)
			t.Logf("envelope timestamp %s", stamp)
			b.publish(pub)
			sid := topology.SessionID(calleeID, callerID, pub.MessageId)
			m := b.waitMessage(sid, 20*time.Second, "task_accepted or task_rejected", func(m received) bool {
				return m.env.Type == envelope.TypeTaskAccepted || m.env.Type == envelope.TypeTaskRejected
			})
			if m.env.Type != envelope.TypeTaskAccepted {
				t.Fatalf("a task_submit stamped %s was answered %s: %+v", stamp, m.env.Type, rejectedOf(t, m))
			}
			b.waitState(sid, v1alpha1.SessionCompleted, 30*time.Second)
		})
	}
}

// rawSubmit encodes ts as a task_submit at now and rewrites its envelope
// timestamp and its constraints.deadline (if any) with layout, the way a
// foreign peer might write them. It returns the publishing and the
// envelope timestamp as sent.
func rawSubmit(t *testing.T, now time.Time, layout string, ts *task.TaskSubmit, userID string) (pub amqp.Publishing, stamp string) {
	t.Helper()
	env, err := envelope.NewAt(now, envelope.TypeTaskSubmit, "", ts)
	must(t, err)
	body, err := envelope.Encode(env)
	must(t, err)
	stamp = now.Format(layout)
	body = replaceOnce(t, body, `"timestamp":"`+envelope.FormatTimestamp(now)+`"`, `"timestamp":"`+stamp+`"`)
	if dl := ts.Constraints.Deadline; dl != nil {
		body = replaceOnce(t, body, `"deadline":"`+envelope.FormatTimestamp(dl.Time)+`"`, `"deadline":"`+dl.Format(layout)+`"`)
	}
	return envelope.ToPublishing(env, body, userID), stamp
}

func replaceOnce(t *testing.T, body []byte, old, new string) []byte {
	t.Helper()
	if bytes.Count(body, []byte(old)) != 1 {
		t.Fatalf("%s is not in the encoded task_submit once: %s", old, body)
	}
	return bytes.Replace(body, []byte(old), []byte(new), 1)
}
