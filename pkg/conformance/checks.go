package conformance

// Check is one statement the kit verifies.
type Check struct {
	ID string
	// Ref is the short citation: "L1:356" is line 356 of
	// L1-transport-encoding.md, "L2:188" of L2-session-lifecycle.md,
	// "A:34" of 00-architecture.md; for a profile check "C#77" is row 77
	// of docs/conformance.md, "D§3" section 3 of the project's DESIGN.md,
	// "H#…" and "I#…" sections of docs/harness-api.md and docs/install.md.
	// Cite expands it.
	Ref       string
	Statement string
	// Level is the spec's keyword for the statement (MUST, SHOULD, MAY),
	// "" for normative prose without one (tables, "all implementations
	// follow"), or "choice" for a profile check.
	Level string
	// Profile is ProfileSpec or ProfileHCPOperator.
	Profile string
	// Quote is the cited spec text, verbatim (a unit test holds it against
	// the spec files when they are at hand).
	Quote string
}

// Cite returns the check's full citation.
func (c Check) Cite() Citation { return cite(c.Ref, c.Quote) }

// The check ids of the callee kit.
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
	MsgStrictEnvelope  = "MSG-12"
	MsgPayloadSchema   = "MSG-13"

	SesAccepted    = "SES-1"
	SesSequence    = "SES-2"
	SesTransitions = "SES-3"
	SesClosed      = "SES-4"
	SesNoGap       = "SES-5"

	DupAnswer = "DUP-1"
	DupOnce   = "DUP-2"
	DupToken  = "DUP-3"

	RejUnknown  = "REJ-1"
	RejIdentity = "REJ-2"

	MalSurvives = "MAL-1"

	AbtAborting = "ABT-1"
	AbtAborted  = "ABT-2"
	AbtClosed   = "ABT-3"

	ConRetained   = "CON-1"
	ConRedelivery = "CON-2"
	ConNoGap      = "CON-3"

	// BrkMessageSize is shared by both kits.
	BrkMessageSize = "BRK-1"
)

const (
	must     = "MUST"
	should   = "SHOULD"
	may      = "MAY"
	prose    = ""
	choice   = "choice"
	spec     = ProfileSpec
	operator = ProfileHCPOperator
)

// brokerSize is the broker check of both kits.
var brokerSize = Check{BrkMessageSize, "I#Broker settings: a message size limit",
	"the broker refuses a message above the documented limit (max_message_size at most 8 MiB; HCP envelopes are at most 1 MiB)", choice, operator, ""}

