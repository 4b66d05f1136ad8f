package callee

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// parseEventGeneral is parseEvent without its fast path.
func parseEventGeneral(b []byte) (harnessEvent, error) {
	var ev harnessEvent
	if err := decodeStrict(b, &ev); err != nil {
		return ev, err
	}
	return ev, checkEvent(&ev)
}

// fastSeeds are events in and just out of the plain form.
var fastSeeds = []string{
	`{"event_type":"progress","data":{"stage":"s","percent":50,"message":"m"},"idempotency_key":"k1"}`,
	` { "event_type" : "progress" , "data" : { "stage" : "a" , "percent" : 1e1 } } `,
	`{"data":{"level":"warn","message":"m\u00e9\n","details":{"a":[1,{"b":null}]},"extra":true},"event_type":"log"}`,
	`{"event_type":"intermediate_result","data":{"result_type":"t","data":{"x":[1,2]},"is_partial":true}}`,
	`{"event_type":"warning","data":{"code":"c1","message":"m","details":"d"}}`,
	`{"event_type":"error","data":{"code":"c","message":"m","recoverable":false}}`,
	`{"event_type":"progr\u0065ss","data":{"stage":"s"}}`,
	`{"event_type":"progress","data":{"Stage":"s"}}`,
	`{"event_type":"progress","data":{"stage":"s","ſtage":"t"}}`,
	`{"event_type":"progress","data":{"stage":"s","percent":null}}`,
	`{"event_type":"progress","data":{"stage":"s","percent":1e999}}`,
	`{"event_type":"progress","data":{"stage":"s","percent":"5"}}`,
	`{"event_type":"progress","data":{"stage":"s","percent":101}}`,
	`{"event_type":"progress","data":{"stage":"s","stage":"t"}}`,
	`{"event_type":"progress","event_type":"log","data":{"stage":"s"}}`,
	`{"Event_Type":"progress","data":{"stage":"s"}}`,
	`{"event_type":"progress","data":{"stage":"s"},"idempotency_key":null}`,
	`{"event_type":"progress","data":{"stage":"s"},"x":1}`,
	`{"event_type":"progress","data":[]}`,
	`{"event_type":"session_closed","data":{"final_state":"COMPLETED"}}`,
	`{"event_type":"log","data":{"level":"info","message":"m","details":null}}`,
	`{"event_type":"error","data":{"code":"c","message":"m","recoverable":1}}`,
	`{"event_type":"progress","data":{"stage":"s"}} x`,
	"{\"event_type\":\"log\",\"data\":{\"level\":\"info\",\"message\":\"\xff\"}}",
}

// FuzzParseEventFast: the fast path accepts only what the general path
// accepts, with the same event (type, key, data as sent, decoded data),
// and parseEvent agrees with the general path on every input, errors
// worded the same.
func FuzzParseEventFast(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want, wantErr := parseEventGeneral(b)
		_, err := parseEvent(b)
		if (err == nil) != (wantErr == nil) || (err != nil && !strings.HasSuffix(err.Error(), wantErr.Error())) {
			t.Fatalf("%q: parseEvent %v, the general path %v", b, err, wantErr)
		}
		fast, ok := parseEventFast(b)
		if !ok {
			return
		}
		if wantErr != nil {
			t.Fatalf("%q: the fast path accepts what the general path refuses: %v", b, wantErr)
		}
		if fast.EventType != want.EventType || fast.IdempotencyKey != want.IdempotencyKey || !bytes.Equal(fast.Data, want.Data) ||
			!reflect.DeepEqual(fast.decoded, want.decoded) {
			t.Fatalf("%q: fast %+v (%#v), general %+v (%#v)", b, fast, fast.decoded, want, want.decoded)
		}
	})
}

// FuzzParseBatchFast: a batch takes the fast path only when the general
// path accepts it too, with the same events.
func FuzzParseBatchFast(f *testing.F) {
	f.Add([]byte(`[` + fastSeeds[0] + `,` + fastSeeds[2] + `]`))
	f.Add([]byte(` [` + fastSeeds[1] + `] `))
	f.Add([]byte(`[` + fastSeeds[0] + `,` + fastSeeds[7] + `]`))
	f.Add([]byte(`[` + fastSeeds[0] + `] ]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`[null]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := parseBatchFast(bytes.TrimSpace(b))
		if !ok {
			return
		}
		var want []harnessEvent
		if err := decodeStrict(b, &want); err != nil || len(want) != len(fast) {
			t.Fatalf("%q: the fast path accepts %d events, the general path %d: %v", b, len(fast), len(want), err)
		}
		for i := range want {
			if err := checkEvent(&want[i]); err != nil {
				t.Fatalf("%q: event [%d]: %v", b, i, err)
			}
			if f, w := fast[i], want[i]; f.EventType != w.EventType || f.IdempotencyKey != w.IdempotencyKey ||
				!bytes.Equal(f.Data, w.Data) || !reflect.DeepEqual(f.decoded, w.decoded) {
				t.Fatalf("%q: event [%d]: fast %+v, general %+v", b, i, f, w)
			}
		}
	})
}

// TestParseEventFastTakesThePlainForm: the events a harness writes take the
// fast path; an event it takes (its data decoded by session's Decode, plain
// or not) is the general path's, and one the general path refuses is left
// to it.
func TestParseEventFastTakesThePlainForm(t *testing.T) {
	for i, s := range fastSeeds {
		fast, ok := parseEventFast([]byte(s))
		if i < 7 && !ok {
			t.Errorf("%s: not on the fast path", s)
		}
		if !ok {
			continue
		}
		want, err := parseEventGeneral([]byte(s))
		if err != nil || fast.EventType != want.EventType || fast.IdempotencyKey != want.IdempotencyKey ||
			!bytes.Equal(fast.Data, want.Data) || !reflect.DeepEqual(fast.decoded, want.decoded) {
			t.Errorf("%s: fast %+v, general %+v (%v)", s, fast, want, err)
		}
	}
	line := []byte(`{"event_type":"progress","data":{"stage":"s"}}`)
	ev, _ := parseEventFast(line)
	line[35] = 'X'
	if string(ev.Data) != `{"stage":"s"}` {
		t.Errorf("the event's data shares the line's buffer: %s", ev.Data)
	}
}

// BenchmarkParseEvent is one event line parsed by parseEvent (the fast
// path) and by the general path alone.
//
//	go test -run '^$' -bench BenchmarkParseEvent ./internal/sidecar/callee
func BenchmarkParseEvent(b *testing.B) {
	line := benchEventLines(2)[1]
	for name, parse := range map[string]func([]byte) (harnessEvent, error){"fast": parseEvent, "general": parseEventGeneral} {
		b.Run("path="+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parse(line); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
