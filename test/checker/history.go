// Package checker judges a chaos run from an independent history, the way
// Jepsen does: what was published on the wire, what the harnesses
// executed, and what the caller's app received are recorded by observers
// outside the system under test, and the checker compares them with a
// model of what HCP promises. Nothing here reads the sidecars' own
// counters, so a sidecar that miscounts cannot hide a violation.
//
// The model (docs/reliability.md, docs/durable-sessions.md):
//
//   - one body per (session, sequence) on the wire: a second body under a
//     sequence already used is a contradiction, whoever published it;
//   - the app receives a session's events in strictly increasing sequence,
//     each once, each one that was published, never one from a lower owner
//     epoch after one from a higher; a gap is allowed only where the next
//     event announces a recovery (L2 allows a gap on recovery);
//   - at no instant do two pods execute steps of the same session;
//   - every step runs at least once (for a session that completed), and a
//     step runs again only after a recovery that resumed from a checkpoint
//     before it, once per such recovery;
//   - every session ends in exactly one terminal state, seen the same by
//     the wire, the app and the HCPSession.
package checker

import "time"

// Message is one HCP message of a session: as published (recorded by a
// tap queue bound to the events exchange) or as delivered to the app.
type Message struct {
	Session string
	Seq     int64
	// Epoch is the publisher's owner epoch (the hcp-owner-epoch header);
	// 0 when absent. Only published messages need it.
	Epoch int64
	// Type is the L2 message type (event, state_changed, task_completed…).
	Type string
	// Digest identifies the body: the same digest is the same body.
	Digest string
	// Reason is a state_changed's reason (recovered_from_checkpoint…).
	Reason string
	// Final is the terminal state the message announces (COMPLETED,
	// FAILED, ABORTED, REJECTED; L2), "" for any other message.
	Final string
	// Closes marks the last message of a session's stream (session_closed,
	// or the task_rejected of a task that never ran): nothing may follow.
	Closes bool
	// Publisher names who published it (the broker's user-id, or the pod).
	Publisher string
	At        time.Time
}

// Step is one execution of one step of a session's task by a harness, as
// the harness appended it to a log outside its pod.
type Step struct {
	Session    string
	Step       int
	Pod        string
	Start, End time.Time
}

// Recovery is a resumption of a session from a checkpoint: the steps after
// AfterStep may run again, once.
type Recovery struct {
	Session   string
	AfterStep int
	At        time.Time
}

// History is everything the observers recorded in one run.
type History struct {
	Published  []Message
	Delivered  []Message // in the order the app received them
	Steps      []Step
	Recoveries []Recovery
	// Terminal is each observer's view of how each session ended: observer
	// ("callee", "app", "hcpsession") → session → state ("" when none).
	Terminal map[string]map[string]string
	// Completed names the sessions the task finished (every step ran).
	Completed map[string]int // session → number of steps of its task
}

// Violation is one broken promise.
type Violation struct {
	Kind    string // contradiction, gap, duplicate, phantom, stale-epoch, reorder, overlap, lost-step, extra-run, terminal
	Session string
	Detail  string
}

func (v Violation) String() string { return v.Kind + " " + v.Session + ": " + v.Detail }

// RecoveryReason is the state_changed reason that announces a gap.
const RecoveryReason = "recovered_from_checkpoint"
