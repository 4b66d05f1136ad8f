package callee

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// The fast path of parseEvent. The general path (decodeStrict, then
// checkEvent) scans an event three times and decodes it twice by
// reflection: about 30 µs of the sidecar's CPU per event, a fifth of its
// work on an event. An event in the plain form every harness writes is
// taken apart in one checked pass instead (envelope.MembersChecked: the
// syntax, UTF-8, duplicate keys and depth, as the envelope's Validate
// would check the data later), its data decoded without reflection. The
// fast path accepts only what the general path accepts, with the same
// result (FuzzParseEventFast); for anything else (an error to word, a
// key in another letter case, a null, a number out of range, data that
// does not validate) it gives up and the general path decides.

// errNotPlain stops the fast path's scan: the general path decides.
var errNotPlain = errors.New("not in the plain form")

// parseEventFast parses one event in the plain form: the keys event_type,
// data and idempotency_key each at most once, spelled so; event_type a
// harness event type; data an object of at most the size limit whose
// members decode as the type's fields without a conversion, and that
// validates. ok is false for anything else.
func parseEventFast(b []byte) (ev harnessEvent, ok bool) {
	var seen uint8
	var data []byte
	err := envelope.MembersChecked(b, func(key, value []byte) error {
		var bit uint8
		var ok bool
		switch string(key) {
		case "event_type":
			bit = 1
			var s string
			s, ok = plainString(value)
			ev.EventType = session.EventType(s)
		case keyData:
			bit, data, ok = 2, value, value[0] == '{'
		case "idempotency_key":
			bit = 4
			ev.IdempotencyKey, ok = plainString(value)
		}
		if !ok || seen&bit != 0 {
			return errNotPlain
		}
		seen |= bit
		return nil
	})
	if err != nil || seen&3 != 3 || !ev.EventType.HarnessEmittable() || len(data) > maxEventBody-1024 {
		return harnessEvent{}, false
	}
	// The line's buffer is the reader's: data and the fields decoded from
	// it share one copy.
	ev.Data = bytes.Clone(data)
	d, ok := decodeEventData(ev.EventType, ev.Data)
	if !ok || d.Validate() != nil {
		return harnessEvent{}, false
	}
	ev.decoded = d
	return ev, true
}

// parseBatchFast is parseEventFast for a batch of 1 to maxBatchSize
// events, each in the plain form; ok is false for anything else.
func parseBatchFast(body []byte) ([]harnessEvent, bool) {
	var items []json.RawMessage
	if json.Unmarshal(body, &items) != nil || len(items) == 0 || len(items) > maxBatchSize {
		return nil, false
	}
	evs := make([]harnessEvent, len(items))
	for i, it := range items {
		ev, ok := parseEventFast(it)
		if !ok {
			return nil, false
		}
		evs[i] = ev
	}
	return evs, true
}

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

// decodeEventData decodes the data of a harness event type without
// reflection; ok is false when it is not in the plain form.
func decodeEventData(et session.EventType, data []byte) (session.EventData, bool) {
	switch et {
	case session.EventProgress:
		d := &session.ProgressData{}
		return d, decodeFields(data, progressFields, func(i int, v []byte) bool {
			switch i {
			case 0:
				return setString(&d.Stage, v)
			case 1:
				return setFloat(&d.Percent, v)
			}
			return setString(&d.Message, v)
		})
	case session.EventIntermediateResult:
		d := &session.IntermediateResultData{}
		return d, decodeFields(data, intermediateFields, func(i int, v []byte) bool {
			switch i {
			case 0:
				return setString(&d.ResultType, v)
			case 1:
				return setRaw(&d.Data, v)
			}
			return setBool(&d.IsPartial, v)
		})
	case session.EventLog:
		d := &session.LogData{}
		return d, decodeFields(data, logFields, func(i int, v []byte) bool {
			switch i {
			case 0:
				return setString((*string)(&d.Level), v)
			case 1:
				return setString(&d.Message, v)
			}
			return setRaw(&d.Details, v)
		})
	case session.EventWarning:
		d := &session.WarningData{}
		return d, decodeFields(data, warningFields, func(i int, v []byte) bool {
			switch i {
			case 0:
				return setString(&d.Code, v)
			case 1:
				return setString(&d.Message, v)
			}
			return setRaw(&d.Details, v)
		})
	case session.EventError:
		d := &session.ErrorData{}
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
	return string(v) != "null"
}
