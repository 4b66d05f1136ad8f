package topology

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// Exchanges and the vhost, fixed by L1.
const (
	CommandsExchange     = "hcp.commands"
	CommandsExchangeType = "direct"
	EventsExchange       = "hcp.events"
	EventsExchangeType   = "topic"
	DefaultVhost         = "/hcp"

	CommandQueuePrefix = "hcp.cmd."
	EventQueuePrefix   = "hcp.evt."

	// DeadLetterExchange (topic, durable, one per vhost) is the
	// dead-letter exchange of the command and event queues declared before
	// their dead letters went straight to their dead-letter queues through
	// the default exchange (the operator's internal/resource/deadletter.go):
	// a message the broker drops from one (a delivery limit, a TTL, an
	// overflow) or a sidecar rejects without requeue goes there with its
	// original routing key, and from there to its harness's dead-letter
	// queue.
	DeadLetterExchange     = "hcp.dlx"
	DeadLetterExchangeType = "topic"
	// DeadLetterQueuePrefix starts every dead-letter queue: hcp.dlq.cmd.{id}
	// and hcp.dlq.evt.{id} (outside the patterns of the hcp.cmd. and
	// hcp.evt. policies).
	DeadLetterQueuePrefix = "hcp.dlq."

	// DefaultEventMessageTTL is L1's recommended x-message-ttl for caller
	// event queues.
	DefaultEventMessageTTL = 24 * time.Hour
)

// IDPattern is the regular expression every callee and caller id matches.
// Ids are single routing-key words, so they never contain '.', '*' or '#'
// (nor '@', which the username scheme relies on). The API's CRD markers use
// this same string.
const IDPattern = `^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`

// MaxIDLength is the longest id IDPattern admits.
const MaxIDLength = 63

var (
	ErrInvalidID         = errors.New("hcp topology: invalid id")
	ErrInvalidRoutingKey = errors.New("hcp topology: invalid event routing key")
	ErrInvalidUsername   = errors.New("hcp topology: invalid broker username")
)

// ValidateID reports whether id matches IDPattern; the error wraps
// ErrInvalidID and says what is wrong.
func ValidateID(id string) error {
	if matchID(id) {
		return nil
	}
	var reason string
	switch {
	case id == "":
		reason = "must not be empty"
	case len(id) > MaxIDLength:
		reason = fmt.Sprintf("must be at most %d characters", MaxIDLength)
	case !isIDEnd(id[0]) || !isIDEnd(id[len(id)-1]):
		reason = "must start and end with a lowercase letter or digit"
	default:
		reason = "may contain only lowercase letters, digits, '-' and '_'"
	}
	return fmt.Errorf("%w %q: %s", ErrInvalidID, truncate(id), reason)
}

