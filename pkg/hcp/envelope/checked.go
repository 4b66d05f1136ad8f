package envelope

import (
	"errors"
	"strconv"
	"unicode/utf8"
)

// CheckObject checks b as Validate checks an envelope's payload: valid
// UTF-8, exactly one JSON object (surrounding whitespace allowed), no
// duplicate keys in any object of it, nesting within encoding/json's
// limit. The error says why without naming a field (b may be a part of a
// payload, such as an event's data, that its producer checks before the
// payload is built: see NewPublishingUnchecked).
func CheckObject(b []byte) error {
	err := checkPayload(b)
	var fe *FieldError
	if !errors.As(err, &fe) {
		return err
	}
	var se *SyntaxError
	if errors.As(fe.Err, &se) {
		return errors.New(se.Reason + " at offset " + strconv.Itoa(se.Offset))
	}
	if fe.Err != nil {
		return fe.Err
	}
	return errors.New(fe.Reason)
}

// MembersChecked is Members with the rules of CheckObject: obj must be
// valid UTF-8 and no object nested in a member's value may have duplicate
// keys. The members of obj itself are all given to fn, duplicates
// included: fn refuses a key it saw already. One pass over obj (and
// utf8.Valid's), for a producer that checks a part of a payload while it
// takes it apart, where CheckObject and Members would scan it twice.
func MembersChecked(obj []byte, fn func(key, value []byte) error) error {
	if !utf8.Valid(obj) {
		return errors.New("not valid UTF-8")
	}
	s := scanner{data: obj, maxDepth: hardMaxDepth, checkDup: true}
	return s.topMembers(fn)
}

// topMembers scans s.data as one object member by member (see Members).
func (s *scanner) topMembers(fn func(key, value []byte) error) error {
	s.skipWS()
	if s.pos >= len(s.data) || s.data[s.pos] != '{' {
		return s.syntaxErr("expected a JSON object")
	}
	err := s.members(nil, func(key, value []byte, err error) error {
		if err != nil {
			return err
		}
		return fn(key, value)
	})
	if err != nil {
		return err
	}
	s.skipWS()
	if s.pos != len(s.data) {
		return s.syntaxErr("trailing data after the JSON object")
	}
	return nil
}
