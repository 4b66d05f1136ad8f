package session

import (
	"fmt"
	"slices"
)

// EventType is the event_type of an L2 event.
type EventType string

// The nine standard event types (L2 "Standard Event Types").
const (
	EventSessionCreated     EventType = "session_created"
	EventStateChanged       EventType = "state_changed"
	EventProgress           EventType = "progress"
	EventIntermediateResult EventType = "intermediate_result"
	EventLog                EventType = "log"
	EventWarning            EventType = "warning"
	EventError              EventType = "error"
	EventCheckpointCreated  EventType = "checkpoint_created"
	EventSessionClosed      EventType = "session_closed"
)

// EventTypes returns the nine standard types in the specification's order.
func EventTypes() []EventType {
	return []EventType{EventSessionCreated, EventStateChanged, EventProgress,
		EventIntermediateResult, EventLog, EventWarning, EventError,
		EventCheckpointCreated, EventSessionClosed}
}

// ParseEventType parses an event type name (exact).
func ParseEventType(s string) (EventType, error) {
	t := EventType(s)
	if !t.Valid() {
		return "", fmt.Errorf("unknown event type %q", s)
	}
	return t, nil
}

// Valid reports whether t is one of the nine standard types. The set is
// closed: unknown types are rejected rather than passed through.
func (t EventType) Valid() bool { return slices.Contains(EventTypes(), t) }

// HarnessEmittable reports whether a harness may post an event of type t
// through the local API. session_created, state_changed, checkpoint_created
// and session_closed record lifecycle facts the sidecar owns; the harness
// reaches them through the pause/resume/checkpoint/complete/fail/aborted
// endpoints instead.
func (t EventType) HarnessEmittable() bool {
	switch t {
	case EventProgress, EventIntermediateResult, EventLog, EventWarning, EventError:
		return true
	}
	return false
}

// EventData is the typed data of one event type.
type EventData interface {
	// EventType returns the type this data belongs to.
	EventType() EventType
	// Validate checks the data on its own, naming bad fields.
	Validate() error
}

// newData returns a pointer to the zero data struct for t, or nil.
func newData(t EventType) EventData {
	switch t {
	case EventSessionCreated:
		return &SessionCreatedData{}
	case EventStateChanged:
		return &StateChangedData{}
	case EventProgress:
		return &ProgressData{}
	case EventIntermediateResult:
		return &IntermediateResultData{}
	case EventLog:
		return &LogData{}
	case EventWarning:
		return &WarningData{}
	case EventError:
		return &ErrorData{}
	case EventCheckpointCreated:
		return &CheckpointCreatedData{}
	case EventSessionClosed:
		return &SessionClosedData{}
	}
	return nil
}
