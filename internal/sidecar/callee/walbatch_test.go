package callee

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// TestEventBatchIsOneLogWrite: the events of one harness request are
// recorded in the write-ahead log with one write, then published with
// consecutive sequences; a key repeated within the request, or sent
// before, gets the sequence it already has; the caller's queue gets each
// event once, in order.
func TestEventBatchIsOneLogWrite(t *testing.T) {
	b := newBed(t, bedOptions{stateDirs: true})
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":1,"step_ms":600000}`) }))
	b.waitMessage(sid, 20*time.Second, "state_changed", isEvent(session.EventStateChanged))
	base := "/hcp/v1/sessions/" + sid
	const js = "application/json"
	if a := b.call("POST", base+"/events", js, `{"event_type":"log","data":{"level":"info","message":"k0"},"idempotency_key":"k0"}`); a.status != 200 || a.body["sequence"] != float64(3) {
		t.Fatalf("one event: %d %v", a.status, a.body)
	}
	var evs []string
	for i := range 40 {
		evs = append(evs, fmt.Sprintf(`{"event_type":"log","data":{"level":"info","message":"m%d"}}`, i))
	}
	evs[5] = `{"event_type":"log","data":{"level":"info","message":"k1"},"idempotency_key":"k1"}`
	evs[9] = evs[5]                                                                                // the same key again in the request
	evs[20] = `{"event_type":"log","data":{"level":"info","message":"k0"},"idempotency_key":"k0"}` // a key of an earlier request
	before := b.sc.wal.MessageWrites()
	a := b.call("POST", base+"/events", js, "["+strings.Join(evs, ",")+"]")
	if a.status != 200 {
		t.Fatalf("batch: %d %v", a.status, a.body)
	}
	if n := b.sc.wal.MessageWrites() - before; n != 1 {
		t.Errorf("a request of 40 events took %d writes of the log, want 1", n)
	}
	var want []string
	next := int64(4)
	for i := range evs {
		switch i {
		case 9:
			want = append(want, fmt.Sprint(4+5))
		case 20:
			want = append(want, "3")
		default:
			want = append(want, fmt.Sprint(next))
			next++
		}
	}
	if got := fmt.Sprint(a.body["sequences"]); got != "["+strings.Join(want, " ")+"]" {
		t.Errorf("sequences %s, want [%s]", got, strings.Join(want, " "))
	}
	last := next - 1
	b.waitMessage(sid, 20*time.Second, fmt.Sprintf("event %d", last), func(m received) bool { return m.env.Type == envelope.TypeEvent && eventOf(m).Sequence == last })
	evsGot := b.events(sid)
	checkSequences(t, evsGot)
	if n := int64(len(evsGot)); n != last {
		t.Errorf("the caller's queue got %d events, want %d", n, last)
	}
}
