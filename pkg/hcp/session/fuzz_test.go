package session

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// FuzzEventPayload checks that decoding and validating arbitrary event
// payloads never panics, and that every accepted payload survives
// NewEvent/Decode unchanged.
func FuzzEventPayload(f *testing.F) {
	for _, s := range []string{
		`{"event_type":"progress","sequence":42,"data":{"stage":"s","percent":50,"message":"m"}}`,
		`{"event_type":"checkpoint_created","sequence":100,"data":{"checkpoint_id":"ckpt-001","description":"d","resumable":true,"created_at":"2025-01-15T10:00:00.000Z"}}`,
		`{"event_type":"state_changed","sequence":2,"data":{"from_state":"RUNNING","to_state":"RUNNING","reason":"recovered_from_checkpoint"}}`,
		`{"event_type":"session_closed","sequence":9,"data":{"final_state":"ABORTED","reason":"caller"}}`,
		`{"event_type":"intermediate_result","sequence":3,"data":{"result_type":"t","data":[1,{"a":null}],"is_partial":true}}`,
		`{"event_type":"log","sequence":1,"data":{"level":"warn","message":"m","details":{"k":1e400}}}`,
		`{"event_type":"error","sequence":1,"data":{"code":"c","message":"m","recoverable":"no"}}`,
		`{"event_type":"session_created","sequence":1,"data":{"state":"RUNNING","risk_level":"R2","session_token":"a.b.c"}}`,
		`{"event_type":"warning","sequence":-1,"data":[]}`,
		`{"event_type":"nope","sequence":1,"data":{}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p EventPayload
		if json.Unmarshal(b, &p) != nil {
			return
		}
		d, err := p.Decode()
		if err != nil {
			if p.Validate() == nil {
				t.Fatal("Decode failed but Validate passed")
			}
			return
		}
		again, err := NewEvent(p.Sequence, d)
		if err != nil {
			t.Fatalf("NewEvent rejects decoded data %#v: %v", d, err)
		}
		d2, err := again.Decode()
		if err != nil {
			t.Fatalf("re-encoded payload %s invalid: %v", again.Data, err)
		}
		if !reflect.DeepEqual(normalize(d), normalize(d2)) {
			t.Fatalf("round trip changed data:\n%#v\n%#v", d, d2)
		}
	})
}

// normalize re-encodes raw JSON fields so that equivalent spellings
// ("1.0" vs "1.0", spacing) compare equal.
func normalize(d EventData) EventData {
	fix := func(r *json.RawMessage) {
		if len(*r) == 0 {
			return
		}
		b, _ := json.Marshal(*r)
		*r = b
	}
	switch x := d.(type) {
	case *IntermediateResultData:
		c := *x
		fix(&c.Data)
		return &c
	case *LogData:
		c := *x
		fix(&c.Details)
		return &c
	case *WarningData:
		c := *x
		fix(&c.Details)
		return &c
	}
	return d
}

// FuzzUnmarshalEventPayload: the one-pass decoder agrees with json.Unmarshal
// on every payload whose keys are spelt exactly: where both succeed they
// give the same payload (a null data aside, which Decode refuses either
// way), and json.Unmarshal never succeeds where it fails.
func FuzzUnmarshalEventPayload(f *testing.F) {
	for _, s := range []string{
		`{"event_type":"progress","sequence":42,"data":{"stage":"s","percent":50,"message":"m"}}`,
		` { "sequence" : 7 , "event_type" : "l\u006fg" , "data" : { "level" : "info" } , "extra" : [1,{"a":null}] } `,
		`{"event_type":null,"sequence":null,"data":null}`,
		`{"event_type":1,"sequence":1,"data":{}}`,
		`{"event_type":"log","sequence":1.5,"data":{}}`,
		`{"event_type":"log","sequence":"1","data":{}}`,
		`{"event_type":"log","sequence":99999999999999999999,"data":{}}`,
		`{"event_type":"log","sequence":-0,"data":{}}`,
		`{"event_type":"log","sequence":1e2,"data":{}}`,
		`{}`, `[]`, `{"event_type":"log"`, `{"event_type":"log"} x`, `"s"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := UnmarshalEventPayload(b)
		var want EventPayload
		werr := json.Unmarshal(b, &want)
		if string(want.Data) == "null" {
			want.Data = nil
		}
		switch {
		case !exactKeys(b) && werr == nil:
			// json.Unmarshal binds "Sequence" too; this decoder does not.
		case err == nil && werr == nil:
			if got.EventType != want.EventType || got.Sequence != want.Sequence || string(got.Data) != string(want.Data) {
				t.Fatalf("%s: got %+v, json.Unmarshal %+v", b, got, want)
			}
		case err != nil && werr == nil:
			t.Fatalf("%s: refused (%v), json.Unmarshal took it as %+v", b, err, want)
		}
	})
}

// exactKeys reports whether no top-level key of b is a field name spelt in
// another case (which json.Unmarshal binds and this decoder ignores).
func exactKeys(b []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return false
	}
	for k := range m {
		switch {
		case k == "event_type" || k == "sequence" || k == "data":
		case strings.EqualFold(k, "event_type") || strings.EqualFold(k, "sequence") || strings.EqualFold(k, "data"):
			return false
		}
	}
	return true
}
