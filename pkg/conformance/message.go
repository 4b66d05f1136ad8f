package conformance

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// Expect is what every message on the caller's event queue must show
// beyond the fixed L1 rules.
type Expect struct {
	// CallerID is the caller whose event queue the message came from: the
	// first word of its routing key.
	CallerID string
	// CalleeUser is the callee's broker username; "" accepts any non-empty
	// user_id.
	CalleeUser string
}

// Violations are the checks one message breaks, by check id, each with
// the reason.
type Violations map[string]string

func (v Violations) add(id, format string, args ...any) {
	if _, dup := v[id]; !dup {
		v[id] = fmt.Sprintf(format, args...)
	}
}

// CheckMessage checks one delivery from the caller's event queue against
// the per-message rules (the MSG-* checks except MSG-10, which needs all
// messages) and returns the envelope as SpecDecode reads it (nil when the
// body is no L1 envelope) with the violations of every profile (a report
// keeps those of its profile). It never panics, whatever the delivery
// holds.
func CheckMessage(d amqp.Delivery, exp Expect) (*envelope.Envelope, Violations) {
	v := Violations{}
	if d.ContentType != envelope.ContentType {
		v.add(MsgContentType, "content_type %q", d.ContentType)
	}
	if !strings.EqualFold(d.ContentEncoding, envelope.ContentEncoding) {
		v.add(MsgContentEncoding, "content_encoding %q", d.ContentEncoding)
	}
	if d.DeliveryMode != amqp.Persistent {
		v.add(MsgDeliveryMode, "delivery_mode %d", d.DeliveryMode)
	}
	if d.UserId == "" {
		v.add(MsgUserID, "no user_id")
	} else if exp.CalleeUser != "" && d.UserId != exp.CalleeUser {
		v.add(MsgUserID, "user_id %q, want %q", d.UserId, exp.CalleeUser)
	}
	if d.MessageId == "" {
		v.add(MsgMessageID, "no message_id property")
	}

	env, err := SpecDecode(d.Body)
	if err != nil {
		var se *SpecError
		if errors.As(err, &se) && se.Field == fieldSessionID {
			v.add(MsgSessionID, "%v", err)
		} else {
			v.add(MsgEnvelope, "%v", err)
		}
	} else if !env.Type.IsEvent() {
		v.add(MsgEnvelope, "type %q is not an event-channel type (L1:65–72)", env.Type)
	}
	// This project's decoder: what the spec leaves open, answered strictly.
	if _, serr := envelope.Decode(d.Body); serr != nil && err == nil {
		v.add(MsgStrictEnvelope, "%v", serr)
	}

	words := strings.Split(d.RoutingKey, ".")
	rkOK := len(words) == 3
	switch {
	case !rkOK:
		v.add(MsgRoutingKey, "routing key %q: want {caller_id}.{session_id}.{message_type}, got %d words", short(d.RoutingKey), len(words))
	case exp.CallerID != "" && words[0] != exp.CallerID:
		v.add(MsgRoutingKey, "routing key %q names caller %q, want %q", d.RoutingKey, words[0], exp.CallerID)
	}
	if err != nil {
		return nil, v
	}

	if d.MessageId != "" && !strings.EqualFold(d.MessageId, env.MessageID) {
		v.add(MsgMessageID, "property %q, envelope %q", d.MessageId, env.MessageID)
	}
	if !strings.EqualFold(d.CorrelationId, env.Session()) {
		v.add(MsgMirrored, "correlation_id %q, envelope session_id %q", d.CorrelationId, env.Session())
	}
	if d.Type != string(env.Type) {
		v.add(MsgMirrored, "type property %q, envelope type %q", d.Type, env.Type)
	}
	if rkOK && (!strings.EqualFold(words[1], env.Session()) || words[2] != string(env.Type)) {
		v.add(MsgRoutingKey, "routing key %q does not match session %q type %q", d.RoutingKey, env.Session(), env.Type)
	}
	if env.Type == envelope.TypeEvent {
		if perr := specEventPayload(env.Payload); perr != nil {
			v.add(MsgPayload, "event %s: %v", env.MessageID, perr)
		}
	}
	if perr := CheckPayload(env); perr != nil {
		v.add(MsgPayloadSchema, "%s %s: %v", env.Type, env.MessageID, perr)
	}
	return env, v
}

// CheckPayload validates an event-channel envelope's payload for its type
// with the payload types of packages task and session.
func CheckPayload(env *envelope.Envelope) error {
	if env == nil {
		return errors.New("no envelope")
	}
	var p interface{ Validate() error }
	switch env.Type {
	case envelope.TypeTaskAccepted:
		p = &task.TaskAccepted{}
	case envelope.TypeTaskRejected:
		p = &task.TaskRejected{}
	case envelope.TypeTaskCompleted:
		p = &task.TaskCompleted{}
	case envelope.TypeTaskFailed:
		p = &task.TaskFailed{}
	case envelope.TypeEvent:
		p = &session.EventPayload{}
	default:
		return fmt.Errorf("type %q is not an event-channel type", env.Type)
	}
	if err := json.Unmarshal(env.Payload, p); err != nil {
		return err
	}
	return p.Validate()
}
