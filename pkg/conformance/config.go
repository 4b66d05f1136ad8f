package conformance

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Defaults of Config.
const (
	DefaultTimeout           = 60 * time.Second
	DefaultDisconnect        = 2 * time.Second
	DefaultUnknownCapability = "hcp-conformance.no-such-capability"
)

// Config says which callee to check and how the kit reaches the broker.
type Config struct {
	// AMQPURL is an amqp:// or amqps:// URI with the credentials of a
	// caller user: the kit publishes commands as that caller and consumes
	// its event queue. Give the kit a caller identity of its own (no
	// other consumer on its event queue).
	AMQPURL string
	// Vhost, when set, replaces the URI's vhost.
	Vhost string
	// CalleeID is the callee under test; CallerID the identity of the user
	// in AMQPURL (its event queue is hcp.evt.{CallerID}).
	CalleeID, CallerID string
	// CalleeUser is the callee's broker username, which its messages must
	// carry as user_id. Empty: derived with topology.Username when the
	// kit's own username follows that scheme, else any non-empty user_id.
	CalleeUser string

	// Capability and Inputs are a task the callee accepts and completes.
	Capability string
	Inputs     json.RawMessage
	// AbortCapability and AbortInputs are a task that runs long enough
	// (several seconds, emitting events) to be aborted and to have the
	// kit disconnect in the middle of its stream. Empty: Capability and
	// Inputs.
	AbortCapability string
	AbortInputs     json.RawMessage
	// DataClassification, when set, goes into the tasks' constraints.
	DataClassification string
	// UnknownCapability is a capability the callee does not offer.
	UnknownCapability string

	// ManagementURL is the RabbitMQ management API, e.g.
	// http://user:pass@host:15672 (without credentials in the URL the
	// AMQP user's are tried). Empty: the MGMT checks are skipped.
	ManagementURL string

	// Timeout bounds each wait for an answer or an event (default 60 s).
	Timeout time.Duration
	// Disconnect is how long the kit stays disconnected in the continuity
	// check (default 2 s).
	Disconnect time.Duration
	// MaxMessageSize is the broker limit BRK-1 holds the broker to; 0
	// means DocumentedMaxMessageSize.
	MaxMessageSize int64

	// Profile selects the checks: ProfileSpec ("" too) checks what the
	// specification says; ProfileHCPOperator adds this project's own
	// stricter choices (see Check.Profile).
	Profile string

	// Log receives progress lines; nil for none.
	Log io.Writer
}

// resolved is a validated Config with what it implies.
type resolved struct {
	Config
	uri        amqp.URI
	username   string
	commandKey string
	cmdQueue   string
	evtQueue   string
}

// Validate checks the configuration without connecting to anything.
func (c Config) Validate() error {
	_, err := c.resolve()
	return err
}

