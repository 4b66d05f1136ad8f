package caller

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// A callee that may have accepted a task it could not record refuses a
// later copy with task_rejected followed by task_failed (same reason), and
// ends an acceptance it could not record with task_failed alone. A caller
// that got the rejection first keeps it: the task_failed of a rejected
// task never reaches the app. One that got the acceptance ends the session
// FAILED.
func TestFailedAfterAnAnswer(t *testing.T) {
	b := newBed(t, "lab")
	r := b.start()
	c := b.callee("lab")
	publish := func(sid string, typ envelope.MessageType, payload any) {
		t.Helper()
		env, err := envelope.New(typ, sid, payload)
		if err != nil {
			t.Fatal(err)
		}
		c.publish(env)
	}
	failed := task.TaskFailed{Code: string(task.ReasonNotAuthorized), Message: "no rule admits it"}

	rej := r.submit(t, taskReq("lab"))
	sid := topology.SessionID("lab", "alpha", rej.MessageID)
	publish(sid, envelope.TypeTaskRejected, task.TaskRejected{TaskMessageID: rej.MessageID, ReasonCode: task.ReasonNotAuthorized, Message: failed.Message})
	publish(sid, envelope.TypeTaskFailed, failed)

	acc := r.submit(t, taskReq("lab"))
	s := newScript(t, "lab", acc.MessageID, 3)
	c.publish(s.msgs[0]) // task_accepted
	publish(s.sessionID, envelope.TypeTaskFailed, task.TaskFailed{Code: "session_not_recorded", Message: "could not record it", Recoverable: true})

	eventually(t, 10*time.Second, "both answers at the app, nothing left in the queue", func() error {
		if l, _ := b.app.Session(s.sessionID); l.Answer != "task_accepted" || l.Terminal != "task_failed" {
			return fmt.Errorf("accepted task at the app: %+v", l)
		}
		if l, _ := b.app.Session(sid); l.Answer != "task_rejected" {
			return fmt.Errorf("rejected task at the app: %+v", l)
		}
		if d := b.queueDepth(topology.EventQueue(b.callerID)); d != 0 {
			return fmt.Errorf("depth %d", d)
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	if l, _ := b.app.Session(sid); l.Terminal != "" || len(l.Problems) > 0 {
		t.Fatalf("the rejected task's task_failed reached the app: %+v", l)
	}
	var tv TaskView
	r.call(t, http.MethodGet, "/hcp/v1/tasks/"+rej.MessageID, nil, &tv)
	if tv.Status != TaskRejected {
		t.Fatalf("task view %+v", tv)
	}
}
