package envelope

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// hardMaxDepth bounds nesting where no Decoder limit applies (Validate), so
// the recursive scanner cannot be driven into a huge stack. It matches
// encoding/json's own limit.
const hardMaxDepth = 10000

// smallObject is how many keys an object may have before duplicate
// detection switches from a linear scan to a map, so a large object cannot
// make the check quadratic.
const smallObject = 16

// scanner is a single-pass JSON validator (RFC 8259 grammar, as
// encoding/json accepts it) that also bounds nesting depth and, when
// checkDup is set, rejects objects with duplicate keys. It does not check
// UTF-8: callers check the whole input first.
//
// It exists because encoding/json silently keeps the last of duplicate keys
// and matches keys case-insensitively; both let a crafted message mean one
// thing to this decoder and another to a different JSON parser.
type scanner struct {
	data     []byte
	pos      int
	maxDepth int
	checkDup bool
	// keys is a stack of the keys of the objects being scanned (raw bytes
	// between the quotes, or the unescaped form when the key has escapes).
	keys [][]byte
}

// dupKeyError is returned by the scanner for a duplicate object key.
type dupKeyError struct {
	key    string
	offset int
}

func (e *dupKeyError) Error() string {
	return "duplicate key " + quoteShort(e.key) + " at offset " + strconv.Itoa(e.offset)
}

func (s *scanner) syntaxErr(reason string) error {
	return &SyntaxError{Offset: s.pos, Reason: reason}
}

func (s *scanner) skipWS() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// value scans one JSON value starting at s.pos (no leading whitespace).
// depth is the number of containers enclosing it.
func (s *scanner) value(depth int) error {
	if s.pos >= len(s.data) {
		return s.syntaxErr("unexpected end of input, expected a value")
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		return s.object(depth + 1)
	case c == '[':
		return s.array(depth + 1)
	case c == '"':
		_, err := s.str()
		return err
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	default:
		return s.syntaxErr("invalid character " + strconv.Quote(string([]byte{c})) + " looking for a value")
	}
}

func (s *scanner) literal(lit string) error {
	if !bytes.HasPrefix(s.data[s.pos:], []byte(lit)) {
		return s.syntaxErr("invalid literal, expected " + lit)
	}
	s.pos += len(lit)
	return nil
}

func (s *scanner) digits() int {
	n := 0
	for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
		s.pos++
		n++
	}
	return n
}

func (s *scanner) number() error {
	if s.data[s.pos] == '-' {
		s.pos++
	}
	switch {
	case s.pos >= len(s.data):
		return s.syntaxErr("unexpected end of input in number")
	case s.data[s.pos] == '0':
		s.pos++
	case s.data[s.pos] >= '1' && s.data[s.pos] <= '9':
		s.digits()
	default:
		return s.syntaxErr("invalid number")
	}
	if s.pos < len(s.data) && s.data[s.pos] == '.' {
		s.pos++
		if s.digits() == 0 {
			return s.syntaxErr("invalid number: no digits after decimal point")
		}
	}
	if s.pos < len(s.data) && (s.data[s.pos] == 'e' || s.data[s.pos] == 'E') {
		s.pos++
		if s.pos < len(s.data) && (s.data[s.pos] == '+' || s.data[s.pos] == '-') {
			s.pos++
		}
		if s.digits() == 0 {
			return s.syntaxErr("invalid number: no digits in exponent")
		}
	}
	return nil
}

// str scans a string starting at the opening quote and reports whether it
// contains escapes.
func (s *scanner) str() (escaped bool, err error) {
	s.pos++ // opening quote
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		switch {
		case c == '"':
			s.pos++
			return escaped, nil
		case c == '\\':
			escaped = true
			s.pos++
			if s.pos >= len(s.data) {
				return escaped, s.syntaxErr("unexpected end of input in string escape")
			}
			switch s.data[s.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.pos++
			case 'u':
				s.pos++
				for i := 0; i < 4; i++ {
					if s.pos >= len(s.data) || !isHex(s.data[s.pos]) {
						return escaped, s.syntaxErr("invalid \\u escape in string")
					}
					s.pos++
				}
			default:
				return escaped, s.syntaxErr("invalid escape in string")
			}
		case c < 0x20:
			return escaped, s.syntaxErr("control character in string")
		default:
			s.pos++
		}
	}
	return escaped, s.syntaxErr("unexpected end of input in string")
}

func (s *scanner) array(depth int) error {
	if depth > s.maxDepth {
		return s.syntaxErr("nesting depth exceeds " + strconv.Itoa(s.maxDepth))
	}
	s.pos++ // '['
	s.skipWS()
	if s.pos < len(s.data) && s.data[s.pos] == ']' {
		s.pos++
		return nil
	}
	for {
		s.skipWS()
		if err := s.value(depth); err != nil {
			return err
		}
		s.skipWS()
		if s.pos >= len(s.data) {
			return s.syntaxErr("unexpected end of input in array")
		}
		switch s.data[s.pos] {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return nil
		default:
			return s.syntaxErr("expected ',' or ']' in array")
		}
	}
}

