package callee

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	corev1 "k8s.io/api/core/v1"

	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// rejectionsRemembered bounds the rejections a replica remembers (about
// 100 bytes each).
const rejectionsRemembered = 100_000

// rejection is a task the gate rejected without a record: what its reply
// said.
type rejection struct {
	at   time.Time
	code task.ReasonCode
	msg  string
	// accepted is set for a task accepted but never recorded (accept.go):
	// its task_accepted, answered again with task_failed (code, msg,
	// recoverable).
	accepted    *amqp.Publishing
	recoverable bool
}

// rejectUnrecorded answers a task that the first decision refuses (the
// L3 gate, an expired task, a harness that cannot be reached, what the gate
// needs unreadable) without writing to the API server: no HCPSession is
// created, so a flood of bad submits costs etcd nothing and a rejection
// costs no API round trip. The rejection is logged, counted
// (hcp_sidecar_rejects_total), recorded as an Event on the Callee (the
// standard recorder aggregates and rate-limits a flood into a few objects),
// and remembered by this replica, so that a redelivered copy gets the very
// same reply (same message_id, timestamp and reason). A copy redelivered to
// another replica (only after this one failed between publishing the reply
// and acknowledging the command) is decided again, with the same inputs
// the same way; the caller deduplicates answers by task.
//
// Rejections after the task's HCPSession exists (the concurrency recount
// across replicas, a token that cannot be issued) stay recorded: the claim
// is already visible to the other replicas.
func (s *Sidecar) rejectUnrecorded(ctx context.Context, c *command, v policy.Verdict) {
	r := rejection{at: s.clk.Now().UTC().Truncate(time.Second), code: v.Reason, msg: v.Message}
	s.rejections.Add(c.sid, r)
	c.log.Info("Rejected a task", "reasonCode", v.Reason, "message", v.Message)
	s.event(corev1.EventTypeWarning, EventTaskRejected, "Rejected task %s of caller %s (capability %q): %s: %s",
		c.msgID, c.callerID, c.ts.Capability, v.Reason, oneLine(v.Message, 300))
	s.countReject(string(v.Reason))
	s.answerRejection(ctx, c, r)
}

// answerRejection sends r's task_rejected (refuse: with a task_failed
// when the caller may hold an acceptance).
func (s *Sidecar) answerRejection(ctx context.Context, c *command, r rejection) {
	pub, err := s.rejectedPublishing(c.sid, c.msgID, r.at, r.code, r.msg)
	if err != nil {
		c.log.Error(err, "Failed to build task_rejected")
		s.settle(c.d, true, false)
		return
	}
	s.refuse(ctx, c, pub, r.at, r.code, r.msg)
}

// rejectedBefore answers a copy of a task this replica rejected without a
// record, or accepted and could not record, with the same replies; it
// reports false if it knows of none.
func (s *Sidecar) rejectedBefore(ctx context.Context, c *command) bool {
	v, ok := s.rejections.Get(c.sid)
	if !ok {
		return false
	}
	r := v.(rejection)
	c.log.V(1).Info("A task answered before without a record; answering again with the same replies", "reasonCode", r.code)
	if r.accepted != nil {
		s.answerNotRecorded(ctx, c, r, true)
	} else {
		s.answerRejection(ctx, c, r) // not counted again: a copy
	}
	return true
}
