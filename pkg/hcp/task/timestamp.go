package task

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// TimestampLayout is how HCP timestamps are written: ISO 8601 / RFC 3339 in
// UTC with millisecond precision, as in the specification's examples
// ("2025-01-15T08:30:00.000Z") and JavaScript's Date.toISOString. It is the
// envelope's layout: one form for everything this project writes.
const TimestampLayout = envelope.TimestampLayout

// ErrInvalidTimestamp is matched (errors.Is) by every error ParseTimestamp
// returns. It is envelope.ErrInvalidTimestamp: payload and envelope
// timestamps follow one rule and fail with one error.
var ErrInvalidTimestamp = envelope.ErrInvalidTimestamp

// ParseTimestamp is envelope.ParseTimestamp, the one timestamp rule of HCP:
// ISO 8601 in UTC ("Z" or "+00:00"), any number of fraction digits, returned
// in time.UTC. Payloads must not read timestamps any other way, or the
// envelope and its payload would disagree about what a timestamp is.
func ParseTimestamp(s string) (time.Time, error) { return envelope.ParseTimestamp(s) }

// FormatTimestamp formats t in UTC with TimestampLayout. Sub-millisecond
// precision is truncated.
func FormatTimestamp(t time.Time) string { return envelope.FormatTimestamp(t) }

// Timestamp is a time.Time that travels as an HCP timestamp (see
// ParseTimestamp and FormatTimestamp). Note the wire keeps milliseconds only,
// so a Timestamp survives an encode/decode round trip exactly when it is
// already truncated to the millisecond and in UTC (see NewTimestamp).
type Timestamp struct{ time.Time }

// NewTimestamp returns t in UTC, truncated to the millisecond and stripped
// of its monotonic clock reading: the value a decoder will see.
func NewTimestamp(t time.Time) Timestamp {
	return Timestamp{t.UTC().Truncate(time.Millisecond).Round(0)}
}

// TimestampPtr is NewTimestamp for optional fields.
func TimestampPtr(t time.Time) *Timestamp {
	ts := NewTimestamp(t)
	return &ts
}

// String returns the wire form.
func (t Timestamp) String() string { return FormatTimestamp(t.Time) }

// MarshalText implements encoding.TextMarshaler.
func (t Timestamp) MarshalText() ([]byte, error) {
	if y := t.UTC().Year(); y < 0 || y > 9999 {
		return nil, fmt.Errorf("%w: year %d outside 0000..9999", ErrInvalidTimestamp, y)
	}
	return []byte(FormatTimestamp(t.Time)), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (t *Timestamp) UnmarshalText(b []byte) error {
	v, err := ParseTimestamp(string(b))
	if err != nil {
		return err
	}
	t.Time = v
	return nil
}

// MarshalJSON implements json.Marshaler.
func (t Timestamp) MarshalJSON() ([]byte, error) {
	b, err := t.MarshalText()
	if err != nil {
		return nil, err
	}
	return json.Marshal(string(b))
}

// UnmarshalJSON implements json.Unmarshaler. JSON null leaves t unchanged.
func (t *Timestamp) UnmarshalJSON(b []byte) error {
	if string(b) == jsonNull {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%w: want a JSON string, got %s", ErrInvalidTimestamp, truncate(string(b), 32))
	}
	return t.UnmarshalText([]byte(s))
}