func (s *scanner) object(depth int) error {
	if depth > s.maxDepth {
		return s.syntaxErr("nesting depth exceeds " + strconv.Itoa(s.maxDepth))
	}
	if s.openObject() {
		return nil
	}
	base := len(s.keys)
	defer func() { s.keys = s.keys[:base] }()
	var seen map[string]struct{} // only for large objects
	for {
		key, start, err := s.objectKey(s.checkDup)
		if err != nil {
			return err
		}
		if s.checkDup {
			if seen != nil {
				if _, dup := seen[string(key)]; dup {
					return &dupKeyError{key: string(key), offset: start}
				}
				seen[string(key)] = struct{}{}
			} else {
				for _, k := range s.keys[base:] {
					if bytes.Equal(k, key) {
						return &dupKeyError{key: string(key), offset: start}
					}
				}
				s.keys = append(s.keys, key)
				if len(s.keys)-base > smallObject {
					seen = make(map[string]struct{}, 2*smallObject)
					for _, k := range s.keys[base:] {
						seen[string(k)] = struct{}{}
					}
				}
			}
		}
		if err := s.colon(); err != nil {
			return err
		}
		if err := s.value(depth); err != nil {
			return err
		}
		if done, err := s.nextMember(); done || err != nil {
			return err
		}
	}
}

// openObject consumes the '{' at s.pos and reports whether the object is
// empty (its '}' consumed too).
func (s *scanner) openObject() bool {
	s.pos++ // '{'
	s.skipWS()
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.pos++
		return true
	}
	return false
}

// objectKey scans a member's key and returns it and its offset; with
// unescape the key is decoded (else it is nil: the caller does not need
// it).
func (s *scanner) objectKey(unescape bool) ([]byte, int, error) {
	s.skipWS()
	if s.pos >= len(s.data) || s.data[s.pos] != '"' {
		return nil, 0, s.syntaxErr("expected a string object key")
	}
	start := s.pos
	escaped, err := s.str()
	if err != nil || !unescape {
		return nil, start, err
	}
	if escaped {
		return []byte(unquote(s.data[start:s.pos])), start, nil
	}
	return s.data[start+1 : s.pos-1], start, nil
}

// colon consumes the ':' after a key and the space around it.
func (s *scanner) colon() error {
	s.skipWS()
	if s.pos >= len(s.data) || s.data[s.pos] != ':' {
		return s.syntaxErr("expected ':' after object key")
	}
	s.pos++
	s.skipWS()
	return nil
}

// nextMember consumes the ',' or '}' after a member's value; done is
// true at the '}'.
func (s *scanner) nextMember() (done bool, err error) {
	s.skipWS()
	if s.pos >= len(s.data) {
		return false, s.syntaxErr("unexpected end of input in object")
	}
	switch s.data[s.pos] {
	case ',':
		s.pos++
		return false, nil
	case '}':
		s.pos++
		return true, nil
	default:
		return false, s.syntaxErr("expected ',' or '}' in object")
	}
}

// unquote decodes a JSON string token that the scanner has already
// validated. Invalid surrogate escapes become U+FFFD, as encoding/json does;
// so two keys that differ only in such escapes count as duplicates, which
// is what they are to a Go reader of the payload.
func unquote(tok []byte) string {
	if bytes.IndexByte(tok, '\\') < 0 {
		return string(tok[1 : len(tok)-1])
	}
	var out string
	if err := json.Unmarshal(tok, &out); err != nil {
		// Unreachable for a validated token; keep the raw form so a
		// caller still sees something meaningful.
		return string(tok[1 : len(tok)-1])
	}
	return out
}

// Members calls fn with each member of the JSON object obj, in order: its
// key (unescaped; valid only during the call) and its raw value (a slice of
// obj), checking the syntax as it goes (no
// duplicate-key check: the envelope's decoder has done that for a
// payload). It is one pass over obj, for a payload's fields where
// encoding/json would scan it twice and reflect; String unquotes a string
// value.
func Members(obj []byte, fn func(key, value []byte) error) error {
	s := scanner{data: obj, maxDepth: hardMaxDepth}
	return s.topMembers(fn)
}

// members scans the object at s.pos (its '{') member by member, through
// its '}'. key, if set, sees each key (unescaped) before its value is
// scanned; value sees the key and the raw value, or the error scanning
// the value, and what it returns stops the scan.
func (s *scanner) members(key func(k []byte) error, value func(k, v []byte, err error) error) error {
	if s.openObject() {
		return nil
	}
	for {
		k, _, err := s.objectKey(true)
		if err != nil {
			return err
		}
		if key != nil {
			if err := key(k); err != nil {
				return err
			}
		}
		if err := s.colon(); err != nil {
			return err
		}
		vstart := s.pos
		if err := s.value(1); err != nil {
			return value(k, nil, err)
		}
		if err := value(k, s.data[vstart:s.pos], nil); err != nil {
			return err
		}
		if done, err := s.nextMember(); done || err != nil {
			return err
		}
	}
}

// String returns the string a raw JSON string value (as Members gives it)
// holds, as encoding/json decodes it (invalid UTF-8 becomes U+FFFD), and
// false for any other value.
func String(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	if !utf8.Valid(raw) {
		var out string
		return out, json.Unmarshal(raw, &out) == nil
	}
	return unquote(raw), true
}
