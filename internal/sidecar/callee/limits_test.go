package callee

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// A concurrency limit holds across replicas: submits fired at once at two
// replicas, each counting from its own cache, must not admit more sessions
// than maxConcurrentSessions between them. Every other submit is refused
// with CONCURRENCY_LIMIT; none is left unanswered.
func TestConcurrencyLimitHoldsAcrossReplicas(t *testing.T) {
	const limit, submits = 2, 12
	rules := defaultRules()
	rules[0].MaxConcurrentSessions = new(int32(limit))
	b := newBed(t, bedOptions{policies: rules})
	r2 := b.startReplica("callee-pod-1")
	defer r2.stop()

	sids := make([]string, 0, submits)
	for range submits {
		_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":600,"step_ms":100}`) }))
		sids = append(sids, sid)
	}
	var accepted []string
	testEventually(t, 30*time.Second, func() error {
		accepted = accepted[:0]
		for _, sid := range sids {
			switch {
			case countType(b.messages(sid), envelope.TypeTaskAccepted) > 0:
				accepted = append(accepted, sid)
			case countType(b.messages(sid), envelope.TypeTaskRejected) > 0:
				if r := rejectedOf(t, b.waitMessage(sid, time.Second, "task_rejected", isType(envelope.TypeTaskRejected))); r.ReasonCode != task.ReasonConcurrencyLimit {
					return fmt.Errorf("session %s rejected with %s (%s), want CONCURRENCY_LIMIT", sid, r.ReasonCode, r.Message)
				}
			default:
				return fmt.Errorf("session %s not answered yet", sid)
			}
		}
		return nil
	})
	running := b.first.harness.Started() + r2.harness.Started()
	t.Logf("%d submits at 2 replicas, limit %d: %d accepted, %d tasks started (%s %d, %s %d)",
		submits, limit, len(accepted), running, b.pod, b.first.harness.Started(), r2.pod, r2.harness.Started())
	if len(accepted) > limit || running > limit {
		t.Fatalf("%d sessions accepted and %d started with maxConcurrentSessions %d", len(accepted), running, limit)
	}
	if len(accepted) == 0 {
		t.Fatal("no session was accepted: the limit must admit up to its value")
	}
	for _, sid := range accepted {
		if st := b.hcpSession(sid).Status.State; st != v1alpha1.SessionRunning {
			t.Fatalf("accepted session %s is %s", sid, st)
		}
	}
}
