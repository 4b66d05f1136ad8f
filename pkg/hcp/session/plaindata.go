package session

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// The fast path of EventPayload.Decode. encoding/json's decode of an
// event's data into its struct (reflection, a scan to check it, another
// to decode) was the largest part of decoding an event, on both sidecars'
// hot paths. Data of a harness event type in the plain form every harness
// writes is decoded in one pass without reflection instead; anything else
// (a key in another letter case, a null, a value of another type, a number
// out of range, data that does not validate) is left to encoding/json, so
// what Decode accepts and every error's wording are the same
// (TestDecodePlain, FuzzDecodePlain).

// errNotPlain stops the fast path's scan: encoding/json decides.
var errNotPlain = errors.New("not in the plain form")

// plainString is a JSON string value as encoding/json decodes it; ok is
// false for any other value (null included).
func plainString(v []byte) (string, bool) {
	if v[0] != '"' {
		return "", false
	}
	return envelope.String(v)
}

// JSON names that recur in an event.
const (
	keyData    = "data"
	keyMessage = "message"
)

// The JSON names of the fields of each harness event type's data.
var (
	progressFields     = []string{"stage", "percent", keyMessage}
	intermediateFields = []string{"result_type", keyData, "is_partial"}
	logFields          = []string{"level", keyMessage, "details"}
	warningFields      = []string{"code", keyMessage, "details"}
	errorFields        = []string{"code", keyMessage, "recoverable"}
)

// decodePlain decodes the data of a harness event type without
// reflection; ok is false when it is not in the plain form.
func decodePlain(et EventType, data []byte) (EventData, bool) {
	switch et {
	case EventProgress:
		d := &ProgressData{}
		return d, decodeFields(data, progressFields, func(i int, v []byte) bool {
			switch i {
			case 0:
				return setString(&d.Stage, v)
			case 1:
				return setFloat(&d.Percent, v)
			}
			return setString(&d.Message, v)
		})
	case EventIntermediateResult:
		d := &IntermediateResultData{}
		return d, decodeFields(data, intermediateFields, func(i int, v []byte) bool {
			switch i {
			case 0:
				return setString(&d.ResultType, v)
			case 1:
				return setRaw(&d.Data, v)
			}
			return setBool(&d.IsPartial, v)
		})
	case EventLog:
		d := &LogData{}
		return d, decodeFields(data, logFields, func(i int, v []byte) bool {
			switch i {
			case 0:
				return setString((*string)(&d.Level), v)
			case 1:
				return setString(&d.Message, v)
			}
			return setRaw(&d.Details, v)
		})
	case EventWarning:
		d := &WarningData{}
		return d, decodeFields(data, warningFields, func(i int, v []byte) bool {
			switch i {
			case 0:
				return setString(&d.Code, v)
			case 1:
				return setString(&d.Message, v)
			}
			return setRaw(&d.Details, v)
		})
	case EventError:
		d := &ErrorData{}
		return d, decodeFields(data, errorFields, func(i int, v []byte) bool {
			switch i {
			case 0:
				return setString(&d.Code, v)
			case 1:
				return setString(&d.Message, v)
			}
			return setBool(&d.Recoverable, v)
		})
	}
	return nil, false
}

// decodeFields calls set with the index in names of each member's key
// (spelled exactly so) and its value. A key encoding/json would match to
// a field in another letter case, or a value set does not take as is,
// makes it false; other keys are ignored, as encoding/json ignores them.
func decodeFields(data []byte, names []string, set func(i int, v []byte) bool) bool {
	return envelope.Members(data, func(key, value []byte) error {
		for i, name := range names {
			if string(key) == name {
				if !set(i, value) {
					return errNotPlain
				}
				return nil
			}
		}
		for _, name := range names {
			if strings.EqualFold(name, string(key)) {
				return errNotPlain
			}
		}
		for _, c := range key {
			if c >= 0x80 { // encoding/json folds some non-ASCII letters too
				return errNotPlain
			}
		}
		return nil
	}) == nil
}

// The setters take a value only in the form encoding/json stores as is
// (no null: encoding/json leaves a field alone, or stores "null").
func setString(dst *string, v []byte) (ok bool) {
	*dst, ok = plainString(v)
	return ok
}

func setFloat(dst **float64, v []byte) bool {
	if v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		return false
	}
	f, err := strconv.ParseFloat(string(v), 64)
	*dst = &f
	return err == nil
}

func setBool(dst *bool, v []byte) bool {
	*dst = string(v) == "true"
	return *dst || string(v) == "false"
}

func setRaw(dst *json.RawMessage, v []byte) bool {
	*dst = v
	return string(v) != jsonNull
}

// jsonNull is the JSON null literal.
const jsonNull = "null"
