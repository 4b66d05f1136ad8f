package caller

import (
	"slices"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// fillRecord copies what the worker knows into the record. It runs inside a
// store update, so it must not call the store.
func (w *stream) fillRecord(r *SessionRecord) {
	if w.callee != "" {
		r.CalleeID = w.callee
	}
	r.Unverified = w.unverified
	if w.epoch > r.OwnerEpoch || (w.epoch == r.OwnerEpoch && w.epochFrom != 0) {
		r.OwnerEpoch, r.EpochFrom = w.epoch, w.epochFrom
	}
	if w.taskMessageID != "" {
		r.TaskMessageID = w.taskMessageID
	}
	if r.Capability == "" {
		r.Capability = w.capability
	}
}

// applyEvent folds the lifecycle events into the record's state.
func applyEvent(r *SessionRecord, it *item) {
	switch d := it.eventData.(type) {
	case *session.SessionCreatedData:
		if r.State == "" || r.State == string(session.StatePending) {
			r.State = string(d.State)
		}
		if r.RiskLevel == "" {
			r.RiskLevel = string(d.RiskLevel)
		}
		if r.Token == "" {
			r.Token = d.SessionToken
		}
	case *session.StateChangedData:
		if !session.State(r.State).IsTerminal() {
			r.State = string(d.ToState)
		}
	case *session.SessionClosedData:
		r.State = string(d.FinalState)
		r.Closed = true
	}
}

// commitEvents commits the events of batch, which the app has processed
// (2xx): the tracker advances past them, the session record is queued for
// the next group commit, and their deliveries are acked by the callback
// that runs right after the fsync covering that record. The commit
// lingers (Options.CommitLinger) unless half the prefetch window is
// unsettled (lingerCap).
func (w *stream) commitEvents(batch []session.Entry[*item]) {
	last := batch[len(batch)-1].Seq
	// last_processed_sequence advances in memory now and on disk with the
	// next group commit; the deliveries are acked only once that fsync has
	// returned (see the package documentation, "Delivery pipeline").
	for _, e := range batch {
		if err := w.tracker.Commit(e.Seq); err != nil {
			w.log().Error(err, "Tracker refused a commit")
		}
	}
	now := w.s.clk.Now()
	_, t := w.s.store.RecordSession(w.id, func(r *SessionRecord) bool {
		r.LastSeq = max(r.LastSeq, last)
		w.fillRecord(r)
		for _, e := range batch {
			applyEvent(r, e.Item)
		}
		r.UpdatedAt = now
		return true
	})
	w.lastTicket = t
	for _, e := range batch {
		w.s.m.Latency.Observe(now.Sub(e.Item.env.Timestamp).Seconds())
	}
	items := make([]*item, len(batch))
	for i, e := range batch {
		items[i] = e.Item
	}
	w.s.ackAfter(t, items)
	closes := slices.ContainsFunc(items, func(it *item) bool { _, ok := it.eventData.(*session.SessionClosedData); return ok })
	t.Then(func(err error) {
		if err != nil {
			w.log().Error(err, "Failed to persist last_processed_sequence; acked anyway (after a restart these events may be delivered again)", "upTo", last)
		}
		raise(&w.acked, last)
		if closes {
			w.s.writeFinalPosition(w.id, last)
		}
	})
	if int(w.s.holding.Load()) >= w.s.lingerCap() {
		t.Hurry()
	}
}

// commitBarrier writes, and waits for, the task and session records of
// the unsequenced message b, which the app has processed (2xx); its
// delivery is acked after it returns.
func (w *stream) commitBarrier(b *barrier) {
	it := b.item
	now := w.s.clk.Now()
	var errs []error
	switch b.kind {
	case envelope.TypeTaskAccepted:
		a := it.accepted
		var capability string
		_, err := w.s.store.UpdateTask(a.TaskMessageID, func(t *TaskRecord) bool {
			if t.CalleeID == "" { // no record: nothing to update
				return false
			}
			capability = t.Capability
			t.State, t.SessionID, t.RiskLevel = TaskAccepted, w.id, string(a.RiskLevel)
			t.AnsweredAt, t.Delivered, t.Envelope = now, true, nil
			return true
		})
		errs = append(errs, err)
		_, err = w.s.store.UpdateSession(w.id, func(r *SessionRecord) bool {
			w.fillRecord(r)
			r.TaskMessageID = a.TaskMessageID
			if capability != "" {
				r.Capability = capability
			}
			r.Token, r.TokenExpiresAt, r.RiskLevel = a.SessionToken, a.ExpiresAt.Time, string(a.RiskLevel)
			r.AcceptedDelivered = true
			if r.State == "" {
				r.State = string(session.StateRunning)
			}
			r.UpdatedAt = now
			return true
		})
		errs = append(errs, err)
	case envelope.TypeTaskRejected:
		rj := it.rejected
		_, err := w.s.store.UpdateTask(rj.TaskMessageID, func(t *TaskRecord) bool {
			if t.CalleeID == "" {
				return false
			}
			t.State, t.ReasonCode, t.ReasonMessage = TaskRejected, string(rj.ReasonCode), rj.Message
			t.AnsweredAt, t.Delivered, t.Envelope = now, true, nil
			return true
		})
		errs = append(errs, err)
		_, err = w.s.store.UpdateSession(w.id, func(r *SessionRecord) bool {
			w.fillRecord(r)
			r.TaskMessageID = rj.TaskMessageID
			r.State, r.Terminal = string(session.StateRejected), string(envelope.TypeTaskRejected)
			r.UpdatedAt = now
			return true
		})
		errs = append(errs, err)
	default: // task_completed, task_failed
		_, err := w.s.store.UpdateSession(w.id, func(r *SessionRecord) bool {
			w.fillRecord(r)
			r.Terminal = string(b.kind)
			if !session.State(r.State).IsTerminal() {
				if b.kind == envelope.TypeTaskCompleted {
					r.State = string(session.StateCompleted)
				} else {
					r.State = string(session.StateFailed)
				}
			}
			r.UpdatedAt = now
			return true
		})
		errs = append(errs, err)
	}
	for _, err := range errs {
		if err != nil {
			w.log().Error(err, "Failed to persist a delivered message; acking anyway (after a restart it may be delivered again)", "type", b.kind)
		}
	}
}
