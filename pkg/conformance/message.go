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
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
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
// messages) and returns the decoded envelope (nil when the body is not a
// valid envelope) with the violations. It never panics, whatever the
// delivery holds.
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

	env, err := envelope.Decode(d.Body)
	if err != nil {
		var fe *envelope.FieldError
		if errors.As(err, &fe) && fe.Field == envelope.FieldSessionID {
			v.add(MsgSessionID, "%v", err)
		} else {
			v.add(MsgEnvelope, "%v", err)
		}
	} else if !env.Type.IsEvent() {
		v.add(MsgEnvelope, "type %q is not an event-channel type", env.Type)
	}

	callerID, sid, typ, rkErr := topology.ParseEventRoutingKey(d.RoutingKey)
	switch {
	case rkErr != nil:
		v.add(MsgRoutingKey, "%v", rkErr)
	case exp.CallerID != "" && callerID != exp.CallerID:
		v.add(MsgRoutingKey, "routing key %q names caller %q, want %q", d.RoutingKey, callerID, exp.CallerID)
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
	if rkErr == nil && (!strings.EqualFold(sid, env.Session()) || typ != env.Type) {
		v.add(MsgRoutingKey, "routing key %q does not match session %q type %q", d.RoutingKey, env.Session(), env.Type)
	}
	if perr := CheckPayload(env); perr != nil {
		v.add(MsgPayload, "%s %s: %v", env.Type, env.MessageID, perr)
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