// calleeChecks is the callee kit's catalog, in report order.
var calleeChecks = []Check{
	{TopCommandsExchange, "L1:101", "exchange hcp.commands exists (passive declare)", prose, spec, "hcp.commands direct Yes"},
	{TopEventsExchange, "L1:102", "exchange hcp.events exists (passive declare)", prose, spec, "hcp.events topic Yes"},
	{TopCommandQueue, "L1:107", "queue hcp.cmd.{callee_id} exists and the callee consumes it (L1:401)", prose, spec, "hcp.cmd.{callee_id} hcp.commands {callee_id} Yes"},
	{TopEventQueue, "L1:108", "queue hcp.evt.{caller_id} exists (passive declare)", prose, spec, "hcp.evt.{caller_id} hcp.events {caller_id}.# Yes"},
	{TopCommandRouting, "L1:116", "a command published to hcp.commands with routing key {callee_id} is routed to the callee's queue", prose, spec, "The caller publishes to hcp.commands with routing key set to the target callee"},

	{MgmtExchanges, "L1:100", "hcp.commands is direct and durable, hcp.events is topic and durable (management API)", prose, spec, "Exchange Type Durable Description"},
	{MgmtCommandQueue, "L1:107", "hcp.cmd.{callee_id} is durable, bound to hcp.commands with {callee_id}, has no message TTL (L1:367)", prose, spec, "hcp.cmd.{callee_id} hcp.commands {callee_id} Yes"},
	{MgmtEventQueue, "L1:108", "hcp.evt.{caller_id} is durable, bound to hcp.events with {caller_id}.#", prose, spec, "hcp.evt.{caller_id} hcp.events {caller_id}.# Yes"},
	{MgmtEventQueueTTL, "C#24", "hcp.evt.{caller_id} has a message TTL (L1:370 makes it a MAY; this project sets 24 h)", choice, operator, ""},
	{MgmtEventQueueMax, "L1:375", "hcp.evt.{caller_id} has x-max-length or x-max-length-bytes, overflow drop-head", should, spec, "Implementations SHOULD configure x-max-length or x-max-length-bytes on event queues"},

	{MsgEnvelope, "L1:21", "every message body is an L1 envelope (hcp_version MAJOR.MINOR, UUID v4 message_id, ISO 8601 UTC timestamp, known type, object payload; L1:34–40)", prose, spec, "Every HCP message is wrapped in a standard envelope, carried as the AMQP message body"},
	{MsgSessionID, "L1:38", "every event carries a valid session_id (null only in task_submit)", must, spec, "All subsequent messages MUST include a valid session ID"},
	{MsgContentType, "L1:356", "AMQP content_type is application/json on every message", must, spec, `The AMQP content_type property MUST be set to "application/json".`},
	{MsgContentEncoding, "L1:357", "AMQP content_encoding is utf-8 on every message", must, spec, `The AMQP content_encoding property MUST be set to "utf-8".`},
	{MsgDeliveryMode, "L1:152", "the callee publishes with delivery_mode 2 (persistent)", must, spec, "The callee MUST publish with delivery_mode: 2"},
	{MsgMessageID, "L1:47", "AMQP message_id is set and equals the envelope's message_id", prose, spec, "message_id message_id Broker-level deduplication"},
	{MsgMirrored, "L1:49", "AMQP correlation_id = session_id and type = the envelope type (L1:53)", prose, spec, "correlation_id session_id Session correlation for routing"},
	{MsgUserID, "D§3", "AMQP user_id is set to the callee's broker user (the authenticated sender)", choice, operator, ""},
	{MsgRoutingKey, "L1:120", "events are routed with {caller_id}.{session_id}.{message_type}", prose, spec, "Routing key: {caller_id}.{session_id}.{message_type}"},
	{MsgUniqueID, "L1:154", "each message carries a unique message_id (a redelivery repeats it with the same body)", prose, spec, "Each event carries a unique message_id."},
	{MsgPayload, "L2:78", "every event's payload has a known event_type (L2:99–108), an integer sequence and an object data (L2:92–95)", prose, spec, "Events are carried in the payload of an L1 message"},
	{MsgStrictEnvelope, "C#77", "every body passes this project's decoder: no unknown or repeated envelope keys, the ISO 8601 forms of row 79 (rows 77–80)", choice, operator, ""},
	{MsgPayloadSchema, "D§4", "every payload is valid for its type by this project's schemas (task_accepted/rejected/completed/failed, the data of the nine event types)", choice, operator, ""},

	{SesAccepted, "L1:68", "a valid task_submit is answered task_accepted with a session id and token on the caller's queue", prose, spec, "task_accepted Task passed safety check, session created"},
	{SesSequence, "L2:112", "event sequence numbers increase strictly within every session", must, spec, "Events MUST be emitted with strictly increasing sequence numbers within a session."},
	{SesTransitions, "L2:59", "every state change is a valid L2 transition from the session's current state", prose, spec, "Valid State Transitions"},
	{SesClosed, "L2:108", "a finished session ends with session_closed in its terminal state, after task_completed/task_failed (A:79)", prose, spec, "session_closed Session has reached a terminal state final_state, reason"},
	{SesNoGap, "H#Duplicates and restarts", "every session's sequences run 1..n without a gap (this project's callee leaves none outside a takeover)", choice, operator, ""},

	{DupAnswer, "L1:148", "a republished task_submit (same message_id) is answered for the same session", must, spec, "The callee MUST deduplicate on message_id."},
	{DupOnce, "L1:148", "the republished task_submit is not executed again (one session_created, one sequence)", must, spec, "The callee MUST deduplicate on message_id."},
	{DupToken, "C#65", "the answer to the republished task_submit repeats the original token and risk (deterministic re-issue)", choice, operator, ""},

	{RejUnknown, "L1:69", "a task_submit the callee must refuse (unknown capability) is answered task_rejected naming the task", prose, spec, "task_rejected Task failed safety check"},
	{RejIdentity, "D§3", "a task_submit claiming another caller_id is rejected, and the answer goes to the authenticated sender's queue", choice, operator, ""},

	{MalSurvives, "L1:146", "after garbage and invalid envelopes on its command queue the callee still accepts a valid task_submit", prose, spec, "Delivery: At-least-once."},

	{AbtAborting, "L2:188", "abort with the session token moves a RUNNING session to ABORTING (state_changed)", prose, spec, "1. The session transitions to ABORTING."},
	{AbtAborted, "L2:191", "the aborting session then reaches ABORTED (state_changed ABORTING→ABORTED)", prose, spec, "4. Upon completion, the session transitions to ABORTED."},
	{AbtClosed, "L2:192", "the aborted session closes with session_closed final_state ABORTED and no task_completed", prose, spec, `5. The callee emits session_closed with final_state: "ABORTED".`},

	{ConRetained, "L1:153", "events published while the caller is disconnected are delivered after it reconnects", prose, spec, "Events published while the caller is disconnected are retained in the queue"},
	{ConRedelivery, "L1:192", "events left unacknowledged at the disconnect are redelivered (redelivered=true); acknowledged ones are not", prose, spec, "Messages in UNACKED state are never lost."},
	{ConNoGap, "L1:169", "the resumed stream, deduplicated by message_id, has no event twice and no gap (N+2 without N+1, L2:126)", prose, spec, "the event stream must resume from exactly where it left off"},

	brokerSize,
}

// checks is the callee catalog (the name the package has always used).
var checks = calleeChecks

// Checks returns the callee kit's catalog, in report order, every
// profile.
func Checks() []Check { return append([]Check(nil), calleeChecks...) }

// inProfile reports whether a check runs under the selected profile:
// spec checks always, ProfileHCPOperator checks only when it is selected.
func inProfile(c Check, profile string) bool {
	return c.Profile == ProfileSpec || profile == ProfileHCPOperator
}
