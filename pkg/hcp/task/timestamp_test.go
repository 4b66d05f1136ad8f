package task

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

func TestTimestamp(t *testing.T) {
	ref := time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
	}{
		{"2025-01-15T08:30:00.000Z", ref},
		{"2025-01-15T08:30:00Z", ref},
		{"2025-01-15T08:30:00+00:00", ref},
		{"2025-01-15T08:30:00.123456789Z", ref.Add(123456789)},
		{"2025-01-15T08:30:00.123456Z", ref.Add(123456 * time.Microsecond)},
	} {
		got, err := ParseTimestamp(tc.in)
		if err != nil || !got.Equal(tc.want) || got.Location() != time.UTC {
			t.Errorf("ParseTimestamp(%q) = %v, %v", tc.in, got, err)
		}
	}
	for _, bad := range []string{"", "2025-01-15", "2025-01-15T08:30:00", "2025-01-15T09:30:00+01:00",
		"2025-01-15 08:30:00Z", "1736929800", "2025-13-01T00:00:00Z",
		// time.Parse took these before payloads shared the envelope's
		// rule; none is ISO 8601 in UTC.
		"2025-01-15T8:30:00Z", "2025-01-15T08:30:00,5Z", "2025-01-15T08:30:00-00:00"} {
		if _, err := ParseTimestamp(bad); !errors.Is(err, ErrInvalidTimestamp) {
			t.Errorf("ParseTimestamp(%q) = %v, want ErrInvalidTimestamp", bad, err)
		}
	}
	if got := FormatTimestamp(ref.Add(1500 * time.Microsecond).In(time.FixedZone("x", 3600))); got != "2025-01-15T08:30:00.001Z" {
		t.Errorf("FormatTimestamp = %q", got)
	}

	ts := NewTimestamp(time.Now())
	b, err := json.Marshal(ts)
	if err != nil {
		t.Fatal(err)
	}
	var back Timestamp
	if err := json.Unmarshal(b, &back); err != nil || back != ts {
		t.Fatalf("round trip %s: got %v, %v; want %v", b, back, err, ts)
	}
	if err := json.Unmarshal([]byte(`null`), &back); err != nil || back != ts {
		t.Errorf("null changed the value: %v, %v", back, err)
	}
	if err := json.Unmarshal([]byte(`12`), &back); !errors.Is(err, ErrInvalidTimestamp) {
		t.Errorf("Unmarshal(12) = %v", err)
	}
	if _, err := json.Marshal(Timestamp{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}); err == nil {
		t.Error("Marshal of year 10000 succeeded")
	}
	if p := TimestampPtr(ref); p.Time != ref || p.String() != "2025-01-15T08:30:00.000Z" {
		t.Errorf("TimestampPtr = %v", p)
	}
}

// TestTimestampRuleIsTheEnvelopes: payloads and the envelope share one rule
// and one error, so they cannot disagree on what a timestamp is.
func TestTimestampRuleIsTheEnvelopes(t *testing.T) {
	if ErrInvalidTimestamp != envelope.ErrInvalidTimestamp || TimestampLayout != envelope.TimestampLayout {
		t.Fatal("task and envelope timestamp rules differ")
	}
	for _, in := range []string{"2025-01-15T08:30:00Z", "2025-01-15T08:30:00.123456Z", "2025-01-15T08:30:00.000+00:00", "2025-01-15T08:30:00,5Z", "x"} {
		got, err := ParseTimestamp(in)
		want, werr := envelope.ParseTimestamp(in)
		if !got.Equal(want) || (err == nil) != (werr == nil) {
			t.Errorf("%q: task %v, %v; envelope %v, %v", in, got, err, want, werr)
		}
	}
}
