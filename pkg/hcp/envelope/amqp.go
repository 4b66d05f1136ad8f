package envelope

import (
	"mime"
	"strings"

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
