package envelope

import (
	"errors"
	"time"
)

// ErrInvalidTimestamp is matched (errors.Is) by every error ParseTimestamp
// returns, and by the *FieldError Decode returns for a malformed envelope
// timestamp. pkg/hcp/task uses the same value, so one errors.Is test covers
// envelope and payload timestamps alike.
var ErrInvalidTimestamp = errors.New("invalid timestamp")

// ParseTimestamp is the one rule for every HCP timestamp: the envelope's
// (Decode uses it) and every payload's (task.ParseTimestamp delegates to
// it), so the two can never disagree again. It returns the instant in
// time.UTC with the precision it was written with.
//
// L1 says "Timestamps MUST use ISO 8601 format in UTC (e.g.,
// 2025-01-15T08:30:00.000Z)". The example fixes the representation (a
// complete calendar date and time of day in extended format) but not the
// precision, which ISO 8601 leaves open. What is accepted:
//
//	YYYY-MM-DD "T" hh:mm:ss [ "." 1*DIGIT ] ( "Z" / "+00:00" )
//
// with
//
//   - any number of fraction digits: none, milliseconds, microseconds,
//     nanoseconds (digits past the ninth are truncated; time.Time has no
//     finer resolution);
//   - UTC written "Z" or "+00:00": ISO 8601 gives both for UTC, and common
//     encoders produce the second (Python's isoformat).
//
// Where ISO 8601 offers alternatives the spec's example does not use, this
// rule takes the form that is ISO 8601 and RFC 3339 at once (RFC 3339 is
// the profile of ISO 8601 for Internet protocols), so every timestamp it
// accepts is valid under both and any RFC 3339 or ISO 8601 parser reads it
// the same way:
//
//   - refused: lowercase "t"/"z" (RFC 3339 only), a comma as decimal sign,
//     basic format, reduced precision (no seconds), week and ordinal dates,
//     expanded years (ISO 8601 only), a space for "T";
//   - refused: "-00:00", which RFC 3339 defines as "UTC time, local offset
//     unknown" and ISO 8601 does not allow, and every other offset: L1
//     requires UTC;
//   - refused: a leap second (second 60) and hour 24: time.Time cannot
//     represent them, and no leap second has been inserted since 2016.
func ParseTimestamp(s string) (time.Time, error) {
	t, reason := parseISO8601UTC(s)
	if reason != "" {
		return time.Time{}, &timestampError{value: s, reason: reason}
	}
	return t, nil
}

// FormatTimestamp is how this project writes every timestamp: UTC,
// millisecond precision, "Z", as in L1's example and JavaScript's
// Date.toISOString. Finer precision is truncated.
func FormatTimestamp(t time.Time) string { return t.UTC().Format(TimestampLayout) }

// appendTimestamp appends t as FormatTimestamp writes it, without
// interpreting the layout (once per message on a publisher's hot path).
// A year outside 0..9999, which no valid envelope has, takes
// time.AppendFormat.
func appendTimestamp(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, TimestampLayout)
	}
	hour, minute, sec := t.Clock()
	b = appendDigits(b, year, 4)
	b = appendDigits(append(b, '-'), int(month), 2)
	b = appendDigits(append(b, '-'), day, 2)
	b = appendDigits(append(b, 'T'), hour, 2)
	b = appendDigits(append(b, ':'), minute, 2)
	b = appendDigits(append(b, ':'), sec, 2)
	b = appendDigits(append(b, '.'), t.Nanosecond()/1e6, 3)
	return append(b, 'Z')
}

// appendDigits appends v (0 <= v < 10^width) in width decimal digits.
func appendDigits(b []byte, v, width int) []byte {
	var d [4]byte
	for i := width - 1; i >= 0; i-- {
		d[i] = byte('0' + v%10)
		v /= 10
	}
	return append(b, d[:width]...)
}

// timestampError keeps ParseTimestamp's message short and bounded (the
// value is attacker-controlled) while matching ErrInvalidTimestamp.
type timestampError struct{ value, reason string }

func (e *timestampError) Error() string {
	return ErrInvalidTimestamp.Error() + " " + quoteShort(e.value) + ": " + e.reason +
		"; want ISO 8601 UTC like 2025-01-15T08:30:00.000Z"
}

func (e *timestampError) Unwrap() error { return ErrInvalidTimestamp }

// parseISO8601UTC implements ParseTimestamp's grammar by hand: time.Parse
// with RFC 3339 layouts is looser (it takes a one-digit hour, a comma and
// "-00:00"), and the rule must say exactly what it accepts.
func parseISO8601UTC(s string) (time.Time, string) {
	// "YYYY-MM-DDThh:mm:ss" is 19 bytes; the shortest zone is "Z".
	const shape = "dddd-dd-ddTdd:dd:dd"
	if len(s) < len(shape)+1 {
		return time.Time{}, "too short"
	}
	for i := 0; i < len(shape); i++ {
		if shape[i] == 'd' {
			if s[i] < '0' || s[i] > '9' {
				return time.Time{}, "not YYYY-MM-DDThh:mm:ss"
			}
		} else if s[i] != shape[i] {
			return time.Time{}, "not YYYY-MM-DDThh:mm:ss"
		}
	}
	year, month, day := num(s[0:4]), num(s[5:7]), num(s[8:10])
	hour, minute, sec := num(s[11:13]), num(s[14:16]), num(s[17:19])
	switch {
	case month < 1 || month > 12:
		return time.Time{}, "month out of range"
	case day < 1 || day > daysIn(year, month):
		return time.Time{}, "day out of range"
	case hour > 23:
		return time.Time{}, "hour out of range"
	case minute > 59:
		return time.Time{}, "minute out of range"
	case sec > 59:
		return time.Time{}, "second out of range (no leap seconds)"
	}

	rest := s[len(shape):]
	nsec := 0
	if rest[0] == '.' {
		n := 1
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			if n <= 9 {
				nsec = nsec*10 + int(rest[n]-'0')
			}
			n++
		}
		if n == 1 {
			return time.Time{}, "no digits after the decimal point"
		}
		for d := n; d <= 9; d++ { // scale to nanoseconds
			nsec *= 10
		}
		rest = rest[n:]
	}
	if rest != "Z" && rest != "+00:00" {
		return time.Time{}, "must end in Z (UTC)"
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC), ""
}

// num converts a run of ASCII digits already checked by the caller.
func num(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		n = n*10 + int(s[i]-'0')
	}
	return n
}

// daysIn is the length of a month in the proleptic Gregorian calendar, the
// calendar ISO 8601 and time.Time use (year 0 is a leap year).
func daysIn(year, month int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
