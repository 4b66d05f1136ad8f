// Package callee is the hcp-sidecar's callee mode: it consumes the callee's
// command queue, runs the L3 gate on every task_submit, creates and drives
// the HCPSession of each admitted task, hands the task to the harness over
// the local HTTP API, relays the harness's events to the caller with
// strictly increasing sequence numbers, and enforces the L2 state machine,
// timeouts and aborts. See docs/harness-api.md for the harness side.
//
// # Exactly-once over at-least-once
//
// The HCPSession named after topology.SessionID(calleeID, callerID,
// message_id) is the dedup record, shared by every replica and surviving
// restarts; AlreadyExists on its create means "duplicate". A duplicate is
// answered with the original reply rebuilt from the stored object: the
// same envelope message_id and timestamp, the same reason for a
// rejection, and for an acceptance the same session token (Ed25519
// signatures are deterministic, and every claim comes from the object's
// immutable part: iat is spec.issuedAt, the task_submit's timestamp, or
// for older sessions the creationTimestamp; exp adds spec.maxDuration; see
// sessionClaims). A command is acknowledged only once its reply is
// confirmed by the broker (and, for an acceptance, its record created).
//
// An admission no concurrency limit applies to is answered before its
// record exists (accept.go): everything task_accepted holds derives from
// the task_submit, so a copy decided on any replica, also after a crash
// between the reply and the create, gets the same answer byte for byte;
// the task reaches the harness only once the create succeeded, and a
// create that fails ends the session (task_failed session_not_recorded).
// A refusal of a task whose caller may hold such an acceptance (the
// command was delivered before) comes with a task_failed that ends it.
//
// Under a concurrency limit the HCPSession is created first, as an
// undecided claim (no status, label hcp.io/state PENDING, the deciding pod
// in AnnotationDecidingPod), and the decision is the next write,
// optimistic-locked: RUNNING, or REJECTED when the concurrency recount
// refuses it (a task the gate refuses outright gets no HCPSession:
// rejectUnrecorded), so exactly one processor of a task_submit (the
// original, a redelivery on another replica, or the recovery of a crashed
// replica) decides it. The task reaches the harness only after RUNNING is
// stored, so no crash can make two harnesses run one task.
//
// # Where things are
//
// One type owns a session's lifecycle: sess (session.go), with its L2
// machine. Every state change goes through its lifecycle methods; the
// other files are the ways into it.
//
//	doc.go          this map
//	callee.go       Options, New, the Sidecar
//	run.go          Run: consume, then drain and shut down
//	submit.go       a command from the queue: decode, route, the task_submit entry
//	decide.go       the L3 decision, the exact concurrency count, recording it before the answer
//	accept.go       an admission answered before its record: reply, create, start; a failed create
//	record.go       the HCPSession of a decision, conditional status writes
//	duplicate.go    a task_submit seen before (redelivery, another replica)
//	reject.go       refusals without a record, remembered for copies
//	reply.go        task_accepted/task_rejected: build, publish, settle the delivery; the token's claims
//	gate.go         who sent a task_submit, and decoding it (the L3 gate itself is policy.Gate)
//	poison.go       a command whose processing panicked; dead-lettering
//	session.go      sess: the owner of one session, its registry and lock
//	lifecycle.go    sess: start, transitions, terminal outcomes, abort, timeouts
//	terminal.go     sess: the terminal record, written before the end is published
//	publish.go      sess: sequencing, the write-ahead log, publishing, confirms
//	ceiling.go      sess: the sequence ceiling, reserved in blocks
//	session_api.go  sess: what the harness API asks of a session
//	api.go          the harness API's HTTP handlers
//	harness.go      calls to the harness: hand-over, resume, the watchdog
//	own.go          ownership and fencing (the pod's Lease)
//	epoch.go        owner epochs: claims, the hcp-owner-epoch header, losing a session
//	adopt.go        re-adopting sessions from the log, taking over lost ones
//	resume.go       resuming a task from its checkpoint; a re-adopted session's task
//	ckptbind.go     verifying a stored checkpoint before a takeover resumes it
//	drain.go        handing sessions over when the pod goes away
//	abort.go        aborts from the caller and from the HCPSession (spec.abortRequested)
//	recovery.go     sessions of vanished pods
//	keys.go         the token keys, following the mounted Secret
//	events.go       the reasons of the Kubernetes Events
//	trace.go        the trace context of sessions
package callee
