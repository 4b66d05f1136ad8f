package caller

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// accept takes one message into the session's stream.
func (w *stream) accept(it *item) {
	// A callee rejects without a record (no HCPSession): a task the
	// previous pod of this caller submitted, rejected after the move, is
	// let in alone; the rest of the session stays refused.
	if w.refused != "" && (w.refused != ReasonUnsolicitedSession || !w.rejectionOfOurs(it)) {
		w.s.m.Rejects.WithLabelValues(w.refused).Inc()
		w.log().Info("WARNING: dropped a message of a session that is not this caller's", "reason", w.refused, "sender", it.sender, "type", it.env.Type,
			"messageID", it.env.MessageID)
		w.s.settle(it, true)
		return
	}
	w.checkChannel(it.dctx)
	if !w.verify(it) || !w.fence(it) {
		return
	}
	switch it.env.Type {
	case envelope.TypeEvent:
		w.offer(it)
	case envelope.TypeTaskAccepted:
		w.onAccepted(it)
	case envelope.TypeTaskRejected:
		w.onRejected(it)
	case envelope.TypeTaskCompleted, envelope.TypeTaskFailed:
		w.onTerminal(it)
	}
}

// rejectionOfOurs reports whether it is a task_rejected whose session id is
// the one its sender would give a task of this caller with that message id
// (topology.SessionID): a rejection of a task sent by this caller, though
// this pod has no record of it. The sender is a callee of the vhost
// (checked on arrival); no session follows a rejection, so nothing else of
// the session is let in.
func (w *stream) rejectionOfOurs(it *item) bool {
	return it.rejected != nil && strings.EqualFold(w.id, topology.SessionID(it.sender, w.s.cfg.ID, it.rejected.TaskMessageID))
}

// checkChannel notices that the deliveries held came from a channel that is
// gone: buffered ones can no longer be acked and the broker redelivers them,
// so they are dropped (a copy held back would otherwise make the tracker
// call the live redelivery a duplicate and have it acked).
func (w *stream) checkChannel(dctx context.Context) {
	if w.lastDctx != nil && w.lastDctx != dctx && w.lastDctx.Err() != nil {
		w.dropStale()
	}
	if dctx != nil {
		w.lastDctx = dctx
	}
}

func (w *stream) dropStale() {
	dropped := w.tracker.Reset()
	live := 0
	for _, e := range dropped {
		if !e.Item.stale() {
			// Cannot happen (all held deliveries share one channel); if it
			// did, leaving it unsettled would stall the window.
			w.s.settle(e.Item, false)
			live++
			continue
		}
		w.s.forget(e.Item)
	}
	if len(dropped) > 0 {
		w.log().V(1).Info("Dropped buffered events of a closed channel; the broker redelivers them", "count", len(dropped), "live", live)
	}
	w.gapSince = time.Time{}
}

// verify checks that it comes from the session's callee. The callee is
// known from, in order: this session's record, the task the message
// answers, the task whose expected session this is, the HCPSession in the
// sidecar's namespace. A session nothing names (the local state was lost)
// is bound to its first sender, with a warning.
func (w *stream) verify(it *item) bool {
	expected, source := w.expectedCallee(it)
	if expected == "" {
		w.callee, w.unverified = it.sender, true
		w.log().Info("WARNING: no task, task_accepted or HCPSession names this session's callee; bound it to the first sender",
			"callee", it.sender, "type", it.env.Type)
		return true
	}
	if expected != it.sender {
		w.s.m.Rejects.WithLabelValues(ReasonSpoofedSender).Inc()
		w.log().Info("WARNING: dropped a message from a callee that is not the session's", "sender", it.sender,
			"callee", expected, "learntFrom", source, "type", it.env.Type, "messageID", it.env.MessageID)
		w.s.settle(it, true)
		return false
	}
	if source != "first-use" {
		w.unverified = false
	}
	w.callee = expected
	if !w.taskLooked {
		w.taskLooked = true
		t, ok := w.s.store.Task(w.taskMessageID)
		if !ok {
			t, ok = w.s.store.TaskForSession(w.id)
		}
		if ok {
			w.taskMessageID, w.capability = t.MessageID, t.Capability
			rec, _ := w.s.store.Session(w.id)
			w.awaitAccepted = t.State == TaskPending && !rec.AcceptedDelivered && !w.s.isAnswered(t.MessageID)
		}
	}
	return true
}

