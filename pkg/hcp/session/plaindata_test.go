package session

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// eventDataCases are progress data, plain and odd, and other events.
var eventDataCases = []struct {
	typ  EventType
	seq  int64
	data string
}{
	{"progress", 1, `{"stage":"step","percent":12.5,"message":"xxx"}`},
	{"progress", 2, `{"stage":"step"}`},
	{"progress", 3, ` { "stage" : "a\u00e9\n" , "percent" : 0 , "message" : null } `},
	{"progress", 4, `{"stage":"s","percent":100,"message":"m","extra":1}`},
	{"progress", 5, `{"Stage":"s"}`},
	{"progress", 5, `{"st\u0061ge":"s"}`},
	{"progress", 6, `{"stage":"s","stage":"t"}`},
	{"progress", 7, `{"stage":"","percent":5}`},
	{"progress", 8, `{"stage":"  "}`},
	{"progress", 9, `{"stage":"s","percent":101}`},
	{"progress", 9, `{"stage":"s","percent":-0.0}`},
	{"progress", 9, `{"stage":"s","percent":1e400}`},
	{"progress", 9, `{"stage":"s","percent":"5"}`},
	{"progress", 9, `{"stage":"s","percent":null}`},
	{"progress", 9, `{"stage":1}`},
	{"progress", 9, `{"stage":null}`},
	{"progress", 9, `{"stage":"s","message":["m"]}`},
	{"progress", 9, `{"stage":"\xff\xfe"}`},
	{"progress", 9, `{"stage":"s",}`},
	{"progress", 9, `{"stage":"s"`},
	{"progress", 9, `["stage"]`},
	{"progress", 9, `null`},
	{"progress", 9, ``},
	{"progress", 9, `{}`},
	{"progress", 0, `{"stage":"s"}`},
	{"progress", -1, `{"stage":"s"}`},
	{"", 1, `{"stage":"s"}`},
	{"nonsense", 1, `{"stage":"s"}`},
	{"log", 1, `{"level":"info","message":"m"}`},
	{"log", 1, `{"level":"loud","message":"m"}`},
	{"log", 1, `{"level":"warn","message":"m","details":{"k":[1,2]}}`},
	{"log", 1, `{"level":"warn","message":"m","details":null}`},
	{"warning", 1, `{"code":"w1","message":"m","details":{"a":1}}`},
	{"error", 1, `{"code":"e1","message":"m","recoverable":true}`},
	{"error", 1, `{"code":"e1","message":"m","recoverable":"yes"}`},
	{"intermediate_result", 1, `{"result_type":"table","data":{"rows":[]},"is_partial":false}`},
	{"intermediate_result", 1, `{"result_type":"table","data":null}`},
	{"state_changed", 1, `{"from_state":"running","to_state":"completed"}`},
	{"session_closed", 1, `{"final_state":"completed"}`},
}

// TestDecodePlain: Decode, with its fast path for data in the plain form,
// accepts what encoding/json's decode accepts, and gives the same data or
// the same error, word for word.
func TestDecodePlain(t *testing.T) {
	for _, c := range eventDataCases {
		checkDecodePlain(t, EventPayload{EventType: c.typ, Sequence: c.seq, Data: json.RawMessage(c.data)})
	}
}

func checkDecodePlain(t *testing.T, p EventPayload) {
	t.Helper()
	got, gerr := p.Decode()
	want, werr := p.decode()
	switch {
	case (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()):
		t.Errorf("%s %d %q: error %v, encoding/json's %v", p.EventType, p.Sequence, p.Data, gerr, werr)
	case !reflect.DeepEqual(got, want):
		t.Errorf("%s %d %q: %#v, encoding/json's %#v", p.EventType, p.Sequence, p.Data, got, want)
	}
}

// FuzzDecodePlain holds Decode to encoding/json's decode on any data of
// the harness's event types.
func FuzzDecodePlain(f *testing.F) {
	types := []EventType{EventProgress, EventIntermediateResult, EventLog, EventWarning, EventError}
	for i, c := range eventDataCases {
		f.Add(uint8(i), c.seq, c.data)
	}
	f.Fuzz(func(t *testing.T, typ uint8, seq int64, data string) {
		checkDecodePlain(t, EventPayload{EventType: types[int(typ)%len(types)], Sequence: seq, Data: json.RawMessage(data)})
	})
}

// BenchmarkDecode is a typical progress event's data, the fast path
// against encoding/json's.
func BenchmarkDecode(b *testing.B) {
	p := EventPayload{EventType: EventProgress, Sequence: 7,
		Data: json.RawMessage(`{"stage":"step","percent":42.5,"message":"a note about the step"}`)}
	for _, tc := range []struct {
		name   string
		decode func() (EventData, error)
	}{{"plain", p.Decode}, {"encoding-json", p.decode}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tc.decode(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// The fast path names every field of each harness type's data: a field
// added to the struct and not to its list would be ignored on the fast
// path while encoding/json fills it.
func TestDecodePlainNamesEveryField(t *testing.T) {
	for et, names := range map[EventType][]string{
		EventProgress: progressFields, EventIntermediateResult: intermediateFields,
		EventLog: logFields, EventWarning: warningFields, EventError: errorFields,
	} {
		typ := reflect.TypeOf(newData(et)).Elem()
		var tags []string
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			tags = append(tags, name)
		}
		if !slices.Equal(tags, names) {
			t.Errorf("%s: the fast path decodes %v, the struct has %v", et, names, tags)
		}
	}
}
