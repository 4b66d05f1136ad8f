package conformance

// The check ids of the caller kit (hcp-conformance caller): the kit plays a
// callee and checks the caller under test. TOP-1, TOP-2 and BRK-1 are the
// callee kit's.
const (
	CTopEventQueue = "TOP-6"

	CnsManualAck = "CNS-1"
	CnsPrefetch  = "CNS-2"
	CnsExclusive = "CNS-3"
	CnsHeartbeat = "CNS-4"

	CmdEnvelope        = "CMD-1"
	CmdSessionID       = "CMD-2"
	CmdContentType     = "CMD-3"
	CmdContentEncoding = "CMD-4"
	CmdDeliveryMode    = "CMD-5"
	CmdMessageID       = "CMD-6"
	CmdMirrored        = "CMD-7"
	CmdRouting         = "CMD-8"
	CmdTypes           = "CMD-9"
	CmdUniqueID        = "CMD-10"
	CmdStrictEnvelope  = "CMD-11"
	CmdUserID          = "CMD-12"
	CmdPayloadSchema   = "CMD-13"

	SubPublished = "SUB-1"
	SubRetried   = "SUB-2"
	AccFirst     = "ACC-1"
	RjcProcessed = "RJC-1"

	OrdInOrder   = "ORD-1"
	OrdReordered = "ORD-2"
	DdpOnce      = "DDP-1"
	AckAll       = "ACK-1"

	AbrSession   = "ABR-1"
	AbrToken     = "ABR-2"
	AbrTransient = "ABR-3"

	RcnReconnects = "RCN-1"
	RcnResumes    = "RCN-2"
)

// callerChecks is the caller kit's catalog, in report order.
var callerChecks = []Check{
	calleeChecks[0], calleeChecks[1],
	{CTopEventQueue, "L1:402", "queue hcp.evt.{caller_id} exists and the caller consumes it", prose, spec, "4. If caller: Declare and bind hcp.evt.{caller_id} queue. Start consuming."},

	{CnsManualAck, "L1:199", "the caller's consumer on hcp.evt.{caller_id} acknowledges manually (no_ack false; management API)", must, spec, "no_ack false Manual ACK mode."},
	{CnsPrefetch, "L1:200", "the caller's consumer has a prefetch_count from 1 to 100 (management API)", must, spec, "prefetch_count 1–100 (recommended: 10)"},
	{CnsExclusive, "L1:201", "the caller's consumer is not exclusive (management API)", must, spec, "exclusive false Allows the consumer to reconnect to the same queue after restart."},

	{CnsHeartbeat, "L1:298", "the caller's connections negotiate an AMQP heartbeat of 30–60 s (L1:301; management API)", should, spec, "HCP implementations SHOULD configure heartbeats"},

	{CmdEnvelope, "L1:21", "every command body is an L1 envelope (hcp_version MAJOR.MINOR, UUID v4 message_id, ISO 8601 UTC timestamp, known type, object payload; L1:34–40)", prose, spec, "Every HCP message is wrapped in a standard envelope, carried as the AMQP message body"},
	{CmdSessionID, "L1:38", "session_id is null in task_submit and a valid session id in abort", must, spec, "All subsequent messages MUST include a valid session ID"},
	{CmdContentType, "L1:356", "AMQP content_type is application/json on every command", must, spec, `The AMQP content_type property MUST be set to "application/json".`},
	{CmdContentEncoding, "L1:357", "AMQP content_encoding is utf-8 on every command", must, spec, `The AMQP content_encoding property MUST be set to "utf-8".`},
	{CmdDeliveryMode, "L1:146", "the caller publishes commands with delivery_mode 2 (persistent)", must, spec, "The caller MUST publish with delivery_mode: 2 (persistent)"},
	{CmdMessageID, "L1:47", "AMQP message_id is set and equals the envelope's message_id", prose, spec, "message_id message_id Broker-level deduplication"},
	{CmdMirrored, "L1:49", "AMQP correlation_id = session_id and type = the envelope type (L1:53)", prose, spec, "correlation_id session_id Session correlation for routing"},
	{CmdRouting, "L1:116", "commands are published to hcp.commands with routing key {callee_id}", prose, spec, "The caller publishes to hcp.commands with routing key set to the target callee"},
	{CmdTypes, "L1:59", "only command types (task_submit, abort) are sent on the command channel (L1:61–63)", prose, spec, "Caller → Callee (Command Channel)"},
	{CmdUniqueID, "L1:36", "each command has its own message_id (a republish repeats it with the same body, L1:148)", prose, spec, "message_id string (UUID v4) Yes Unique identifier for this message"},
	{CmdStrictEnvelope, "C#77", "every command passes this project's decoder: no unknown or repeated envelope keys, the ISO 8601 forms of row 79 (rows 77–80)", choice, operator, ""},
	{CmdUserID, "D§3", "AMQP user_id is the caller's broker user (identity by the authenticated sender)", choice, operator, ""},
	{CmdPayloadSchema, "D§4", "every command payload is valid by this project's schemas (task_submit naming the caller itself as caller_id, abort)", choice, operator, ""},

	{SubPublished, "L1:62", "asked to submit a task, the caller publishes a task_submit for it to the callee", prose, spec, "task_submit Submit a new task No (session created by callee)"},
	{SubRetried, "L1:148", "a task_submit left unanswered is republished with the same message_id (and body), and the caller takes the late answer", should, spec, "it SHOULD republish the task_submit with the same message_id"},
	{AccFirst, "A:63", "the caller processes task_accepted as the task's answer, before any event of its session", prose, spec, "③ TaskAccepted (with SessionToken + risk level)"},
	{RjcProcessed, "L1:69", "the caller processes task_rejected as the task's answer (with its reason, A:64) and sends nothing more for the task", prose, spec, "task_rejected Task failed safety check"},

	{OrdInOrder, "L2:113", "the caller processes a session's events in sequence order, although the kit published sequence N+1 before N", must, spec, "Consumers MUST process events in sequence order."},
	{OrdReordered, "L2:114", "the event that arrived out of order is buffered and reordered: every event of the session is processed", should, spec, "the consumer SHOULD buffer and reorder"},
	{DdpOnce, "L2:124", "an event published twice (same message_id and sequence) is processed once (last_processed_sequence, L2:122)", must, spec, "the caller checks event.sequence <= last_processed_sequence"},
	{AckAll, "L2:124", "every event is acknowledged, the duplicate too: the caller's queue drains (management API)", prose, spec, "(but still ACKed to advance the queue)"},

	{AbrSession, "L1:63", "asked to abort, the caller publishes abort with the session's session_id (and correlation_id)", prose, spec, "abort Request task abortion Yes"},
	{AbrToken, "A:34", "the abort carries the session token the callee issued in task_accepted", prose, spec, "Session Token: Cryptographic token issued upon approval, carried through L2 and L1"},
	{AbrTransient, "L2:194", "the caller processes ABORTING, then ABORTED and session_closed ABORTED", should, spec, "The caller SHOULD treat ABORTING as a transient state that will resolve to ABORTED."},

	{RcnReconnects, "L1:336", "after the broker closes its connection the caller reconnects and consumes hcp.evt.{caller_id} again", should, spec, "Harnesses SHOULD implement connection retry with exponential backoff"},
	{RcnResumes, "L1:169", "events published while it was away are processed after it reconnects (L1:153), every event once and in order", prose, spec, "the event stream must resume from exactly where it left off"},

	brokerSize,
}

// CallerChecks returns the caller kit's catalog, in report order, every
// profile.
func CallerChecks() []Check { return append([]Check(nil), callerChecks...) }
