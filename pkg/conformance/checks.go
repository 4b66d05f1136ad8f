package conformance

// Check is one statement of the specification the kit verifies.
type Check struct {
	ID        string
	Ref       string
	Statement string
}

// The check ids.
const (
	TopCommandsExchange = "TOP-1"
	TopEventsExchange   = "TOP-2"
	TopCommandQueue     = "TOP-3"
	TopEventQueue       = "TOP-4"
	TopCommandRouting   = "TOP-5"

	MgmtExchanges     = "MGMT-1"
	MgmtCommandQueue  = "MGMT-2"
	MgmtEventQueue    = "MGMT-3"
	MgmtEventQueueTTL = "MGMT-4"
	MgmtEventQueueMax = "MGMT-5"

	MsgEnvelope        = "MSG-1"
	MsgSessionID       = "MSG-2"
	MsgContentType     = "MSG-3"
	MsgContentEncoding = "MSG-4"
	MsgDeliveryMode    = "MSG-5"
	MsgMessageID       = "MSG-6"
	MsgMirrored        = "MSG-7"
	MsgUserID          = "MSG-8"
	MsgRoutingKey      = "MSG-9"
	MsgUniqueID        = "MSG-10"
	MsgPayload         = "MSG-11"

	SesAccepted    = "SES-1"
	SesSequence    = "SES-2"
	SesTransitions = "SES-3"
	SesClosed      = "SES-4"

	DupAnswer = "DUP-1"
	DupOnce   = "DUP-2"

	RejUnknown  = "REJ-1"
	RejIdentity = "REJ-2"

	MalSurvives = "MAL-1"

	AbtAborting = "ABT-1"
	AbtAborted  = "ABT-2"
	AbtClosed   = "ABT-3"

	ConRetained   = "CON-1"
	ConRedelivery = "CON-2"
	ConNoGap      = "CON-3"
)

// checks is the catalog, in report order. Refs are lines of the spec
// files (L1 = L1-transport-encoding.md, L2 = L2-session-lifecycle.md);
// D§n is a section of the project's DESIGN.md, for what the spec leaves to
// implementations.
var checks = []Check{
	{TopCommandsExchange, "L1:101", "exchange hcp.commands exists (passive declare)"},
	{TopEventsExchange, "L1:102", "exchange hcp.events exists (passive declare)"},
	{TopCommandQueue, "L1:107", "queue hcp.cmd.{callee_id} exists and the callee consumes it (L1:401)"},
	{TopEventQueue, "L1:108", "queue hcp.evt.{caller_id} exists (passive declare)"},
	{TopCommandRouting, "L1:116", "a command published to hcp.commands with routing key {callee_id} is routed to the callee's queue"},

	{MgmtExchanges, "L1:100", "hcp.commands is direct and durable, hcp.events is topic and durable (management API)"},
	{MgmtCommandQueue, "L1:107", "hcp.cmd.{callee_id} is durable, bound to hcp.commands with {callee_id}, has no message TTL (L1:367)"},
	{MgmtEventQueue, "L1:108", "hcp.evt.{caller_id} is durable, bound to hcp.events with {caller_id}.#"},
	{MgmtEventQueueTTL, "L1:368", "hcp.evt.{caller_id} has a message TTL (x-message-ttl; recommended 24 h)"},
	{MgmtEventQueueMax, "L1:375", "hcp.evt.{caller_id} has x-max-length or x-max-length-bytes, overflow drop-head"},

	{MsgEnvelope, "L1:34", "every message body is a valid envelope (hcp_version, UUID v4 message_id, ISO 8601 UTC timestamp, type, object payload)"},
	{MsgSessionID, "L1:38", "every event carries a valid session_id (null only in task_submit)"},
	{MsgContentType, "L1:356", "AMQP content_type is application/json on every message"},
	{MsgContentEncoding, "L1:357", "AMQP content_encoding is utf-8 on every message"},
	{MsgDeliveryMode, "L1:152", "the callee publishes with delivery_mode 2 (persistent)"},
	{MsgMessageID, "L1:47", "AMQP message_id is set and equals the envelope's message_id"},
	{MsgMirrored, "L1:49", "AMQP correlation_id = session_id and type = the envelope type (L1:53)"},
	{MsgUserID, "D§3", "AMQP user_id is set to the callee's broker user (the authenticated sender)"},
	{MsgRoutingKey, "L1:120", "events are routed with {caller_id}.{session_id}.{message_type}"},
	{MsgUniqueID, "L1:154", "each message carries a unique message_id (a redelivery repeats it with the same body)"},
	{MsgPayload, "L2:92", "every payload is valid for its type (task_accepted/rejected/completed/failed, event data of the nine event types)"},

	{SesAccepted, "L1:68", "a valid task_submit is answered task_accepted with a session id and token on the caller's queue"},
	{SesSequence, "L2:112", "event sequence numbers increase strictly from 1 in every session, without gaps (L2:126)"},
	{SesTransitions, "L2:59", "every state change is a valid L2 transition from the session's current state"},
	{SesClosed, "L2:108", "a finished session ends with session_closed in its terminal state, after task_completed/task_failed (L1:71)"},

	{DupAnswer, "L1:148", "a republished task_submit (same message_id) gets the original answer (same session, token, risk)"},
	{DupOnce, "L1:148", "the republished task_submit is not executed again (one session_created, one sequence)"},

	{RejUnknown, "L1:69", "a task_submit the callee must refuse (unknown capability) is answered task_rejected with its task_message_id and a reason code"},
	{RejIdentity, "D§3", "a task_submit claiming another caller_id is rejected, and the answer goes to the authenticated sender's queue"},

	{MalSurvives, "L1:146", "after garbage and invalid envelopes on its command queue the callee still accepts a valid task_submit"},

	{AbtAborting, "L2:188", "abort with the session token moves a RUNNING session to ABORTING (state_changed)"},
	{AbtAborted, "L2:191", "the aborting session then reaches ABORTED (state_changed ABORTING→ABORTED)"},
	{AbtClosed, "L2:192", "the aborted session closes with session_closed final_state ABORTED and no task_completed"},

	{ConRetained, "L1:153", "events published while the caller is disconnected are delivered after it reconnects"},
	{ConRedelivery, "L1:192", "events left unacknowledged at the disconnect are redelivered (redelivered=true); acknowledged ones are not"},
	{ConNoGap, "L1:169", "the resumed stream has no gap and, deduplicated by message_id, no event twice (L2:124)"},
}

// Checks returns the catalog of checks, in report order.
func Checks() []Check { return append([]Check(nil), checks...) }
