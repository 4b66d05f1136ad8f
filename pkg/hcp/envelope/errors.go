package envelope

import (
	"errors"
	"fmt"
	"strconv"
)

// Envelope field names, as they appear on the wire and in FieldError.Field.
const (
	FieldHCPVersion = "hcp_version"
	FieldMessageID  = "message_id"
	FieldTimestamp  = "timestamp"
	FieldSessionID  = "session_id"
	FieldType       = "type"
	FieldPayload    = "payload"
)

// AMQP property names, as they appear in PropertyError.Property.
const (
	PropContentType     = "content_type"
	PropContentEncoding = "content_encoding"
	PropMessageID       = "message_id"
	PropType            = "type"
	PropCorrelationID   = "correlation_id"
)

var (
	// ErrTooLarge: the body exceeds the decoder's size limit. Checked
	// before any parsing.
	ErrTooLarge = errors.New("hcp envelope: body exceeds size limit")

	// ErrMalformed: the body is not a well-formed envelope at the JSON
	// level (invalid UTF-8, not JSON, not an object, trailing data, nested
	// too deeply). Every *SyntaxError matches it with errors.Is.
	ErrMalformed = errors.New("hcp envelope: malformed body")

	// ErrUnsupportedVersion: hcp_version is well formed but its major
	// version is not SupportedMajor. It is wrapped in a *FieldError for
	// hcp_version, so errors.As and errors.Is both work.
	ErrUnsupportedVersion = errors.New("hcp envelope: unsupported protocol major version")
)

// maxFieldNameInError bounds an attacker-chosen key quoted in an error.
const maxFieldNameInError = 64

// FieldError reports an envelope field that breaks an L1 rule. Field is one
// of the Field* constants, or the offending key for an unknown or duplicated
// top-level key (truncated to 64 bytes).
// reasonRequired is the FieldError reason of a missing field.
const reasonRequired = "required"

type FieldError struct {
	Field  string
	Reason string
	// Err is an underlying cause, such as ErrUnsupportedVersion; may be nil.
	Err error
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return "hcp envelope: " + e.Reason
	}
	return "hcp envelope: field " + strconv.Quote(e.Field) + ": " + e.Reason
}

func (e *FieldError) Unwrap() error { return e.Err }

// SyntaxError reports a body that is not a well-formed JSON envelope.
// Offset is the byte offset at which the problem was found.
type SyntaxError struct {
	Offset int
	Reason string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("hcp envelope: malformed body at offset %d: %s", e.Offset, e.Reason)
}

// Is makes every SyntaxError match ErrMalformed.
func (e *SyntaxError) Is(target error) bool { return target == ErrMalformed }

// PropertyError reports an AMQP message property that is missing, has a
// wrong value, or contradicts the envelope in the body.
type PropertyError struct {
	Property string
	Reason   string
}

func (e *PropertyError) Error() string {
	return "hcp envelope: AMQP property " + e.Property + ": " + e.Reason
}

func truncateName(s string) string {
	if len(s) <= maxFieldNameInError {
		return s
	}
	return s[:maxFieldNameInError]
}
