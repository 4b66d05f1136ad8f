// Package session implements HCP layer 2 (session and lifecycle) as plain Go
// with no Kubernetes imports: the session state machine, the standard event
// types and their validation, the caller-side sequence tracker (dedup,
// ordering, gap handling) and the callee-side sequencer.
//
// # State machine
//
// The transition table is exactly the specification's (see [Transitions]);
// nothing is added. Terminal states (REJECTED, ABORTED, COMPLETED, FAILED)
// never reopen. Situations the table does not cover are handled by callers
// as follows (this is the behaviour of the hcp-sidecar):
//
//   - Timeout while PAUSED: there is no PAUSED→FAILED edge. The callee
//     resumes (PAUSED→RUNNING, reason "timeout") and then fails
//     (RUNNING→FAILED, reason "timeout"), emitting both state_changed events.
//   - Harness failure or timeout while ABORTING: there is no ABORTING→FAILED
//     edge. Abort cleanup is bounded by the callee's abort timeout, after
//     which the session becomes ABORTED regardless (the reason says so).
//   - Completion or failure reported while ABORTING: the abort wins; the
//     session ends ABORTED and the late result is not forwarded.
//   - Abort while PENDING: not possible on the wire (an abort must carry the
//     session token, which is issued only on acceptance). An internal error
//     while PENDING ends the session REJECTED (reason internal or
//     harness_unavailable).
//   - A repeated abort while ABORTING or after a terminal state is a no-op,
//     not a transition.
//
// # Events
//
// Event types form a closed set (the nine standard types): an event_type
// outside it is rejected on the wire, and the harness API accepts only the
// types a harness may emit (see [EventType.HarnessEmittable]); lifecycle
// events are produced by the sidecar. Applications with custom event data
// use intermediate_result (result_type names the kind) or log/warning
// details. Unknown fields inside data are ignored (tolerant reader).
//
// # Sequences
//
// The callee numbers events per session from 1 with a [Sequencer]; the
// caller runs each session's deliveries through a [Tracker], which
// deduplicates redeliveries, reorders within a bounded buffer, reports gaps
// and gives up on a gap that never fills ("log a warning and continue", as
// L2 says). The caller's last_processed_sequence advances only when the
// application has processed an event ([Tracker.Commit]) and can be persisted
// through a [Store].
package session
