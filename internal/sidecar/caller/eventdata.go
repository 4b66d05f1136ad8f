package caller

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// decodeEventData is p.Decode(): the event's typed data, validated. A
// progress event, most of a session's events, in its plain form is read
// in one pass without reflection (progressData); encoding/json's decode of
// its data into the struct was the largest part of decoding a delivery.
// Anything else, and every event the fast path would reject, goes through
// p.Decode(), so what is accepted, and every error's wording, is the same
// (TestDecodeEventData, FuzzDecodeEventData).
func decodeEventData(p *session.EventPayload) (session.EventData, error) {
	if p.EventType == session.EventProgress && p.Sequence >= 1 {
		if d, ok := progressData(p.Data); ok && d.Validate() == nil {
			return d, nil
		}
	}
	return p.Decode()
}

// errNotPlain stops progressData's scan at anything it leaves to
// encoding/json.
var errNotPlain = errors.New("not a plain progress data object")

// progressData decodes a progress event's data, a JSON object (the
// envelope decoder has checked its syntax), into the struct json.Unmarshal
// would fill, and reports false where json.Unmarshal might do something
// else: a key that is not exactly one of the struct's (encoding/json
// matches keys case-insensitively too), a key twice, a value of another
// type, a number that does not parse as a float64.
func progressData(raw []byte) (*session.ProgressData, bool) {
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, false
	}
	d := &session.ProgressData{}
	var seen [3]bool
	once := func(i int) error {
		if seen[i] {
			return errNotPlain
		}
		seen[i] = true
		return nil
	}
	err := envelope.Members(raw, func(key, value []byte) error {
		var err error
		switch string(key) {
		case "stage":
			if err = once(0); err == nil {
				d.Stage, err = optString(value)
			}
		case "message":
			if err = once(1); err == nil {
				d.Message, err = optString(value)
			}
		case "percent":
			if err = once(2); err == nil && string(value) != "null" {
				d.Percent, err = float(value)
			}
		default:
			err = errNotPlain
		}
		return err
	})
	return d, err == nil
}

// optString is a JSON string value as encoding/json decodes it into a
// string field ("" for null, which leaves the field as it is).
func optString(value []byte) (string, error) {
	if string(value) == "null" {
		return "", nil
	}
	s, ok := envelope.String(value)
	if !ok {
		return "", errNotPlain
	}
	return s, nil
}

// float is a JSON number value as encoding/json decodes it into a
// *float64.
func float(value []byte) (*float64, error) {
	if len(value) == 0 || (value[0] != '-' && (value[0] < '0' || value[0] > '9')) {
		return nil, errNotPlain
	}
	f, err := strconv.ParseFloat(string(value), 64)
	if err != nil {
		return nil, errNotPlain
	}
	return &f, nil
}
