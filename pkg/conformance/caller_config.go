package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// DefaultKitCapability is the capability the caller kit's tasks name.
const DefaultKitCapability = "hcp-conformance.echo"

// CallerDriver makes the caller under test act and reports what it
// processed: the specification defines no interface to a caller's
// application, so the kit needs one. AppAPIDriver speaks this project's
// caller app API (docs/harness-api.md, "Caller side"); another caller
// implements the three methods, in Go or behind the same HTTP API.
type CallerDriver interface {
	// Submit makes the caller submit a task.
	Submit(ctx context.Context, t DriverTask) error
	// Abort makes the caller abort a session of a task it submitted.
	Abort(ctx context.Context, sessionID string) error
	// Processed returns what the caller has processed so far (handed to
	// its application), in the order it did.
	Processed() []Processed
}

// DriverTask is a task the kit asks the caller to submit.
type DriverTask struct {
	CalleeID, Capability, Intent string
	Inputs                       json.RawMessage
	// DataClassification, when set, goes into the constraints.
	DataClassification string
}

// Processed is one message the caller processed.
type Processed struct {
	SessionID string `json:"session_id"`
	MessageID string `json:"message_id"`
	// Type is the L1 message type (task_accepted, event, ...).
	Type string `json:"type"`
	// TaskMessageID names the task of an answer.
	TaskMessageID string `json:"task_message_id,omitempty"`
	// Sequence and EventType are an event's.
	Sequence  int64           `json:"sequence,omitempty"`
	EventType string          `json:"event_type,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// CallerConfig says which caller to check and how the kit reaches the
// broker and the caller.
type CallerConfig struct {
	// AMQPURL is an amqp:// or amqps:// URI with the credentials of a
	// callee user: the kit plays that callee (it consumes
	// hcp.cmd.{CalleeID} and publishes to hcp.events). Give the kit a
	// callee identity of its own.
	AMQPURL string
	// Vhost, when set, replaces the URI's vhost.
	Vhost string
	// CalleeID is the kit's own callee id; CallerID the caller under test.
	CalleeID, CallerID string
	// CallerUser is the caller's broker username: its connections are the
	// ones the reconnect check closes, and (profile hcp-operator) the
	// user_id its commands must carry. Empty: derived with
	// topology.Username when the kit's username follows that scheme.
	CallerUser string
	// Driver makes the caller submit and abort and reports what it
	// processed. Required.
	Driver CallerDriver
	// Capability is named in the kit's tasks (default
	// DefaultKitCapability); DataClassification goes into their
	// constraints when set.
	Capability         string
	DataClassification string
	// ManagementURL is the RabbitMQ management API (as in Config); the
	// consumer checks, the reconnect (the kit closes the caller's
	// connections through it: it needs a user allowed to) and the drain
	// check need it, and are skipped without it.
	ManagementURL string
	// Timeout bounds each wait (default 60 s).
	Timeout time.Duration
	// RetryWait is how long the kit leaves a task_submit unanswered,
	// waiting for the caller to republish it (L1:148's "configurable
	// timeout"; this project's sidecar waits 30 s). 0 skips SUB-2.
	RetryWait time.Duration
	// MaxMessageSize is BRK-1's limit (default DocumentedMaxMessageSize).
	MaxMessageSize int64
	// Profile is ProfileSpec ("") or ProfileHCPOperator.
	Profile string
	// Log receives progress lines; nil for none.
	Log io.Writer
}

type callerResolved struct {
	CallerConfig
	uri      amqp.URI
	username string
	cmdQueue string
	evtQueue string
}

// Validate checks the configuration without connecting to anything.
func (c CallerConfig) Validate() error {
	_, err := c.resolve()
	return err
}

func (c CallerConfig) resolve() (*callerResolved, error) {
	var errs []error
	var err error
	r := &callerResolved{CallerConfig: c}
	if c.AMQPURL == "" {
		errs = append(errs, errors.New("no AMQP URL"))
	} else if u, err := amqp.ParseURI(c.AMQPURL); err != nil {
		errs = append(errs, fmt.Errorf("AMQP URL: %w", err))
	} else {
		if c.Vhost != "" {
			u.Vhost = c.Vhost
		}
		r.uri, r.username, r.Vhost = u, u.Username, u.Vhost
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
	if c.Driver == nil {
		errs = append(errs, errors.New("no driver: the kit needs a way to make the caller submit and abort (the caller app API, --caller-api)"))
	}
	if r.Capability == "" {
		r.Capability = DefaultKitCapability
	} else if !task.ValidCapability(r.Capability) {
		errs = append(errs, fmt.Errorf("capability %q is not a valid capability name", r.Capability))
	}
	errs = append(errs, checkShared(c.DataClassification, c.ManagementURL)...)
	if c.Timeout < 0 || c.MaxMessageSize < 0 || c.RetryWait < 0 {
		errs = append(errs, errors.New("timeouts and sizes must not be negative"))
	}
	if r.Timeout == 0 {
		r.Timeout = DefaultTimeout
	}
	if r.MaxMessageSize == 0 {
		r.MaxMessageSize = DocumentedMaxMessageSize
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if r.CallerUser == "" {
		if role, _, id, err := topology.ParseUsername(r.username); err == nil && role == topology.RoleCallee && id == c.CalleeID {
			r.CallerUser = topology.Username(topology.RoleCaller, r.Vhost, c.CallerID)
		}
	}
	r.cmdQueue = topology.CommandQueue(c.CalleeID)
	r.evtQueue = topology.EventQueue(c.CallerID)
	return r, nil
}

// mgmtConfig adapts the caller kit's configuration to the management
// helpers shared with the callee kit.
func (c *callerResolved) mgmtConfig() *resolved {
	return &resolved{Config: Config{ManagementURL: c.ManagementURL, Vhost: c.Vhost}, uri: c.uri}
}
