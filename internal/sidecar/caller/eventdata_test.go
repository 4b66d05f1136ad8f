package caller

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// eventDataCases are progress data, plain and odd, and other events.
var eventDataCases = []struct {
	typ  session.EventType
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
	{"state_changed", 1, `{"from_state":"running","to_state":"completed"}`},
	{"session_closed", 1, `{"final_state":"completed"}`},
}

// TestDecodeEventData: what decodeEventData accepts, and the data it
// gives, or its error, word for word, are EventPayload.Decode's.
func TestDecodeEventData(t *testing.T) {
	for _, c := range eventDataCases {
		checkDecodeEventData(t, session.EventPayload{EventType: c.typ, Sequence: c.seq, Data: json.RawMessage(c.data)})
	}
}

func checkDecodeEventData(t *testing.T, p session.EventPayload) {
	t.Helper()
	got, gerr := decodeEventData(&p)
	want, werr := p.Decode()
	switch {
	case (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()):
		t.Errorf("%s %d %q: error %v, Decode's %v", p.EventType, p.Sequence, p.Data, gerr, werr)
	case !reflect.DeepEqual(got, want):
		t.Errorf("%s %d %q: %#v, Decode's %#v", p.EventType, p.Sequence, p.Data, got, want)
	}
}

// FuzzDecodeEventData holds decodeEventData to EventPayload.Decode on any
// progress data.
func FuzzDecodeEventData(f *testing.F) {
	for _, c := range eventDataCases {
		f.Add(c.seq, c.data)
	}
	f.Fuzz(func(t *testing.T, seq int64, data string) {
		checkDecodeEventData(t, session.EventPayload{EventType: session.EventProgress, Sequence: seq, Data: json.RawMessage(data)})
	})
}

// BenchmarkDecodeEventData is a typical progress event's data.
func BenchmarkDecodeEventData(b *testing.B) {
	p := session.EventPayload{EventType: session.EventProgress, Sequence: 7,
		Data: json.RawMessage(`{"stage":"step","percent":42.5,"message":"a note about the step"}`)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeEventData(&p); err != nil {
			b.Fatal(err)
		}
	}
}