func (w *stream) expectedCallee(it *item) (callee, source string) {
	if w.callee != "" && !w.unverified {
		return w.callee, "session"
	}
	tid := ""
	switch {
	case it.accepted != nil:
		tid = it.accepted.TaskMessageID
	case it.rejected != nil:
		tid = it.rejected.TaskMessageID
	}
	if tid != "" {
		if t, ok := w.s.store.Task(tid); ok {
			return t.CalleeID, "task"
		}
	}
	if t, ok := w.s.store.TaskForSession(w.id); ok {
		return t.CalleeID, "task"
	}
	if l := w.s.lookupSession(w.id, false); l.found && l.calleeID != "" {
		return l.calleeID, "hcpsession"
	}
	if w.callee != "" {
		return w.callee, "first-use"
	}
	return "", ""
}

// onAccepted queues a task_accepted before every event, unless it is a
// duplicate or contradicts a rejection.
func (w *stream) onAccepted(it *item) {
	rec, _ := w.s.store.Session(w.id)
	tid := it.accepted.TaskMessageID
	t, known := w.s.store.Task(tid)
	switch {
	case rec.AcceptedDelivered || (known && t.State == TaskAccepted && t.Delivered):
		w.duplicate(it)
		return
	case known && t.State == TaskRejected:
		w.contradiction(it, "task_accepted for a task already rejected")
		return
	}
	w.s.markAnswered(tid)
	w.taskMessageID = tid
	w.awaitAccepted = false
	if known {
		w.capability = t.Capability
	} else {
		w.log().Info("Received task_accepted for a task this sidecar has no record of (state lost?); delivering it", "task", tid)
	}
	w.addBarrier(envelope.TypeTaskAccepted, 0, it)
}

// onRejected queues a task_rejected before every event, unless it is a
// duplicate or contradicts an acceptance.
func (w *stream) onRejected(it *item) {
	tid := it.rejected.TaskMessageID
	t, known := w.s.store.Task(tid)
	switch {
	case known && t.State == TaskRejected && t.Delivered:
		w.duplicate(it)
		return
	case known && t.State == TaskAccepted:
		w.contradiction(it, "task_rejected for a task already accepted")
		return
	}
	w.s.markAnswered(tid)
	w.taskMessageID = tid
	w.awaitAccepted = false
	if known {
		w.capability = t.Capability
	}
	w.addBarrier(envelope.TypeTaskRejected, 0, it)
}

// onTerminal queues a task_completed or task_failed after every event seen
// so far, and every event released to the queue, unless the session's
// record already has one or a task_rejected waits for the app: the
// task_failed a callee sends after a rejection is its end, already told
// (taken together from a busy worker's inbox, the two are both queued
// before either is delivered).
func (w *stream) onTerminal(it *item) {
	rec, _ := w.s.store.Session(w.id)
	if rec.Terminal != "" || slices.ContainsFunc(w.barriers, func(b *barrier) bool { return b.kind == envelope.TypeTaskRejected }) {
		w.duplicate(it)
		return
	}
	top, _ := w.awaitReleased(0)
	w.addBarrier(it.env.Type, max(w.maxSeen, w.tracker.LastProcessed(), top), it)
}

func (w *stream) duplicate(it *item) {
	w.s.m.Duplicates.WithLabelValues("message").Inc()
	w.log().V(1).Info("Skipped a duplicate", "type", it.env.Type, "messageID", it.env.MessageID)
	w.s.settle(it, true)
}

func (w *stream) contradiction(it *item, why string) {
	w.s.m.Rejects.WithLabelValues(ReasonContradiction).Inc()
	w.s.m.Contradictions.WithLabelValues("answer").Inc()
	w.log().Info("WARNING: dropped a contradictory answer", "why", why, "messageID", it.env.MessageID)
	w.s.warn(w.id, EventContradiction, "Session "+w.id+": "+why+" (message "+it.env.MessageID+"); the first is kept")
	w.s.settle(it, true)
}

// addBarrier queues an unsequenced message. A second copy of one already
// held replaces it and the older copy is acked: if both are live, the newer
// stays unacked until delivered; if the older one's channel is gone, its
// ack fails harmlessly and the live copy is the one kept.
func (w *stream) addBarrier(kind envelope.MessageType, anchor int64, it *item) {
	for _, b := range w.barriers {
		switch {
		case b.kind == kind:
			w.s.m.Duplicates.WithLabelValues("message").Inc()
			w.s.settle(b.item, true)
			b.item = it
			return
		case isTerminal(kind) && isTerminal(b.kind):
			w.contradiction(it, "a second, different terminal message ("+string(kind)+" after "+string(b.kind)+")")
			return
		}
	}
	w.barriers = append(w.barriers, &barrier{kind: kind, anchor: anchor, item: it, since: w.s.clk.Now()})
	slices.SortStableFunc(w.barriers, func(a, b *barrier) int {
		switch {
		case a.anchor < b.anchor:
			return -1
		case a.anchor > b.anchor:
			return 1
		}
		return 0
	})
}
