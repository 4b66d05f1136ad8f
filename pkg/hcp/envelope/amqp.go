package envelope

import (
	"encoding/json"
	"fmt"
	"mime"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQP property values fixed by L1.
const (
	ContentType     = "application/json"
	ContentEncoding = "utf-8"
)

// ToPublishing maps an envelope and its encoded body (from Encode) to AMQP
// properties: message_id, timestamp (AMQP carries whole seconds),
// correlation_id = session_id ("" when null), content type and encoding,
// persistent delivery, type, and user_id. userID must be the connection's
// own username: RabbitMQ refuses a publish whose user_id differs from the
// authenticated user, which is what makes Identity trustworthy at the
// receiver.
func ToPublishing(env *Envelope, body []byte, userID string) amqp.Publishing {
	return amqp.Publishing{
		ContentType:     ContentType,
		ContentEncoding: ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		CorrelationId:   env.Session(),
		MessageId:       env.MessageID,
		Timestamp:       env.Timestamp.UTC(),
		Type:            string(env.Type),
		UserId:          userID,
		Body:            body,
	}
}

// NewPublishing is NewAt followed by EncodePublishing, validating the
// envelope once instead of twice: the publisher's hot path (one per
// event) where the envelope itself is not needed.
func NewPublishing(now time.Time, t MessageType, sessionID string, payload any, userID string) (amqp.Publishing, error) {
	env, err := NewAt(now, t, sessionID, payload)
	if err != nil {
		return amqp.Publishing{}, err
	}
	return ToPublishing(env, appendValid(env), userID), nil
}

// NewPublishingUnchecked is NewPublishing without Validate, for a
// producer's hot path (the callee sidecar's harness events) that builds
// the envelope from parts it has checked already: t a known type,
// sessionID a UUID v4 (or "" for task_submit), payload a JSON object that
// CheckObject accepts (the payload is used as is, not copied: the caller
// gives it up), now within the range Validate accepts. Validate would
// only scan the payload again. Anything else must use NewPublishing.
func NewPublishingUnchecked(now time.Time, t MessageType, sessionID string, payload json.RawMessage, userID string) amqp.Publishing {
	env := assemble(now, t, sessionID, payload)
	return ToPublishing(env, appendValid(env), userID)
}

// EncodePublishing is Encode followed by ToPublishing.
func EncodePublishing(env *Envelope, userID string) (amqp.Publishing, error) {
	body, err := Encode(env)
	if err != nil {
		return amqp.Publishing{}, err
	}
	return ToPublishing(env, body, userID), nil
}

// FromDelivery decodes d.Body with a size limit (limit <= 0 means
// MaxEnvelopeBytes) and cross-checks the AMQP properties against it; see
// Decoder.FromDelivery.
func FromDelivery(d amqp.Delivery, limit int) (*Envelope, error) {
	return Decoder{MaxBytes: limit}.FromDelivery(d)
}

// FromDelivery checks the properties that describe the body before decoding
// it, decodes it, then checks that the properties that repeat envelope
// fields agree with it:
//
//   - content_type is required and must be application/json (a charset
//     parameter, if any, must be utf-8);
//   - content_encoding, if set, must be utf-8;
//   - message_id, type and correlation_id, if set, must equal the
//     envelope's message_id, type and session_id (correlation_id set on a
//     task_submit is a mismatch, its session_id being null). UUIDs compare
//     case-insensitively.
//
// Property problems are *PropertyError. Properties L1 does not make
// checkable are not checked: timestamp (seconds only, informational) and
// delivery_mode (a duty of the publisher; a transient message is already
// here). The sender's identity is not checked here: see Identity.
func (d Decoder) FromDelivery(dl amqp.Delivery) (*Envelope, error) {
	if err := checkContentType(dl.ContentType); err != nil {
		return nil, err
	}
	if dl.ContentEncoding != "" && !strings.EqualFold(dl.ContentEncoding, ContentEncoding) {
		return nil, &PropertyError{Property: PropContentEncoding, Reason: "must be utf-8, got " + quoteShort(dl.ContentEncoding)}
	}
	env, err := d.Decode(dl.Body)
	if err != nil {
		return nil, err
	}
	if dl.MessageId != "" && !strings.EqualFold(dl.MessageId, env.MessageID) {
		return nil, &PropertyError{Property: PropMessageID, Reason: "property " + quoteShort(dl.MessageId) + " does not match envelope message_id " + quoteShort(env.MessageID)}
	}
	if dl.Type != "" && dl.Type != string(env.Type) {
		return nil, &PropertyError{Property: PropType, Reason: "property " + quoteShort(dl.Type) + " does not match envelope type " + quoteShort(string(env.Type))}
	}
	if dl.CorrelationId != "" && (env.SessionID == nil || !strings.EqualFold(dl.CorrelationId, *env.SessionID)) {
		sid := "null"
		if env.SessionID != nil {
			sid = quoteShort(*env.SessionID)
		}
		return nil, &PropertyError{Property: PropCorrelationID, Reason: "property " + quoteShort(dl.CorrelationId) + " does not match envelope session_id " + sid}
	}
	return env, nil
}

func checkContentType(ct string) error {
	if ct == ContentType {
		return nil
	}
	if ct == "" {
		return &PropertyError{Property: PropContentType, Reason: "required: must be " + ContentType}
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != ContentType {
		return &PropertyError{Property: PropContentType, Reason: "must be " + ContentType + ", got " + quoteShort(ct)}
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, ContentEncoding) {
			return &PropertyError{Property: PropContentType, Reason: "unexpected parameter in " + quoteShort(ct) + " (only charset=utf-8 is allowed)"}
		}
	}
	return nil
}

// Identity returns the delivery's user_id property: the sender's broker
// username, which RabbitMQ has checked against the publishing connection's
// authenticated user. It is "" when the publisher did not set it; RabbitMQ
// validates user_id only when present, so callers that act on identity
// (the L3 gate) must treat "" as unauthenticated and refuse.
func Identity(d amqp.Delivery) string { return d.UserId }

// HeaderConfirmedThrough is the AMQP header an HCP callee sidecar sets on
// every event it publishes: the session's highest sequence S such that the
// broker had confirmed every event of the session up to S when this event
// was published. It is an extension of L1 (a header, outside the envelope)
// that lets a caller tell a gap that will fill from one that never will:
// the events up to S were in the queue before this one, so a caller that
// receives this event without having received them (and without having
// returned them to the queue itself) knows the broker no longer holds them
// (message TTL, overflow, delivery limit). Senders without it are handled
// as L2 says: wait for a while, then log and continue.
const HeaderConfirmedThrough = "hcp-confirmed-through"

// HeaderOwnerEpoch (an extension of L1, outside the envelope, like
// HeaderConfirmedThrough) carries, as an int64, the owner epoch of the
// callee replica that published a message for a session: the session's
// HCPSession status.ownerEpoch when that replica claimed it. Every claim of
// a session (the decision, a takeover, a drain's hand-over) increments the
// epoch with an optimistic-lock write, so a higher epoch is a later owner.
// A caller keeps the highest epoch seen per session and refuses messages
// from a lower one: a zombie owner (partitioned, paused past its Lease)
// cannot interleave its messages with its successor's. A message without
// it counts as epoch 0 (a sender that does not fence).
const HeaderOwnerEpoch = "hcp-owner-epoch"

// W3C Trace Context as AMQP headers (an extension of L1, outside the
// envelope, like HeaderConfirmedThrough): the traceparent and tracestate of
// the work a message belongs to, with the values and rules of the HTTP
// headers of the same names. A task_submit carries the caller's; every
// message a callee publishes for a session carries the session's. A
// receiver that does not know them ignores them; a malformed one is
// ignored, never a reason to refuse the message.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// SetConfirmedThrough sets HeaderConfirmedThrough on p to seq, copying the
// header table (p may share it with an earlier publishing, or carry a
// session's shared trace headers).
func SetConfirmedThrough(p *amqp.Publishing, seq int64) {
	h := make(amqp.Table, len(p.Headers)+1)
	for k, v := range p.Headers {
		h[k] = v
	}
	h[HeaderConfirmedThrough] = seq
	p.Headers = h
}

// ConfirmedThrough reads HeaderConfirmedThrough from a delivery's headers;
// ok is false when it is missing or not a non-negative integer.
func ConfirmedThrough(h amqp.Table) (seq int64, ok bool) {
	seq, ok = headerInt(h[HeaderConfirmedThrough])
	return seq, ok && seq >= 0
}

// OwnerEpoch reads HeaderOwnerEpoch from a delivery's headers: absent is
// epoch 0 (a sender that does not fence); a value that is not a
// non-negative integer is an error (the message is malformed).
func OwnerEpoch(h amqp.Table) (int64, error) {
	v, present := h[HeaderOwnerEpoch]
	if !present || v == nil {
		return 0, nil
	}
	n, ok := headerInt(v)
	switch {
	case !ok:
		return 0, fmt.Errorf("header %s: %T %v is not an integer in range", HeaderOwnerEpoch, v, v)
	case n < 0:
		return 0, fmt.Errorf("header %s: %d is negative", HeaderOwnerEpoch, n)
	}
	return n, nil
}

// headerInt reads an AMQP table value of an integer type the field table
// encodes (signed up to 64 bits, unsigned up to 32) as an int64.
func headerInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case int32:
		return int64(x), true
	case int16:
		return int64(x), true
	case int8:
		return int64(x), true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	}
	return 0, false
}
