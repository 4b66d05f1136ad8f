// Package caller is the hcp-sidecar's caller mode: it submits tasks for a
// local app, consumes the caller's event queue hcp.evt.{callerID}, and
// hands every event to the app over HTTP once and in order per session
// (DESIGN.md section 5; L1 "Stream Continuity", L2 "Integration with L1
// Stream Continuity"). docs/harness-api.md ("Caller side") and
// docs/openapi/caller-sidecar.yaml describe the app's side.
//
// # App API
//
// App → sidecar (Handler): POST /hcp/v1/tasks, GET /hcp/v1/tasks[/{id}],
// POST /hcp/v1/sessions/{id}/abort, GET /hcp/v1/sessions[/{id}].
// Sidecar → app: POST {HCP_HARNESS_URL}/hcp/v1/events, one message at a
// time per session, sessions concurrently; a 2xx means processed.
//
// # Delivery pipeline
//
// The transport calls the consumer handler for each delivery from one
// goroutine. The handler decodes and validates envelope, AMQP properties,
// routing key and payload, checks that the broker-validated user_id is a
// callee of this vhost, and hands the message to its session's worker.
// Malformed messages and unauthenticated senders are acked, logged and
// counted: redelivering them cannot make them valid. The worker checks that
// the sender is the session's callee (from the task it submitted, the
// task_accepted, or the HCPSession), runs events through a session.Tracker
// (dedup of sequence <= last_processed_sequence, reorder buffer, gap
// detection), gives a gap up only when it is known to be gone (see "Gaps"
// below), and delivers one message at a time.
//
// Per session, delivery to the app is strictly one message at a time, in
// sequence order; persisting and acking are pipelined behind it. On the
// app's 2xx for event k:
//
//  1. the session's tracker advances last_processed_sequence to k in memory,
//     so event k+1 is POSTed at once, without waiting for a disk write;
//  2. the session record (last_processed_sequence = k) is queued in the
//     store (Store.RecordSession), which group-commits: one write+fsync
//     covers every record queued since the previous one, of every session
//     (several updates of one record in a batch are written, and encoded,
//     once). A batch lingers Options.CommitLinger (5 ms) from its first
//     record so that a steady stream's events share an fsync (at 1,000
//     events/s about five to one, instead of one each), then goes with the
//     next record queued (no timer wakes the process for it; twice the
//     linger when none comes); it is written at once when half the
//     prefetch window is unsettled (lingerCap), when something waits for
//     it (answers, submits, a stop: Ticket.Wait), or when a duplicate's
//     ack waits for it;
//  3. the deliveries of every session that a group commit covers are acked
//     together right after its fsync returns (Sidecar.ackAfter), with as
//     few frames as is safe (transport.AckAll: those below every other
//     unsettled delivery of the channel in one basic.ack with
//     multiple=true, the rest one by one).
//
// So an ack never precedes the durable record of its sequence, and an ack
// lost with the connection can only cause a redelivery that the tracker
// (in memory) or the store (after a restart) recognises. Deliveries of
// different sessions interleave on the one channel, and an earlier tag of
// another session may not be durable yet: a multiple=true ack never covers
// a delivery that is still unsettled. A redelivered duplicate of an event whose own ack still waits for its
// fsync is acked after that fsync too. Each tracker's last_processed leads
// the store by at most one group commit; on restart the store's value is
// the starting point. Messages without a sequence (task_accepted,
// task_rejected, task_completed, task_failed) are rare and are still
// written synchronously (the write waits for its fsync) before their ack.
// The worker waits for its pending fsyncs and acks before it exits
// (graceful stop, idle).
//
// # Per-session isolation
//
// All sessions share one consumer and its prefetch window. A session that
// cannot deliver (its app fails its messages, or it waits for a gap to
// fill) holds at most half the window (Sidecar.holdCap): further events of
// it are returned to the queue after a second (Sidecar.release; metric
// hcp_sidecar_released_total) instead of being taken, so the other sessions'
// messages keep flowing, and the event that fills the session's gap is never
// returned. The session's head stays held in place, so nothing is delivered
// out of order; the worker remembers the returned sequences, waits for them
// instead of skipping them as a gap (for up to releaseHorizon), and anchors
// a terminal message after them. TestPoisonedSessionDoesNotStallOthers
// shows a session whose app always fails next to a healthy one: the healthy
// one completes, and once the app recovers the other completes too, in
// order, nothing twice.
//
// # Gaps
//
// The callee sidecar marks every event with envelope.HeaderConfirmedThrough:
// the sequence up to which the broker had confirmed the session's events
// when this one was published. Those were in the queue ahead of it; a
// missing one among them that this sidecar did not release itself is gone
// from the queue (TTL, overflow, a delivery limit, a lost callee pod, or a
// previous pod of this caller delivered it), and is given up at once
// (stream.resolveGap). Every other gap is an unconfirmed publish that the
// callee republishes until it is confirmed, so it is waited for whatever
// the time; GapTimeout only logs a warning then. Senders that do not mark
// their events get L2's "log a warning and continue" after GapTimeout. The
// next event delivered carries the range given up (AppMessage.Lost).
// While a session waits, the events that fill its gap are never released
// (stream.fillsGap), and releases are immediate (releaseDelay).
//
// Messages without an L2 sequence take their place in the session's stream
// from their position in the queue: task_accepted and task_rejected before
// every event, task_completed and task_failed after every event that was
// queued before them (the callee sidecar publishes them just before its
// session_closed event). They are deduplicated through the task and session
// records.
//
// # Failures, and why nothing is nacked
//
// A message the app fails (non-2xx, timeout) is retried in place with
// exponential backoff (AppBackoff), its delivery held unacked, and the
// session's later events wait behind it, until the app has refused an event
// MaxAttempts times: then it is dead-lettered (poison.go). It is not nacked with requeue:
// RabbitMQ puts a nacked quorum-queue message at the back of the queue
// (measured on 3.10.8), after every message already queued, so the
// session's later events would arrive first, fill the reorder buffer and
// the prefetch window, and the gap could only be skipped: a lost event. An
// unacked delivery, on the other hand, keeps its place: when its channel
// closes (reconnect, crash, the broker's consumer timeout) the broker
// returns every unacked message to the head of the queue, in order.
//
// For the same reason shutdown never nacks and the transport must drain
// without basic.cancel (transport.Options.DrainWithoutCancel): RabbitMQ
// puts the messages in transit at the moment of a basic.cancel at the back
// of a quorum queue. On stop the worker finishes the app request in
// progress, delivers what it already holds for up to DrainTimeout, and
// leaves the rest unsettled for the channel close to return in order.
//
// # Stopping: Drain and a graceful stop
//
// Drain (the pod is being deleted: the preStop hook calls it before the app
// gets SIGTERM) and the end of Run's ctx run one sequence (stop), each step
// idempotent:
//
//  1. nothing more is handed to the session workers (dispatch leaves new
//     deliveries unsettled, still on the open channel);
//  2. each worker finishes the app request in progress and what it already
//     holds (up to DrainTimeout), waits for the fsync that covers it, acks,
//     records its position in the status writer, and exits;
//  3. every position recorded (Sidecar.positions) is written and flushed
//     to its HCPSession, retried with backoff until it lands or the ctx
//     ends (Drain's own; FlushTimeout at a graceful stop);
//  4. only then is the consumer stopped: the channel closes without
//     basic.cancel and the broker hands the unsettled rest, in order, to the
//     next consumer (the event queue is single-active-consumer, so a standby
//     pod takes over exactly now), which finds each HCPSession exact.
//
// After Drain the sidecar is not ready and delivers nothing but still
// serves and republishes submits; Run returns when its ctx ends.
//
// # Durable state and which copy is authoritative
//
// A session's position (last_processed_sequence) has two durable copies:
//
//   - the local store (HCP_STATE_DIR; see Store: a CRC-checked journal with
//     group-committed fsync and atomic compaction), an emptyDir: it survives
//     a container restart, not a pod replacement. Every ack waits for the
//     fsync of the record it depends on. While a pod runs, it is the
//     deduplication source;
//   - the HCPSession's status.callerAckedSequence: the highest sequence
//     acked after its fsync, written through the coalescing status writer at
//     most once per Options.StatusInterval (default 5 s, coarser than the
//     callee sidecar's 1 s: both sidecars write the same object), 200 ms
//     after the session's last message (session_closed) is durable, so a
//     session shorter than the interval costs one write (after the callee
//     sidecar's terminal status, not racing it), and exactly at Drain and
//     at a graceful stop (see above). It survives the pod.
//
// Both are positions the app has processed (2xx) and the sidecar recorded,
// so neither is ever ahead of the app: resuming from either can redeliver,
// never lose. Which one a session worker starts from (stream.seed):
//
//   - no local record of the session, and not a task of this store (a new
//     pod, a lost state directory): the HCPSession, read before anything of
//     the session is delivered, through Options.Reader (uncached: a cache
//     may not have seen the previous pod's last write yet); if the API
//     server cannot be reached, a cached copy (older, so lower: safe); with
//     neither, the session is held (nothing delivered or acked, its further
//     deliveries returned to the queue past its share of the window) and the
//     read retried with backoff until it succeeds, however long the outage
//     (SeedTimeout only logs a warning): never delivered unverified, never
//     dropped. Not in this namespace, the HCPSession is read by name in
//     each namespace of its Caller's status.sessionNamespaces, where the
//     operator lets the sidecar get HCPSessions (a Callee in another
//     namespace keeps its sessions there; findElsewhere), and, through
//     Options.StatusIn, may record its position there: callerAckedSequence
//     is kept in either namespace alike; a refusal there (Forbidden) holds
//     the session like an outage.
//     The callee and task come from its spec (the session is verified, its
//     task adopted: adoptTask); a session whose HCPSession names another
//     caller is refused (ReasonForeignSession), and so is one with no
//     HCPSession in any of those namespaces (ReasonUnsolicitedSession);
//   - a local record: the higher of the record and the HCPSession (one
//     best-effort read, stream.refresh). The HCPSession can only be higher
//     when another pod of this caller delivered the session meanwhile: with
//     several replicas the queue's single active consumer moves between live
//     pods when a connection drops. A record higher than the HCPSession is
//     written back with the next report. A worker that follows one of this
//     pod that exited idle (Options.WorkerIdle) while the consumer channel
//     it delivered from still lives reads nothing: the active consumer
//     moves only when its channel goes, so nobody else delivered the
//     session meanwhile (parkedWorker).
//
// callerAckedSequence is written only when the HCPSession is readable in the
// sidecar's own namespace and names this caller. Sessions live in the
// callee's namespace, which the status writer (bound to the sidecar's
// namespace) does not write: for a Callee in another namespace the
// guarantee falls back to the local store alone (exact across a container
// restart; a new pod finds the session through findElsewhere and starts it
// from scratch: the first event is delivered with Lost and copies of events
// the previous pod delivered that are still queued are delivered again).
// A session whose HCPSession is not found yet (a cached
// client may not have seen it) keeps its sequence and retries on its next
// ack and tick, and re-reads the HCPSession at its terminal message, at
// stop and before its worker exits, so the final value lands.
//
// What a pod move does not cover: a pod lost without a graceful stop leaves
// the HCPSession up to StatusInterval behind (the events acked after it are
// gone from the queue, so the new pod sees the next one after a gap, which
// its mark shows is not in the queue: delivered at once with Lost and
// counted gap_skipped though the app has them; copies republished by the callee in that window can be delivered
// again); messages without a sequence are deduplicated by local records
// only (at least once across a move: the app deduplicates on message_id);
// the session token (for abort) is in the local store only.
//
// The one window no acknowledgement protocol closes without the app: the
// app has processed an event (its 2xx is on the wire) and the sidecar
// process dies before the fsync that covers it. The event is delivered
// again after the restart, with redelivered=true in the body; an app whose
// processing is not idempotent deduplicates on (session_id, sequence) or
// message_id for such deliveries. With the pipeline the window holds the
// events the app answered during one group commit's linger and fsync and
// the batch gathered behind it (at 1,000 events/s about five to ten; the
// linger ends once half the prefetch window is unsettled), and never more than
// the prefetch count in all, since each of them is an unacked delivery.
// TestCrashBeforeCommitRedelivers and
// TestCrashAfterCommitBeforeAckDeduplicates kill a sidecar process on
// either side of the commit. A graceful stop, a lost or cut broker
// connection and a broker restart never open that window: the request in
// progress finishes, and the store's pending writes are fsynced (on stop,
// before the worker exits; on a lost connection, the redelivered copy is
// recognised in memory and acked only after that fsync).
//
// # Submitting
//
// A task_submit is written to the store (with its encoded envelope) before
// it is published, persistent and confirmed, with user_id set. Until a
// task_accepted or task_rejected arrives it is republished with the same
// message_id and the identical body, with exponential backoff
// (SubmitRetry), a bounded number of times; pending submits survive a
// restart. The session id the callee will use is known at submit time
// (topology.SessionID), so every event of the session can be checked
// against the callee the task was sent to.
//
// Across a pod move the envelopes of pending submits are lost with the
// state directory. A task the previous pod submitted is adopted from its
// HCPSession (named topology.SessionID(callee, caller, message_id); the callee
// creates it when it decides the task, before answering): when the first
// message of its session arrives, when the app asks GET /hcp/v1/tasks/{id},
// or when the app posts the same message_id again (answered with the known
// task instead of a second publish). Its answer is then recognised and
// verified. An adopted task is never republished. Not covered: a submit
// the callee has not decided yet is unknown to the new pod (a confirmed
// publish is in the callee's durable command queue and will be answered; an
// unconfirmed one the app posts again with the same message_id, which the
// callee deduplicates).
//
// # Where things are
//
// One type owns a session's delivery: stream (stream.go), the session's
// worker, with a goroutine only while it holds something (sleep.go). Each
// step of the pipeline, receive → order → deliver → commit (journal) →
// settle (ack), is a method of it, in a file per step. It stays one type
// because the steps hand one state on to each other (the tracker, the
// ready events, the barriers, the latest group commit) on the one
// goroutine that runs them: there is no lock to split it along. The
// Sidecar's maps (streams, lookups, positions, answered) share its one
// mutex; they stay fields of the Sidecar rather than types of their own,
// since splitting them would change the locking.
//
//	doc.go          this map
//	options.go      Options and their defaults, RetryPolicy, Backoff
//	sidecar.go      the Sidecar, New, Ready
//	run.go          Run, Drain and the stop sequence; housekeeping
//	consume.go      a delivery from the queue: decode, check the sender, dispatch to its session's stream
//	stream.go       stream: the owner of a session's delivery, its loop, its drain and exit
//	sleep.go        stream: a worker with nothing to do ends its goroutine; the sweeper wakes it to exit
//	receive.go      stream: take a message in (refused sessions, the callee check, answers and results as barriers)
//	order.go        stream: sequence order through the tracker; gaps and their timeouts
//	deliver.go      stream: POST to the app in order, one message or a batch, retried with backoff
//	commit.go       stream: what the app took, into the tracker and the session and task records
//	settle.go       acks and nacks, once each; acks that wait for a group commit, one frame per commit
//	window.go       sharing the prefetch window: releases to the queue, hand-backs, what the dispatcher sees of a stream
//	seed.go         stream: a session's starting point, from its local record or its HCPSession (held while unverifiable)
//	fence.go        stream: owner epochs (stale owners refused) and same-sequence bodies (contradictions)
//	poison.go       dead letters: events the app refuses, the bound on gap waits
//	position.go     callerAckedSequence: recorded through the status writer, written at a stop
//	hcpsession.go   reading HCPSessions: uncached and cached reads, the lookup cache
//	adopt.go        tasks an earlier pod of this caller submitted, learnt from their HCPSessions
//	submit.go       task_submit: record, publish, republish; abort
//	api.go          the app API's HTTP handlers and views
//	app.go          calls to the app: one message, a batch, the app's batch offer
//	appstream.go    stream delivery to the app: one long-lived NDJSON request, acks read as they come
//	appstreamopen.go opening the stream: on a direct connection, or through net/http
//	appconn.go      direct keep-alive connections to the app, written and read by the session worker
//	appresp.go      the app's answers on those connections: plain ones read in place, the rest by net/http
//	appjson.go      the app message's JSON and the stream's delivery line, built without reflection
//	store.go        Store: tasks and sessions in memory, reads and durable updates
//	records.go      TaskRecord and SessionRecord
//	journal.go      the Store's journal: line format, group commit and its linger, compaction
//	recordjson.go   a session record's journal line, built without reflection
//	ticket.go       Ticket: the completion of one group commit, and hurrying it
package caller
