package caller

import (
	"fmt"
	"hash/maphash"
	"math"

	corev1 "k8s.io/api/core/v1"

	"github.com/hcp-io/hcp-operator/internal/sidecar/events"
)

// ReasonStaleOwner counts messages of a session published by a callee
// replica whose owner epoch (envelope.HeaderOwnerEpoch) is lower than one
// this caller has already seen for the session: a replica that lost the
// session (partitioned, paused past its Lease) and still publishes. They
// are acked away, never delivered.
const ReasonStaleOwner = "stale_owner"

// Event reasons of the caller sidecar's Warning Events.
const (
	EventContradiction = "Contradiction"
	EventStaleOwner    = "StaleOwner"
	EventDeadLettered  = "DeadLettered"
)

// bodyWindow bounds how many event bodies (digests) a session worker keeps
// to compare same-sequence copies with.
const bodyWindow = 1024

// bodySeed keys the body digests: a 64-bit keyed hash, not a cryptographic
// one. Two different bodies of one sequence collide by chance once in 2^64
// comparisons, and a sender cannot aim at a collision without the seed,
// which never leaves the process; a digest is 8 bytes, not sha256's 32
// (a busy session keeps up to bodyWindow of them).
var bodySeed = maphash.MakeSeed()

// fence refuses a message of a stale owner: it reports false, after acking
// it away, when it comes from a lower owner epoch than the session's
// highest seen, and is not one its earlier owner may still legitimately
// have in the queue.
//
// Each claim of a session raises its epoch, and the new owner continues the
// sequence above everything its predecessor could use (the sequence
// ceiling, or the exact last sequence of a hand-over). So the earlier
// owner's legitimate events all have a sequence below the lowest one the
// caller has seen from the new epoch (epochFrom): those are accepted
// whatever the order they arrive in (a redelivery after a lost channel, an
// event this caller returned to the queue itself); a lower-epoch event at or
// above epochFrom, a sequence the new owner has sent or will send, is a
// zombie's, and so is a lower-epoch task_completed or task_failed that
// arrives after the higher epoch was seen (the new owner's claim came after
// its predecessor's last publish; answers, task_accepted and task_rejected,
// are never refused). While only unsequenced messages of the
// new epoch were seen, epochFrom is one above the highest sequence seen:
// everything the earlier owner published before the claim is ahead of them
// in the queue.
//
// A raise over an earlier epoch is written to the session record at once
// (one synchronous write per takeover), so that a restarted sidecar still
// knows it; the first epoch of a session (nothing lower can be a zombie of
// a fencing callee) goes with the next record write. The record is in the
// state directory: a new pod of this caller learns the epoch again from the
// first message of the current owner it receives, and until then the
// same-sequence comparison (sameBody) is its guard.
func (w *stream) fence(it *item) bool {
	seq := it.seq()
	switch {
	case it.epoch > w.epoch:
		prev := w.epoch
		w.epoch = it.epoch
		w.epochFrom = w.maxSeen + 1
		if seq > 0 {
			w.epochFrom = seq
		}
		if prev > 0 {
			w.log().Info("The session has a new owner; messages of earlier owners are refused from here on", "ownerEpoch", it.epoch, "previous", prev, "from", w.epochFrom)
			w.persistEpoch()
		}
		return true
	case it.epoch == w.epoch:
		if seq > 0 && seq < w.epochFrom {
			w.epochFrom = seq
			if w.epoch > 1 {
				w.persistEpoch()
			}
		}
		return true
	case seq > 0 && seq < w.epochFrom:
		// The earlier owner's range: legitimately its.
		return true
	case seq == 0 && !isTerminal(it.env.Type):
		// task_accepted / task_rejected: the deciding replica's answer,
		// published before any event of the session; a copy (a redelivery
		// after a lost channel) can come after a later owner's events, and
		// a zombie cannot make a new decision. Their own records
		// deduplicate them.
		return true
	}
	w.s.m.Rejects.WithLabelValues(ReasonStaleOwner).Inc()
	w.log().Info("WARNING: dropped a message of a stale owner of the session (a callee replica that lost it still publishes)",
		"ownerEpoch", it.epoch, "sessionEpoch", w.epoch, "epochFrom", w.epochFrom, "type", it.env.Type, "sequence", seq, "messageID", it.env.MessageID)
	w.s.warn(w.id, EventStaleOwner, fmt.Sprintf("Dropped %s (sequence %d) of session %s from owner epoch %d: the session's owner epoch is %d",
		it.env.Type, seq, w.id, it.epoch, w.epoch))
	w.settleDurable(it)
	return false
}

