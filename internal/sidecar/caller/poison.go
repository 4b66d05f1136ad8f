package caller

import (
	"errors"
	"fmt"

	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Poison and limits.
//
// An event the app refuses Options.MaxAttempts times in a row (an answer
// other than 2xx, or none within AppTimeout) is dead-lettered: its delivery
// is rejected without requeue, so the broker moves it through the event
// queue's dead-letter exchange into the Caller's dead-letter queue
// (topology.DeadLetterQueue), with RabbitMQ's x-death header saying where
// it came from. The session goes on: its position moves past the event
// (written, and fsynced, before the reject), and the next event delivered
// to the app announces it in lost (reason dead_lettered), as for any other
// gap. Answers and results (task_accepted, task_completed, ...) are never
// dead-lettered: they are retried until the app takes them.
//
// Events held back behind a gap go round the queue (released, handed back)
// while the session waits for the gap to fill; the wait is bounded by
// Options.MaxGapWait (default 10 minutes), after which the gap is given up
// (Lost reason gap_wait_limit) and the events behind it are delivered. A
// broker delivery limit (x-delivery-limit, an operator policy, RabbitMQ 4's
// default of 20) that drops one of them meanwhile does not drop it
// silently: the queue's dead-letter exchange puts it in the Caller's
// dead-letter queue, and the session gives up waiting for it after
// releaseHorizon (announced as lost).

// LostDeadLettered: the app refused the event Options.MaxAttempts times; it
// is in the Caller's dead-letter queue.
const LostDeadLettered = "dead_lettered"

// LostGapWaitLimit: a gap held later events back for Options.MaxGapWait.
const LostGapWaitLimit = "gap_wait_limit"

// Dead-letter reasons (metric hcp_sidecar_dead_letters_total).
const (
	DeadLetterMaxAttempts = "max_attempts"
)

// refusal is an error of the app: it answered other than 2xx, or not in
// time. Reaching it failed is not a refusal.
type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

func isRefusal(err error) bool {
	var r refusal
	return errors.As(err, &r)
}

// deadLetter gives up on e, the event at the head of the session, which the
// app refused every time: its position is recorded as processed (the
// tracker, and the session record, fsynced), then its delivery is rejected
// without requeue (the broker dead-letters it), counted, logged and
// reported with a Warning Event. The next event delivered announces it.
func (w *stream) deadLetter(e session.Entry[*item]) {
	seq, it := e.Seq, e.Item
	if err := w.tracker.Commit(seq); err != nil {
		w.log().Error(err, "Tracker refused a commit")
	}
	if w.lost == nil || w.lost.To < seq-1 {
		w.lost = &Lost{From: seq, Reason: LostDeadLettered}
	}
	w.lost.To = seq
	if w.lost.Reason != LostDeadLettered {
		w.lost.Reason = LostDeadLettered
	}
	now := w.s.clk.Now()
	_, t := w.s.store.RecordSession(w.id, func(r *SessionRecord) bool {
		r.LastSeq = max(r.LastSeq, seq)
		w.fillRecord(r)
		r.UpdatedAt = now
		return true
	})
	w.lastTicket = t
	t.Then(func(err error) {
		if err != nil {
			w.log().Error(err, "Failed to persist the position past a dead-lettered event; rejecting it anyway", "sequence", seq)
		}
		w.s.reject(it)
		raise(&w.acked, seq)
	})
	w.s.m.DeadLetters.WithLabelValues(DeadLetterMaxAttempts).Inc()
	dlq := topology.DeadLetterQueue(w.s.queue)
	w.log().Info("WARNING: dead-lettered an event the app refused every time; the next event announces it as lost",
		"sequence", seq, "attempts", w.s.o.MaxAttempts, "deadLetterQueue", dlq, "messageID", it.env.MessageID)
	w.s.warn(w.id, EventDeadLettered, fmt.Sprintf("Session %s: the app refused event %d %d times; it was moved to %s and the session goes on",
		w.id, seq, w.s.o.MaxAttempts, dlq))
}

// reject nacks it without requeue, once: the broker dead-letters it
// through its queue's dead-letter exchange.
func (s *Sidecar) reject(it *item) {
	if !s.markSettled(it) {
		return
	}
	if err := it.d.Nack(false, false); err != nil {
		s.log.V(1).Info("Could not reject a delivery; the broker redelivers it", "error", err.Error())
	}
}
