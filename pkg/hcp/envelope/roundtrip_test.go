package envelope_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// gen builds random valid envelopes from a seeded source, so a failure is
// reproducible from the seed in the test log.
type gen struct{ r *rand.Rand }

func (g gen) uuid() string {
	var b [16]byte
	for i := range b {
		b[i] = byte(g.r.UintN(256))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	s := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	switch g.r.IntN(4) {
	case 0:
		return strings.ToUpper(s)
	case 1: // mixed case
		out := []byte(s)
		for i := range out {
			if g.r.IntN(2) == 0 {
				out[i] = strings.ToUpper(string(out[i]))[0]
			}
		}
		return string(out)
	}
	return s
}

func (g gen) time() time.Time {
	lo := time.Unix(0, 0).UnixMilli()
	hi := time.Date(9999, 12, 31, 23, 59, 59, 999_000_000, time.UTC).UnixMilli()
	var ms int64
	switch g.r.IntN(4) {
	case 0:
		ms = lo + g.r.Int64N(1000)
	case 1:
		ms = hi - g.r.Int64N(1000)
	default:
		ms = lo + g.r.Int64N(hi-lo+1)
	}
	return time.UnixMilli(ms).UTC()
}

var strPieces = []string{"a", "Z", "0", " ", "é", "日本", "😀", `\"`, `\\`, `\/`, `\n`, `\t`, `\u0000`, `\u00e9`, `\ud83d\ude00`, `\ud800`, "<", ">", "&", "\u2028", "\x7f"}

func (g gen) str() string {
	var b strings.Builder
	b.WriteByte('"')
	for n := g.r.IntN(8); n > 0; n-- {
		b.WriteString(strPieces[g.r.IntN(len(strPieces))])
	}
	b.WriteByte('"')
	return b.String()
}

func (g gen) ws() string {
	if g.r.IntN(3) != 0 {
		return ""
	}
	return []string{" ", "\n", "\t", "\r\n  "}[g.r.IntN(4)]
}

func (g gen) number() string {
	switch g.r.IntN(6) {
	case 0:
		return strconv.Itoa(g.r.IntN(1000) - 500)
	case 1:
		return strconv.FormatFloat(g.r.NormFloat64()*1e6, 'g', -1, 64)
	case 2:
		return "123456789012345678901234567890123456789"
	case 3:
		return "-0.0e-999"
	case 4:
		return "1E+400"
	}
	return "0"
}

// value writes a random JSON value; depth bounds nesting.
func (g gen) value(depth int) string {
	k := g.r.IntN(8)
	if depth <= 0 {
		k = 2 + g.r.IntN(6)
	}
	switch k {
	case 0:
		return g.object(depth - 1)
	case 1:
		var parts []string
		for n := g.r.IntN(4); n > 0; n-- {
			parts = append(parts, g.ws()+g.value(depth-1)+g.ws())
		}
		return "[" + strings.Join(parts, ",") + "]"
	case 2, 3:
		return g.str()
	case 4, 5:
		return g.number()
	case 6:
		return []string{"true", "false"}[g.r.IntN(2)]
	}
	return "null"
}

func (g gen) object(depth int) string {
	seen := map[string]bool{}
	var parts []string
	for n := g.r.IntN(5); n > 0; n-- {
		k := g.str()
		var uk string
		if err := json.Unmarshal([]byte(k), &uk); err != nil {
			panic(err)
		}
		if seen[uk] {
			continue
		}
		seen[uk] = true
		parts = append(parts, g.ws()+k+g.ws()+":"+g.ws()+g.value(depth)+g.ws())
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func (g gen) envelope() *envelope.Envelope {
	types := envelope.Types()
	e := &envelope.Envelope{
		HCPVersion: "1." + strconv.Itoa(g.r.IntN(3)*g.r.IntN(20)),
		MessageID:  g.uuid(),
		Timestamp:  g.time(),
		Type:       types[g.r.IntN(len(types))],
		Payload:    json.RawMessage(g.object(4)),
	}
	if e.Type.RequiresSession() {
		sid := g.uuid()
		e.SessionID = &sid
	}
	return e
}

func TestRoundTripProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	g := gen{rand.New(rand.NewPCG(seed, 0x4843502d4c31))}
	n := 5000
	if testing.Short() {
		n = 500
	}
	for i := 0; i < n; i++ {
		x := g.envelope()
		if err := x.Validate(); err != nil {
			t.Fatalf("generated envelope invalid: %v\n%#v", err, x)
		}
		b, err := envelope.Encode(x)
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		y, err := envelope.Decode(b)
		if err != nil {
			t.Fatalf("Decode(Encode(x)): %v\n%s", err, b)
		}
		if !reflect.DeepEqual(x, y) || !x.Equal(y) {
			t.Fatalf("Decode(Encode(x)) != x\nx: %#v\ny: %#v\nwire: %s", x, y, b)
		}
		b2, err := envelope.Encode(y)
		if err != nil || !bytes.Equal(b, b2) {
			t.Fatalf("re-encoding differs (%v):\n%s\n%s", err, b, b2)
		}
		// The wire form is JSON any parser reads, and the payload is
		// the same JSON value after the trip.
		var generic map[string]json.RawMessage
		if err := json.Unmarshal(b, &generic); err != nil {
			t.Fatalf("encoding/json rejects the wire form: %v\n%s", err, b)
		}
		// Through AMQP properties too.
		z, err := envelope.FromDelivery(deliveryOf(envelope.ToPublishing(x, b, "u")), 0)
		if err != nil || !z.Equal(x) {
			t.Fatalf("FromDelivery(ToPublishing(x)): %v\n%#v", err, z)
		}
	}
}

// TestRoundTripDecodeSide: anything Decode accepts re-encodes to something
// Decode accepts as an equal envelope; checked on whitespace-laden wire forms
// the encoder never produces.
func TestRoundTripDecodeSide(t *testing.T) {
	g := gen{rand.New(rand.NewPCG(1, 2))}
	for i := 0; i < 1000; i++ {
		x := g.envelope()
		sid := "null"
		if x.SessionID != nil {
			sid = q(*x.SessionID)
		}
		members := []kv{
			{"hcp_version", q(x.HCPVersion)},
			{"message_id", q(x.MessageID)},
			{"timestamp", q(x.Timestamp.Format(envelope.TimestampLayout))},
			{"session_id", sid},
			{"type", q(string(x.Type))},
			{"payload", string(x.Payload)},
		}
		g.r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
		var b strings.Builder
		b.WriteString(g.ws() + "{")
		for i, m := range members {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(g.ws() + q(m.k) + g.ws() + ":" + g.ws() + m.v + g.ws())
		}
		b.WriteString("}" + g.ws())
		y, err := envelope.Decode([]byte(b.String()))
		if err != nil {
			t.Fatalf("Decode: %v\n%s", err, b.String())
		}
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("got %#v\nwant %#v", y, x)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	e, err := envelope.NewAt(time.Now(), envelope.TypeEvent, sessID, map[string]any{
		"event_type": "progress",
		"sequence":   42,
		"data":       map[string]any{"stage": "analysis", "percent": 42.5, "message": strings.Repeat("working ", 50)},
	})
	if err != nil {
		b.Fatal(err)
	}
	body, _ := envelope.Encode(e)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := envelope.Decode(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	e, _ := envelope.NewAt(time.Now(), envelope.TypeEvent, sessID, map[string]any{"event_type": "progress", "sequence": 42})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := envelope.Encode(e); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJSONUnmarshal is the baseline: plain encoding/json into a struct,
// without any of the checks.
func BenchmarkJSONUnmarshal(b *testing.B) {
	e, _ := envelope.NewAt(time.Now(), envelope.TypeEvent, sessID, map[string]any{
		"event_type": "progress",
		"sequence":   42,
		"data":       map[string]any{"stage": "analysis", "percent": 42.5, "message": strings.Repeat("working ", 50)},
	})
	body, _ := envelope.Encode(e)
	var v struct {
		V, M, T string
		S       *string
		Type    string
		P       json.RawMessage `json:"payload"`
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := json.Unmarshal(body, &v); err != nil {
			b.Fatal(err)
		}
	}
}
