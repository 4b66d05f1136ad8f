package conformance

import (
	"context"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// streamOf is the events of a session that runs and completes: 1
// session_created, 2 PENDING→RUNNING, 3..n-2 progress, n-1
// RUNNING→COMPLETED, n session_closed.
func streamOf(token string, n int64) map[int64]session.EventData {
	evs := map[int64]session.EventData{
		1: &session.SessionCreatedData{State: session.StatePending, RiskLevel: task.R1, SessionToken: token},
		2: &session.StateChangedData{FromState: session.StatePending, ToState: session.StateRunning, Reason: "admitted"},
	}
	for i := int64(3); i <= n-2; i++ {
		pct := float64(i) * 100 / float64(n)
		evs[i] = &session.ProgressData{Stage: "hcp-conformance", Percent: &pct, Message: "step"}
	}
	evs[n-1] = &session.StateChangedData{FromState: session.StateRunning, ToState: session.StateCompleted, Reason: "completed"}
	evs[n] = &session.SessionClosedData{FinalState: session.StateCompleted, Reason: "completed"}
	return evs
}

// complete publishes the end of a completed session: its last
// state_changed, task_completed, then session_closed.
func (s *crun) complete(ctx context.Context, sid string, evs map[int64]session.EventData, n int64) error {
	if err := s.events(ctx, sid, evs, n-1); err != nil {
		return err
	}
	if err := s.k.send(ctx, sid, envelope.TypeTaskCompleted, task.TaskCompleted{Result: []byte(`{"ok":true}`),
		Summary: task.Summary{EventCount: n}}); err != nil {
		return err
	}
	return s.events(ctx, sid, evs, n)
}

// ordered: a task accepted, its stream published with sequence 4 before 3
// and sequence 2 published twice (the same message).
func (s *crun) ordered(ctx context.Context) {
	r := s.r
	ids := []string{AccFirst, OrdInOrder, OrdReordered, DdpOnce}
	notRun := func(err error) {
		for _, id := range ids {
			r.fail(id, "not run: %v", err)
		}
	}
	c, err := s.submit(ctx, "ordered")
	if err != nil {
		notRun(err)
		return
	}
	sid, token, err := s.accept(ctx, c)
	if err != nil {
		notRun(err)
		return
	}
	const n = 7
	evs := streamOf(token, n)
	key2, dup, err := s.k.event(sid, 2, evs[2])
	if err == nil {
		err = s.events(ctx, sid, evs, 1)
	}
	if err == nil {
		err = s.k.publish(ctx, key2, dup)
	}
	if err == nil {
		err = s.events(ctx, sid, evs, 4, 3) // out of order
	}
	if err == nil {
		err = s.k.publish(ctx, key2, dup) // the same message again
	}
	if err == nil {
		err = s.events(ctx, sid, evs, 5)
	}
	if err == nil {
		err = s.complete(ctx, sid, evs, n)
	}
	if err != nil {
		notRun(err)
		return
	}
	werr := s.waitProcessed(ctx, "session_closed of "+sid, func(ps []Processed) bool { return hasClosed(ps, sid) })
	time.Sleep(300 * time.Millisecond) // a late duplicate would show now
	judgeOrdered(r, sid, c.Env.MessageID, dup.MessageId, n, s.d.Processed(), werr)
}

// rejected: a task answered task_rejected.
func (s *crun) rejected(ctx context.Context) {
	c, err := s.submit(ctx, "rejected")
	if err != nil {
		s.r.fail(RjcProcessed, "not run: %v", err)
		return
	}
	sid := s.sessionID(c)
	err = s.k.send(ctx, sid, envelope.TypeTaskRejected, task.TaskRejected{TaskMessageID: c.Env.MessageID,
		ReasonCode: task.ReasonNotAuthorized, Message: "hcp-conformance refuses this task on purpose"})
	if err != nil {
		s.r.fail(RjcProcessed, "publish task_rejected: %v", err)
		return
	}
	id := c.Env.MessageID
	werr := s.waitProcessed(ctx, "task_rejected of "+id, func(ps []Processed) bool {
		for _, p := range ps {
			if p.Type == string(envelope.TypeTaskRejected) && strings.EqualFold(p.TaskMessageID, id) {
				return true
			}
		}
		return false
	})
	if werr != nil {
		s.r.fail(RjcProcessed, "task %s answered task_rejected (not_authorized): %v", id, werr)
		return
	}
	time.Sleep(time.Second)
	for _, cmd := range s.k.commands() {
		if cmd.Env != nil && cmd.Env.Type == envelope.TypeAbort && strings.EqualFold(cmd.Env.Session(), sid) {
			s.r.fail(RjcProcessed, "task %s: the caller sent abort %s for a rejected task", id, cmd.Env.MessageID)
			return
		}
	}
	s.r.pass(RjcProcessed, "task %s: task_rejected not_authorized processed; no command followed for it", id)
}

// unanswered: a task_submit the kit leaves unanswered for RetryWait; the
// caller should republish it with the same message_id (L1:148). The kit
// then rejects it, and the caller must take that late answer.
func (s *crun) unanswered(ctx context.Context) {
	cfg := s.k.cfg
	if cfg.RetryWait <= 0 {
		s.r.skip(SubRetried, "no --retry-wait: give one longer than the caller's answer timeout (this project's sidecar: 30 s)")
		return
	}
	c, err := s.submit(ctx, "unanswered")
	if err != nil {
		s.r.fail(SubRetried, "not run: %v", err)
		return
	}
	id := c.Env.MessageID
	first := time.Now()
	waitCtx, cancel := context.WithTimeout(ctx, cfg.RetryWait)
	again, err := s.k.waitCommand(waitCtx, "a republished task_submit", func(cmds []*Command) *Command {
		for _, x := range cmds {
			if x != c && x.Env != nil && strings.EqualFold(x.Env.MessageID, id) {
				return x
			}
		}
		return nil
	})
	cancel()
	switch {
	case err != nil:
		s.r.fail(SubRetried, "task_submit %s left unanswered for %s: not republished", id, cfg.RetryWait)
	case string(again.D.Body) != string(c.D.Body):
		s.r.fail(SubRetried, "task_submit %s republished with another body: a republish repeats the message", id)
	default:
		took := time.Since(first).Round(100 * time.Millisecond)
		if err := s.k.send(ctx, s.sessionID(c), envelope.TypeTaskRejected, task.TaskRejected{TaskMessageID: id,
			ReasonCode: task.ReasonNotAuthorized, Message: "hcp-conformance answers late, on purpose"}); err != nil {
			s.r.fail(SubRetried, "publish the late task_rejected: %v", err)
			return
		}
		werr := s.waitProcessed(ctx, "the late task_rejected of "+id, func(ps []Processed) bool {
			for _, p := range ps {
				if p.Type == string(envelope.TypeTaskRejected) && strings.EqualFold(p.TaskMessageID, id) {
					return true
				}
			}
			return false
		})
		if werr != nil {
			s.r.fail(SubRetried, "task_submit %s republished %s after the first publish, byte for byte; the late answer: %v", id, took, werr)
			return
		}
		s.r.pass(SubRetried, "task_submit %s republished %s after the first publish, byte for byte; the late task_rejected processed", id, took)
	}
}
