package envelope

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// checkVersion: MAJOR.MINOR, each a non-empty run of ASCII digits without
// leading zeros (as in SemVer, so "01.0" cannot pass for "1.0"). A well-formed
// version with another major is ErrUnsupportedVersion.
func checkVersion(v string) *FieldError {
	if v == "" {
		return &FieldError{Field: FieldHCPVersion, Reason: reasonRequired}
	}
	dot := -1
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '.' && dot < 0:
			dot = i
		case c >= '0' && c <= '9':
		default:
			return &FieldError{Field: FieldHCPVersion, Reason: "must be MAJOR.MINOR (digits), got " + strconv.Quote(v)}
		}
	}
	if dot <= 0 || dot == len(v)-1 {
		return &FieldError{Field: FieldHCPVersion, Reason: "must be MAJOR.MINOR (digits), got " + strconv.Quote(v)}
	}
	major, minor := v[:dot], v[dot+1:]
	if (len(major) > 1 && major[0] == '0') || (len(minor) > 1 && minor[0] == '0') {
		return &FieldError{Field: FieldHCPVersion, Reason: "version numbers must not have leading zeros, got " + strconv.Quote(v)}
	}
	if major != SupportedMajor {
		return &FieldError{
			Field:  FieldHCPVersion,
			Reason: "major version " + major + " is not supported (supported: " + SupportedMajor + ")",
			Err:    ErrUnsupportedVersion,
		}
	}
	return nil
}

// IsUUIDv4 reports whether s is a UUID in canonical 8-4-4-4-12 hex form
// (either letter case) with version 4 and the RFC 4122 variant. Other UUID
// spellings (braces, "urn:uuid:", no dashes) are rejected.
//
// Letter case is a choice where L1 is silent (it says "UUID v4" only): both
// cases are accepted because RFC 9562 (section 4) has UUIDs output in
// lowercase but "case insensitive on input", so a peer that writes
// uppercase is still writing a UUID. Whatever keys on an id compares it
// case-insensitively (FromDelivery, topology.SessionID); this project
// writes lowercase (NewMessageID).
func IsUUIDv4(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
			continue
		case 14: // version nibble
			if c != '4' {
				return false
			}
			continue
		case 19: // variant nibble: 10xx
			switch c {
			case '8', '9', 'a', 'b', 'A', 'B':
				continue
			}
			return false
		}
		if !isHex(c) {
			return false
		}
	}
	return true
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func checkMessageID(id string) *FieldError {
	if id == "" {
		return &FieldError{Field: FieldMessageID, Reason: reasonRequired}
	}
	if !IsUUIDv4(id) {
		return &FieldError{Field: FieldMessageID, Reason: "must be a UUID v4, got " + quoteShort(id)}
	}
	return nil
}

// parseTimestamp applies the one timestamp rule (ParseTimestamp) to the
// envelope field; checkTime then applies the envelope's range.
func parseTimestamp(s string) (time.Time, *FieldError) {
	t, err := ParseTimestamp(s)
	if err != nil {
		return time.Time{}, &FieldError{Field: FieldTimestamp, Reason: err.Error(), Err: err}
	}
	return t, nil
}

var (
	minTime = time.Unix(0, 0).UTC()
	maxTime = time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC)
)

// checkTime accepts any precision: L1 does not fix one, and a received
// envelope must validate as it was written. Encode writes milliseconds, so
// finer precision is truncated on the way out (what this project emits is
// unchanged).
func checkTime(t time.Time) *FieldError {
	if t.IsZero() {
		return &FieldError{Field: FieldTimestamp, Reason: reasonRequired}
	}
	// The AMQP timestamp property the envelope timestamp maps to is an
	// unsigned POSIX time, so nothing before the epoch can be carried; the
	// four-digit year bounds the other end.
	if t.Before(minTime) || t.After(maxTime) {
		return &FieldError{Field: FieldTimestamp, Reason: "must be within 1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999999999Z"}
	}
	return nil
}

func checkType(t MessageType) *FieldError {
	if t == "" {
		return &FieldError{Field: FieldType, Reason: reasonRequired}
	}
	if !t.Known() {
		return &FieldError{Field: FieldType, Reason: "unknown message type " + quoteShort(string(t))}
	}
	return nil
}

// checkSession assumes t is known.
func checkSession(t MessageType, sid *string) *FieldError {
	if !t.RequiresSession() {
		if sid != nil {
			return &FieldError{Field: FieldSessionID, Reason: "must be null for " + string(t)}
		}
		return nil
	}
	if sid == nil {
		return &FieldError{Field: FieldSessionID, Reason: "required (non-null) for " + string(t)}
	}
	if !IsUUIDv4(*sid) {
		return &FieldError{Field: FieldSessionID, Reason: "must be a UUID v4, got " + quoteShort(*sid)}
	}
	return nil
}

// checkPayload validates a payload built in Go: valid UTF-8, exactly one
// JSON object (surrounding whitespace allowed), no duplicate keys anywhere.
func checkPayload(p []byte) error {
	if len(p) == 0 {
		return &FieldError{Field: FieldPayload, Reason: reasonRequired}
	}
	if !utf8.Valid(p) {
		return &FieldError{Field: FieldPayload, Reason: "not valid UTF-8"}
	}
	s := scanner{data: p, maxDepth: hardMaxDepth, checkDup: true}
	s.skipWS()
	if s.pos >= len(p) || p[s.pos] != '{' {
		return &FieldError{Field: FieldPayload, Reason: "must be a JSON object"}
	}
	if err := s.value(0); err != nil {
		return &FieldError{Field: FieldPayload, Reason: err.Error(), Err: err}
	}
	s.skipWS()
	if s.pos != len(p) {
		return &FieldError{Field: FieldPayload, Reason: "trailing data after the JSON object"}
	}
	return nil
}

// quoteShort quotes an attacker-controlled value for an error message,
// bounded in length.
func quoteShort(s string) string {
	const max = 64
	if len(s) > max {
		return strconv.Quote(s[:max]) + "..."
	}
	return strconv.Quote(s)
}
