package caller

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// TestSessionLineJSON: a session record's journal line, built by hand, is
// what json.Marshal writes, byte for byte, whatever the strings (escapes,
// HTML characters, invalid UTF-8), times (zones, nanoseconds, zero) and
// flags; a time json.Marshal refuses still panics, as before.
func TestSessionLineJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	odd := []string{"", "lab-cvd", "5f0c5a3e-2b7e-4c1a-9d3e-6f1a2b3c4d5e", "a\"b\\c", "<&>", "\x01\t\n", "é☃", "\xff\xfe", "\u2028\u2029", "x y"}
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600+1800), time.FixedZone("X", -7*3600), time.Local}
	anyTime := func() time.Time {
		if rng.IntN(3) == 0 {
			return time.Time{}
		}
		return time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)*int64(rng.IntN(2))).In(zones[rng.IntN(len(zones))])
	}
	str := func() string { return odd[rng.IntN(len(odd))] }
	recs := []*SessionRecord{{}, {SessionID: "s", UpdatedAt: time.Now()}}
	for range 2000 {
		recs = append(recs, &SessionRecord{
			SessionID: str(), CalleeID: str(), TaskMessageID: str(), Capability: str(),
			LastSeq: rng.Int64N(1e6) - 10, State: str(), RiskLevel: str(), Token: str(), TokenExpiresAt: anyTime(),
			AcceptedDelivered: rng.IntN(2) == 0, Terminal: str(), Closed: rng.IntN(2) == 0, Unverified: rng.IntN(2) == 0,
			OwnerEpoch: rng.Int64N(3), EpochFrom: rng.Int64N(3) - 1, AbortRequestedAt: anyTime(), UpdatedAt: anyTime(),
		})
	}
	for _, r := range recs {
		l := journalLine{Session: r}
		want, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := appendSessionLine([]byte("prefix"), l)
		if !ok || !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatalf("%+v:\n got %s (%v)\nwant prefix%s", r, got, ok, want)
		}
		if line, ok := parseLine(encodeLine(l)); !ok || line.Session == nil || !line.Session.UpdatedAt.Equal(r.UpdatedAt) {
			t.Fatalf("%+v: the line does not parse back", r)
		}
	}
	// Other lines and unencodable times go to encoding/json.
	for _, l := range []journalLine{{Task: &TaskRecord{MessageID: "m"}}, {DeleteSession: "s"}, {Session: &SessionRecord{}, DeleteTask: "t"},
		{Session: &SessionRecord{UpdatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}} {
		if got, ok := appendSessionLine([]byte("p"), l); ok || string(got) != "p" {
			t.Errorf("%+v: appended %q (%v), want nothing", l, got, ok)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a year json.Marshal refuses did not panic")
			}
		}()
		encodeLine(journalLine{Session: &SessionRecord{UpdatedAt: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)}})
	}()
}

// BenchmarkSessionLine is the journal line of a typical session record.
func BenchmarkSessionLine(b *testing.B) {
	r := &SessionRecord{SessionID: "5f0c5a3e-2b7e-4c1a-9d3e-6f1a2b3c4d5e", CalleeID: "lab-cvd",
		TaskMessageID: "7c6b5a4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d", Capability: "synthesis", LastSeq: 12345,
		State: "running", RiskLevel: "low", Token: "tok", OwnerEpoch: 2, EpochFrom: 1, UpdatedAt: time.Now()}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = appendLine(buf[:0], journalLine{Session: r})
	}
}

// Every field of SessionRecord set at once is written as json.Marshal
// writes it: a field added to the record and not to appendSessionLine
// fails here, instead of being dropped from the journal without a word
// (TestSessionLineJSON's random records know only today's fields).
func TestSessionLineJSONHasEveryField(t *testing.T) {
	var r SessionRecord
	v := reflect.ValueOf(&r).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Interface().(type) {
		case string:
			f.SetString("x" + v.Type().Field(i).Name)
		case int64:
			f.SetInt(int64(i + 1))
		case bool:
			f.SetBool(true)
		case time.Time:
			f.Set(reflect.ValueOf(time.Unix(int64(1e9+i), 0).UTC()))
		default:
			t.Fatalf("SessionRecord.%s is a %s: teach appendSessionLine and this test its encoding", v.Type().Field(i).Name, f.Type())
		}
	}
	l := journalLine{Session: &r}
	want, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := appendSessionLine(nil, l); !ok || !bytes.Equal(got, want) {
		t.Fatalf("every field set:\n got %s (%v)\nwant %s", got, ok, want)
	}
}