// persistEpoch writes the session's owner epoch to its record and waits for
// it to be durable.
func (w *stream) persistEpoch() {
	epoch, from, now := w.epoch, w.epochFrom, w.s.clk.Now()
	if _, err := w.s.store.UpdateSession(w.id, func(r *SessionRecord) bool {
		if r.OwnerEpoch == epoch && r.EpochFrom == from {
			return false
		}
		r.OwnerEpoch, r.EpochFrom, r.UpdatedAt = epoch, from, now
		w.fillRecord(r)
		return true
	}); err != nil {
		w.log().Error(err, "Failed to persist the session's owner epoch; it is kept in memory")
	}
}

// sameBody compares an event with the copy of its sequence received first:
// the same body is a duplicate (handled as usual); a different one is a
// contradiction, acked away, counted and reported (false): the first body
// is the one kept, since it is the one the app has or will get first, in
// order. It remembers the body of a sequence seen the first time.
func (w *stream) sameBody(it *item) bool {
	seq := it.seq()
	sum := maphash.Bytes(bodySeed, it.env.Payload)
	if w.bodies == nil {
		w.bodies = map[int64]uint64{}
	}
	first, seen := w.bodies[seq]
	if !seen {
		if len(w.bodies) >= bodyWindow {
			w.pruneBodies()
		}
		w.bodies[seq] = sum
		return true
	}
	if first == sum {
		return true
	}
	w.s.m.Contradictions.WithLabelValues("sequence").Inc()
	w.log().Info("WARNING: two different events with the same sequence; keeping the first, dropping this one",
		"sequence", seq, "ownerEpoch", it.epoch, "messageID", it.env.MessageID, "lastProcessed", w.tracker.LastProcessed())
	w.s.warn(w.id, EventContradiction, fmt.Sprintf("Session %s: two different events with sequence %d (the second from owner epoch %d, message %s); the first is kept",
		w.id, seq, it.epoch, it.env.MessageID))
	w.settleDurable(it)
	return false
}

// pruneBodies forgets the oldest half of the digests.
func (w *stream) pruneBodies() {
	var lo, hi int64 = math.MaxInt64, 0
	for seq := range w.bodies {
		lo, hi = min(lo, seq), max(hi, seq)
	}
	cut := lo + (hi-lo)/2
	for seq := range w.bodies {
		if seq <= cut {
			delete(w.bodies, seq)
		}
	}
}

// warn records a Warning Event about session sid: on its HCPSession when
// this sidecar reads it in its own namespace, otherwise on the Caller (a
// sidecar writes Events in its own namespace only). Without a recorder it
// does nothing; the log and the metric say it anyway.
func (s *Sidecar) warn(sid, reason, msg string) {
	if s.o.Recorder == nil {
		return
	}
	s.mu.Lock()
	l := s.lookups[sid]
	s.mu.Unlock()
	ref := events.Ref("Caller", s.cfg.Namespace, s.cfg.ObjectName, "")
	if l.found && (l.namespace == "" || l.namespace == s.cfg.Namespace) {
		ref = events.Ref("HCPSession", s.cfg.Namespace, sid, l.uid)
	}
	s.o.Recorder.Event(ref, corev1.EventTypeWarning, reason, msg)
}
