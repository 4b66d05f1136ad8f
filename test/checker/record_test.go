package checker

import (
	"encoding/json"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const wireEvent = `{"hcp_version":"1.0","message_id":"m-7","timestamp":"2026-11-28T12:00:00.000Z","session_id":"s1","type":"event",
 "payload":{"event_type":"state_changed","sequence":7,"data":{"from_state":"PAUSED","to_state":"RUNNING","reason":"recovered_from_checkpoint"}}}`

// The app gets the same message re-encoded (other key order, no spaces):
// its digest must be the wire's, and a different body must not be.
func TestWireAndAppAgree(t *testing.T) {
	w, err := FromWire([]byte(wireEvent), amqp.Table{"hcp-owner-epoch": int64(3)}, "callee-user", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if w.Seq != 7 || w.Epoch != 3 || w.Type != "state_changed" || w.Reason != RecoveryReason || w.Publisher != "callee-user" {
		t.Fatalf("wire message read as %+v", w)
	}
	app, err := FromApp("s1", "m-7", "event", json.RawMessage(`{"sequence":7,"data":{"reason":"recovered_from_checkpoint","to_state":"RUNNING","from_state":"PAUSED"},"event_type":"state_changed"}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if app.Digest != w.Digest {
		t.Fatalf("the same message has digest %s on the wire and %s at the app", w.Digest, app.Digest)
	}
	other, _ := FromApp("s1", "m-7", "event", json.RawMessage(`{"sequence":7,"event_type":"progress","data":{}}`), time.Now())
	if other.Digest == w.Digest {
		t.Fatal("a different body has the same digest")
	}
}

func TestClosingMessages(t *testing.T) {
	c, err := FromApp("s1", "m-9", "event", json.RawMessage(`{"event_type":"session_closed","sequence":9,"data":{"final_state":"ABORTED","reason":"caller abort"}}`), time.Now())
	if err != nil || !c.Closes || c.Final != "ABORTED" {
		t.Fatalf("session_closed read as %+v, %v", c, err)
	}
	r, err := FromApp("s2", "m-1", "task_rejected", json.RawMessage(`{"reason":"policy_denied"}`), time.Now())
	if err != nil || !r.Closes || r.Final != "REJECTED" || r.Seq != 0 {
		t.Fatalf("task_rejected read as %+v, %v", r, err)
	}
}

func TestBadInputIsAnError(t *testing.T) {
	for name, body := range map[string]string{
		"not JSON":           `{`,
		"no session":         `{"message_id":"m","type":"event","payload":{"event_type":"progress","sequence":1}}`,
		"event, no sequence": `{"message_id":"m","session_id":"s","type":"event","payload":{"event_type":"progress"}}`,
		"payload not JSON":   `{"message_id":"m","session_id":"s","type":"task_completed","payload":"x`,
	} {
		if _, err := FromWire([]byte(body), nil, "u", time.Now()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if e := epochOf(amqp.Table{"hcp-owner-epoch": "7"}); e != 0 {
		t.Errorf("a string epoch read as %d", e)
	}
}
