package caller

import (
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// A callee that refuses a task it may have accepted without a record sends
// task_rejected, then task_failed with the same reason. When both reach the
// session's worker before it delivers anything (a busy worker takes all its
// inbox at once), the task_failed is a duplicate of the rejection's end:
// it is acked and never queued for the app behind the task_rejected.
func TestFailedBehindAPendingRejectionIsNotQueued(t *testing.T) {
	st, err := OpenStore("")
	if err != nil {
		t.Fatal(err)
	}
	s := &Sidecar{store: st, m: metrics.New(prometheus.NewRegistry()), clk: clock.RealClock{}, log: logr.Discard(), answered: map[string]bool{}}
	const sid = "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10"
	tr, err := session.NewTracker[*item](sid, session.TrackerOptions{Store: trackerStore{st}})
	if err != nil {
		t.Fatal(err)
	}
	w := &stream{s: s, id: sid, tracker: tr}
	msg := func(typ envelope.MessageType, payload any) *item {
		env, err := envelope.New(typ, sid, payload)
		if err != nil {
			t.Fatal(err)
		}
		return &item{env: env}
	}
	rejection := task.TaskRejected{TaskMessageID: "550e8400-e29b-41d4-a716-446655440000", ReasonCode: task.ReasonNotAuthorized}
	failure := task.TaskFailed{Code: string(task.ReasonNotAuthorized)}
	rej, failed := msg(envelope.TypeTaskRejected, rejection), msg(envelope.TypeTaskFailed, failure)
	rej.rejected, failed.failed = &rejection, &failure

	w.accept(rej)
	w.accept(failed)
	var kinds []envelope.MessageType
	for _, b := range w.barriers {
		kinds = append(kinds, b.kind)
	}
	if len(kinds) != 1 || kinds[0] != envelope.TypeTaskRejected {
		t.Fatalf("queued for the app: %v; want only task_rejected", kinds)
	}
	if !failed.settled.Load() {
		t.Fatal("the task_failed behind the rejection was not acked")
	}
}
