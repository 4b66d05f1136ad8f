package callee

import (
	"bytes"
	"encoding/json"
	"errors"

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
	d, err := (&session.EventPayload{EventType: ev.EventType, Sequence: 1, Data: ev.Data}).Decode()
	if err != nil {
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

// keyData is the event's data member.
const keyData = "data"
