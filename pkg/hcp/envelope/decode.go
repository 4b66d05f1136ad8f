package envelope

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxEnvelopeBytes is the default limit on an encoded envelope (1 MiB). L1
// says binary data travels by URI, so real envelopes are far smaller; the
// limit bounds what a peer can make a receiver parse and hold.
const MaxEnvelopeBytes = 1 << 20

// DefaultMaxDepth is the default limit on JSON nesting, counting the
// envelope object itself (so a payload may nest 63 levels). It protects
// every later consumer of the payload, not only this parser.
const DefaultMaxDepth = 64

// Decoder decodes envelopes with configurable limits. The zero value uses
// the defaults.
type Decoder struct {
	// MaxBytes limits the body size; <= 0 means MaxEnvelopeBytes.
	MaxBytes int
	// MaxDepth limits JSON nesting; <= 0 means DefaultMaxDepth.
	MaxDepth int
}

// Decode decodes and validates body with the default limits.
func Decode(body []byte) (*Envelope, error) { return Decoder{}.Decode(body) }

type fieldIndex int

const (
	idxVersion fieldIndex = iota
	idxMessageID
	idxTimestamp
	idxSessionID
	idxType
	idxPayload
	numFields
)

func lookupField(name []byte) fieldIndex {
	switch string(name) {
	case FieldHCPVersion:
		return idxVersion
	case FieldMessageID:
		return idxMessageID
	case FieldTimestamp:
		return idxTimestamp
	case FieldSessionID:
		return idxSessionID
	case FieldType:
		return idxType
	case FieldPayload:
		return idxPayload
	}
	return -1
}

// Decode checks the size limit before anything else, then UTF-8, then
// parses body strictly and validates every L1 rule. Errors are ErrTooLarge
// (wrapped), *SyntaxError (matches ErrMalformed) or *FieldError.
//
// Strictness, and why:
//   - Unknown top-level keys are rejected. L1 is silent on them (its table
//     lists six fields and says nothing of others), so this is a choice:
//     the envelope is the input to the L3 gate, and a key this decoder
//     ignores might be honoured by another implementation (or a later
//     version of this one) and so carry meaning past the gate unchecked.
//     L1 gives "layer-specific content" the payload, where unknown fields
//     are tolerated (pkg/hcp/task). The cost: a future minor version that
//     adds an envelope field is refused by name ("unknown field") rather
//     than half understood.
//   - Keys match exactly. encoding/json would bind "Message_ID" to
//     message_id.
//   - Duplicate keys are rejected at every depth, in the payload too:
//     parsers disagree on which duplicate wins, which lets one message carry
//     two values (say two caller_ids) to two readers.
//   - session_id must be present even when null: "missing" and "null" are
//     different inputs and only the explicit null is what L1 shows.
//
// The returned envelope does not alias body.
func (d Decoder) Decode(body []byte) (*Envelope, error) {
	limit := d.MaxBytes
	if limit <= 0 {
		limit = MaxEnvelopeBytes
	}
	if len(body) > limit {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(body), limit)
	}
	if !utf8.Valid(body) {
		return nil, &SyntaxError{Offset: firstInvalidUTF8(body), Reason: "invalid UTF-8"}
	}
	depth := d.MaxDepth
	if depth <= 0 {
		depth = DefaultMaxDepth
	}

	var spans [numFields][]byte // raw JSON value of each field; nil = absent
	s := scanner{data: body, maxDepth: depth, checkDup: true}
	s.skipWS()
	if s.pos >= len(body) {
		return nil, s.syntaxErr("empty body")
	}
	if body[s.pos] != '{' {
		return nil, s.syntaxErr("envelope must be a JSON object")
	}
	var idx fieldIndex // the field of the member being scanned
	err := s.members(func(name []byte) error {
		idx = lookupField(name)
		if idx < 0 {
			return &FieldError{Field: truncateName(string(name)), Reason: "unknown field"}
		}
		if spans[idx] != nil {
			return &FieldError{Field: string(name), Reason: "duplicate key"}
		}
		return nil
	}, func(name, value []byte, err error) error {
		var dup *dupKeyError
		if errors.As(err, &dup) {
			return &FieldError{Field: string(name), Reason: dup.Error()}
		}
		if err != nil {
			return err
		}
		spans[idx] = value
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.skipWS()
	if s.pos != len(body) {
		return nil, s.syntaxErr("trailing data after the envelope")
	}
	return build(&spans)
}

// build converts the raw field values into an Envelope, checking the rules
// in the same order as Validate.
func build(spans *[numFields][]byte) (*Envelope, error) {
	e := &Envelope{}
	var fe *FieldError

	if e.HCPVersion, fe = stringField(spans[idxVersion], FieldHCPVersion); fe != nil {
		return nil, fe
	}
	if fe = checkVersion(e.HCPVersion); fe != nil {
		return nil, fe
	}

	if e.MessageID, fe = stringField(spans[idxMessageID], FieldMessageID); fe != nil {
		return nil, fe
	}
	if fe = checkMessageID(e.MessageID); fe != nil {
		return nil, fe
	}

	ts, fe := stringField(spans[idxTimestamp], FieldTimestamp)
	if fe != nil {
		return nil, fe
	}
	if e.Timestamp, fe = parseTimestamp(ts); fe != nil {
		return nil, fe
	}
	if fe = checkTime(e.Timestamp); fe != nil {
		return nil, fe
	}

	typ, fe := stringField(spans[idxType], FieldType)
	if fe != nil {
		return nil, fe
	}
	e.Type = MessageType(typ)
	if fe = checkType(e.Type); fe != nil {
		return nil, fe
	}

	switch raw := spans[idxSessionID]; {
	case raw == nil:
		return nil, &FieldError{Field: FieldSessionID, Reason: "required (use null for task_submit)"}
	case string(raw) == "null":
		// stays nil
	case raw[0] == '"':
		sid := unquote(raw)
		e.SessionID = &sid
	default:
		return nil, &FieldError{Field: FieldSessionID, Reason: "must be a string or null"}
	}
	if fe = checkSession(e.Type, e.SessionID); fe != nil {
		return nil, fe
	}

	switch raw := spans[idxPayload]; {
	case raw == nil:
		return nil, &FieldError{Field: FieldPayload, Reason: reasonRequired}
	case raw[0] != '{':
		return nil, &FieldError{Field: FieldPayload, Reason: "must be a JSON object"}
	default:
		e.Payload = bytes.Clone(raw)
	}
	return e, nil
}

func stringField(raw []byte, field string) (string, *FieldError) {
	if raw == nil {
		return "", &FieldError{Field: field, Reason: reasonRequired}
	}
	if raw[0] != '"' {
		return "", &FieldError{Field: field, Reason: "must be a string"}
	}
	return unquote(raw), nil
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}