func (c Config) resolve() (*resolved, error) {
	var errs []error
	var err error
	r := &resolved{Config: c}
	if c.AMQPURL == "" {
		errs = append(errs, errors.New("no AMQP URL"))
	} else if u, err := amqp.ParseURI(c.AMQPURL); err != nil {
		errs = append(errs, fmt.Errorf("AMQP URL: %w", err))
	} else {
		if c.Vhost != "" {
			u.Vhost = c.Vhost
		}
		r.uri, r.username = u, u.Username
		r.Vhost = u.Vhost
	}
	if r.Profile, err = resolveProfile(c.Profile); err != nil {
		errs = append(errs, err)
	}
	if err := validateID(c.CalleeID, r.Profile); err != nil {
		errs = append(errs, fmt.Errorf("callee id: %w", err))
	}
	if err := validateID(c.CallerID, r.Profile); err != nil {
		errs = append(errs, fmt.Errorf("caller id: %w", err))
	}
	if !task.ValidCapability(c.Capability) {
		errs = append(errs, fmt.Errorf("capability %q is not a valid capability name", c.Capability))
	}
	if r.AbortCapability == "" {
		r.AbortCapability = c.Capability
	} else if !task.ValidCapability(r.AbortCapability) {
		errs = append(errs, fmt.Errorf("abort capability %q is not a valid capability name", r.AbortCapability))
	}
	if r.UnknownCapability == "" {
		r.UnknownCapability = DefaultUnknownCapability
	} else if !task.ValidCapability(r.UnknownCapability) {
		errs = append(errs, fmt.Errorf("unknown capability %q is not a valid capability name", r.UnknownCapability))
	}
	if r.Inputs, err = jsonObject("inputs", c.Inputs); err != nil {
		errs = append(errs, err)
	}
	if len(c.AbortInputs) == 0 {
		r.AbortInputs = r.Inputs
	} else if r.AbortInputs, err = jsonObject("abort inputs", c.AbortInputs); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, checkShared(c.DataClassification, c.ManagementURL)...)
	if c.Timeout < 0 || c.Disconnect < 0 || c.MaxMessageSize < 0 {
		errs = append(errs, errors.New("timeouts must not be negative"))
	}
	if r.MaxMessageSize == 0 {
		r.MaxMessageSize = DocumentedMaxMessageSize
	}
	if r.Timeout == 0 {
		r.Timeout = DefaultTimeout
	}
	if r.Disconnect == 0 {
		r.Disconnect = DefaultDisconnect
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if r.CalleeUser == "" {
		if role, _, id, err := topology.ParseUsername(r.username); err == nil && role == topology.RoleCaller && id == c.CallerID {
			r.CalleeUser = topology.Username(topology.RoleCallee, r.Vhost, c.CalleeID)
		}
	}
	r.commandKey = topology.CommandRoutingKey(c.CalleeID)
	r.cmdQueue = topology.CommandQueue(c.CalleeID)
	r.evtQueue = topology.EventQueue(c.CallerID)
	return r, nil
}

// jsonObject checks that raw is a JSON object; empty means {}.
func jsonObject(what string, raw json.RawMessage) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return json.RawMessage("{}"), nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, fmt.Errorf("%s: want a JSON object", what)
	}
	return raw, nil
}

// redactURL hides the password of a URL for messages.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// resolveProfile checks a profile name; "" is ProfileSpec.
func resolveProfile(p string) (string, error) {
	switch p {
	case "", ProfileSpec:
		return ProfileSpec, nil
	case ProfileHCPOperator:
		return p, nil
	}
	return "", fmt.Errorf("profile %q: want %s or %s", p, ProfileSpec, ProfileHCPOperator)
}

// validateID checks a callee or caller id. The specification gives ids no
// syntax; they are words of routing keys and parts of queue names (L1:107,
// L1:120), so the spec profile asks only that: not empty, no '.', '*' or
// '#', no space or control character, a queue name within AMQP's 255
// bytes. ProfileHCPOperator applies this project's rule (lowercase
// letters, digits, '-' and '_'; topology.ValidateID).
func validateID(id, profile string) error {
	if profile == ProfileHCPOperator {
		return topology.ValidateID(id)
	}
	switch {
	case id == "":
		return errors.New("must not be empty")
	case len(topology.EventQueuePrefix+id) > 255:
		return fmt.Errorf("%q is too long for a queue name (255 bytes)", id)
	case strings.ContainsAny(id, ".*#") || strings.IndexFunc(id, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0:
		return fmt.Errorf("%q: a routing-key word cannot hold '.', '*', '#', spaces or control characters", id)
	}
	return nil
}

// checkShared checks the settings both kits take: the task's data class
// and the management API's URL.
func checkShared(dataClass, managementURL string) []error {
	var errs []error
	if dataClass != "" {
		if _, err := task.ParseDataClass(dataClass); err != nil {
			errs = append(errs, fmt.Errorf("data classification: %w", err))
		}
	}
	if managementURL != "" {
		u, err := url.Parse(managementURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("management URL %q: want http(s)://[user:pass@]host:port", redactURL(managementURL)))
		}
	}
	return errs
}