// matchID reports whether id matches IDPattern, byte by byte: the
// sidecars check two ids per message they receive (the sender's username
// and the routing key), where a regexp match was a visible part of the
// caller sidecar's CPU per event. TestMatchID holds it to the pattern.
func matchID(id string) bool {
	if len(id) == 0 || len(id) > MaxIDLength || !isIDEnd(id[0]) || !isIDEnd(id[len(id)-1]) {
		return false
	}
	for i := 1; i < len(id)-1; i++ {
		if c := id[i]; !isIDEnd(c) && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

func isIDEnd(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') }

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// CommandQueue is the callee's command queue, hcp.cmd.{calleeID}.
func CommandQueue(calleeID string) string { return CommandQueuePrefix + calleeID }

// EventQueue is the caller's event queue, hcp.evt.{callerID}.
func EventQueue(callerID string) string { return EventQueuePrefix + callerID }

// DeadLetterQueue is the dead-letter queue of a command or event queue:
// hcp.dlq.cmd.{calleeID} for hcp.cmd.{calleeID}, hcp.dlq.evt.{callerID}
// for hcp.evt.{callerID}; "" for any other name.
func DeadLetterQueue(queue string) string {
	if !strings.HasPrefix(queue, CommandQueuePrefix) && !strings.HasPrefix(queue, EventQueuePrefix) {
		return ""
	}
	return DeadLetterQueuePrefix + strings.TrimPrefix(queue, "hcp.")
}

// CommandDeadLetterKey binds a callee's dead-letter queue to
// DeadLetterExchange: the key its commands are published with, {calleeID}
// (one word).
func CommandDeadLetterKey(calleeID string) string { return CommandRoutingKey(calleeID) }

// EventDeadLetterKey binds a caller's dead-letter queue to
// DeadLetterExchange: {callerID}.*.*, exactly the three words of its
// events' keys, so that a callee's command (one word) never matches it,
// even when a caller and a callee share an id.
func EventDeadLetterKey(callerID string) string { return callerID + ".*.*" }

// CommandRoutingKey is the key a caller publishes a command to calleeID
// with on hcp.commands, and the command queue's binding key: {calleeID}.
func CommandRoutingKey(calleeID string) string { return calleeID }

// EventRoutingKey is the key a callee publishes with on hcp.events:
// {callerID}.{sessionID}.{type}. t should be an event type.
func EventRoutingKey(callerID, sessionID string, t envelope.MessageType) string {
	return callerID + "." + sessionID + "." + string(t)
}

// EventBindingKey binds a caller's event queue to all of its events:
// {callerID}.#.
func EventBindingKey(callerID string) string { return callerID + ".#" }

// SessionBindingKey binds to one session's events: {callerID}.{sessionID}.#.
func SessionBindingKey(callerID, sessionID string) string {
	return callerID + "." + sessionID + ".#"
}

// TypeBindingKey binds to one event type across sessions:
// {callerID}.*.{type}.
func TypeBindingKey(callerID string, t envelope.MessageType) string {
	return callerID + ".*." + string(t)
}

// ParseEventRoutingKey splits an hcp.events routing key into its parts and
// validates each: a valid caller id, a UUID v4 session id and an event (not
// command) message type. Errors wrap ErrInvalidRoutingKey.
func ParseEventRoutingKey(key string) (callerID, sessionID string, t envelope.MessageType, err error) {
	// Three words, cut in place (a slice of them per message otherwise).
	var parts [3]string
	if n := strings.Count(key, ".") + 1; n != 3 {
		return "", "", "", fmt.Errorf("%w %q: want {caller_id}.{session_id}.{type}, got %d words", ErrInvalidRoutingKey, truncate(key), n)
	}
	parts[0], parts[2], _ = strings.Cut(key, ".")
	parts[1], parts[2], _ = strings.Cut(parts[2], ".")
	if err := ValidateID(parts[0]); err != nil {
		return "", "", "", fmt.Errorf("%w %q: caller id: %w", ErrInvalidRoutingKey, truncate(key), err)
	}
	if !envelope.IsUUIDv4(parts[1]) {
		return "", "", "", fmt.Errorf("%w %q: session id is not a UUID v4", ErrInvalidRoutingKey, truncate(key))
	}
	mt := envelope.MessageType(parts[2])
	if !mt.IsEvent() {
		return "", "", "", fmt.Errorf("%w %q: %q is not an event message type", ErrInvalidRoutingKey, truncate(key), truncate(parts[2]))
	}
	return parts[0], parts[1], mt, nil
}

// Permissions are a RabbitMQ user's configure/write/read regular
// expressions on a vhost.
type Permissions struct {
	Configure string
	Write     string
	Read      string
}

// CalleePermissions: no configure (the operator declares topology), write
// to hcp.events only, read its own command queue only.
func CalleePermissions(calleeID string) Permissions {
	return Permissions{
		Configure: "^$",
		Write:     `^hcp\.events$`,
		Read:      `^hcp\.cmd\.` + regexp.QuoteMeta(calleeID) + `$`,
	}
}

// CallerPermissions: no configure, write to hcp.commands only, read its own
// event queue only.
func CallerPermissions(callerID string) Permissions {
	return Permissions{
		Configure: "^$",
		Write:     `^hcp\.commands$`,
		Read:      `^hcp\.evt\.` + regexp.QuoteMeta(callerID) + `$`,
	}
}

// PermissionsFor returns the permissions of a harness with the given role
// (role must be Valid; anything but RoleCallee gets caller permissions).
func PermissionsFor(role Role, id string) Permissions {
	if role == RoleCallee {
		return CalleePermissions(id)
	}
	return CallerPermissions(id)
}
