package envelope_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// wantTime is a TestDecodeValid check: the decoded timestamp is want, in
// UTC, at full precision, and Encode writes it in the millisecond form.
func wantTime(want time.Time) func(t *testing.T, e *envelope.Envelope) {
	return func(t *testing.T, e *envelope.Envelope) {
		t.Helper()
		if !e.Timestamp.Equal(want) || e.Timestamp.Location() != time.UTC {
			t.Errorf("timestamp %v, want %v in UTC", e.Timestamp, want)
		}
		b, err := envelope.Encode(e)
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		ms := `"timestamp":"` + want.Truncate(time.Millisecond).Format(envelope.TimestampLayout) + `"`
		if !strings.Contains(string(b), ms) {
			t.Errorf("Encode wrote %s, want %s", b, ms)
		}
	}
}

// TestParseTimestamp pins the one timestamp rule shared by the envelope
// and the payloads (pkg/hcp/task delegates to it).
func TestParseTimestamp(t *testing.T) {
	ref := time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2025-01-15T08:30:00.000Z":         ref,
		"2025-01-15T08:30:00Z":             ref,
		"2025-01-15T08:30:00.1Z":           ref.Add(100 * time.Millisecond),
		"2025-01-15T08:30:00.123Z":         ref.Add(123 * time.Millisecond),
		"2025-01-15T08:30:00.123456Z":      ref.Add(123456 * time.Microsecond),
		"2025-01-15T08:30:00.123456789Z":   ref.Add(123456789),
		"2025-01-15T08:30:00.12345678912Z": ref.Add(123456789),
		"2025-01-15T08:30:00+00:00":        ref,
		"2025-01-15T08:30:00.5+00:00":      ref.Add(500 * time.Millisecond),
		"2024-02-29T00:00:00Z":             time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC),
		"2000-02-29T00:00:00Z":             time.Date(2000, 2, 29, 0, 0, 0, 0, time.UTC),
		"0000-02-29T00:00:00Z":             time.Date(0, 2, 29, 0, 0, 0, 0, time.UTC),
		"9999-12-31T23:59:59.999999999Z":   time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
	} {
		got, err := envelope.ParseTimestamp(in)
		if err != nil || !got.Equal(want) || got.Location() != time.UTC {
			t.Errorf("ParseTimestamp(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{
		"", "Z", "2025-01-15", "2025-01-15T08:30:00", "2025-01-15T08:30:00.000",
		"2025-01-15T08:30Z", "2025-01-15T8:30:00Z", "2025-1-15T08:30:00Z",
		"2025-01-15t08:30:00Z", "2025-01-15T08:30:00z", "2025-01-15 08:30:00Z",
		"2025-01-15T08:30:00.Z", "2025-01-15T08:30:00,5Z", "2025-01-15T08:30:00.5.5Z",
		"2025-01-15T08:30:00-00:00", "2025-01-15T09:30:00+01:00", "2025-01-15T08:30:00+0000",
		"2025-01-15T08:30:00+00", "2025-01-15T08:30:00+00:00Z", "2025-01-15T08:30:00ZZ",
		"2025-01-15T08:30:00Z ", " 2025-01-15T08:30:00Z", "20250115T083000Z",
		"+02025-01-15T08:30:00Z", "2025-015T08:30:00Z", "2025-W03-3T08:30:00Z",
		"2025-13-01T00:00:00Z", "2025-00-01T00:00:00Z", "2025-01-00T00:00:00Z",
		"2025-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2025-04-31T00:00:00Z",
		"2025-01-15T24:00:00Z", "2025-01-15T23:60:00Z", "2016-12-31T23:59:60Z",
		"２025-01-15T08:30:00Z", "1736929800", "2025-01-15T08:30:00.１Z",
	} {
		_, err := envelope.ParseTimestamp(bad)
		if !errors.Is(err, envelope.ErrInvalidTimestamp) {
			t.Errorf("ParseTimestamp(%q) = %v, want ErrInvalidTimestamp", bad, err)
		}
	}
	long := "2025-01-15T08:30:00." + strings.Repeat("1", 10000) + "x"
	if _, err := envelope.ParseTimestamp(long); err == nil || len(err.Error()) > 200 {
		t.Errorf("long input: %v", err)
	}
}

// TestDecodeTimestampErrorIsTyped: an envelope timestamp that breaks the
// rule is a *FieldError for "timestamp" that also matches
// ErrInvalidTimestamp, as a payload timestamp's error does.
func TestDecodeTimestampErrorIsTyped(t *testing.T) {
	_, err := envelope.Decode(obj(with(submit, "timestamp", q("2025-01-15T08:30:00,5Z"))))
	var fe *envelope.FieldError
	if !errors.As(err, &fe) || fe.Field != envelope.FieldTimestamp || !errors.Is(err, envelope.ErrInvalidTimestamp) {
		t.Fatalf("got %v", err)
	}
}

// TestEncodeKeepsMilliseconds: what this project emits is unchanged by the
// wider rule: UTC, three fraction digits, "Z", finer precision truncated.
func TestEncodeKeepsMilliseconds(t *testing.T) {
	at := time.Date(2025, 1, 15, 9, 30, 0, 123456789, time.FixedZone("CET", 3600))
	e := &envelope.Envelope{HCPVersion: "1.0", MessageID: msgID, Timestamp: at, Type: envelope.TypeTaskSubmit, Payload: []byte("{}")}
	b, err := envelope.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"timestamp":"2025-01-15T08:30:00.123Z"`) {
		t.Errorf("Encode wrote %s", b)
	}
	if got := envelope.FormatTimestamp(at); got != "2025-01-15T08:30:00.123Z" {
		t.Errorf("FormatTimestamp = %q", got)
	}
}
