package envelope

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestNewPublishingUnchecked: what the unchecked constructor builds from
// valid parts passes Validate and the receiver's checks, and is what
// NewPublishing builds but for the message id.
func TestNewPublishingUnchecked(t *testing.T) {
	const sid = "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10"
	now := time.Date(2026, 11, 30, 3, 4, 5, 678_901_234, time.FixedZone("x", 3600))
	payload := json.RawMessage(`{"event_type":"progress","sequence":7,"data":{ "stage" : "a", "percent": 10 }}`)
	pub := NewPublishingUnchecked(now, TypeEvent, sid, payload, "callee.lab@/hcp")
	d := amqp.Delivery{ContentType: pub.ContentType, ContentEncoding: pub.ContentEncoding, MessageId: pub.MessageId,
		Type: pub.Type, CorrelationId: pub.CorrelationId, UserId: pub.UserId, Body: pub.Body}
	env, err := FromDelivery(d, 0)
	if err != nil {
		t.Fatalf("the receiver refuses it: %v\n%s", err, pub.Body)
	}
	if err := env.Validate(); err != nil {
		t.Fatal(err)
	}
	if env.Session() != sid || env.Type != TypeEvent || !bytes.Equal(env.Payload, payload) || !env.Timestamp.Equal(now.Truncate(time.Millisecond)) {
		t.Errorf("decoded %+v", env)
	}
	want, err := NewPublishing(now, TypeEvent, sid, payload, "callee.lab@/hcp")
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Replace(want.Body, []byte(want.MessageId), []byte(pub.MessageId), 1)
	if !bytes.Equal(body, pub.Body) {
		t.Errorf("body\n%s\nwant\n%s", pub.Body, body)
	}
	want.MessageId, want.Body = pub.MessageId, pub.Body
	if !equalPublishing(want, pub) {
		t.Errorf("publishing %+v\nwant %+v", pub, want)
	}
	if !IsUUIDv4(pub.MessageId) || pub.MessageId == NewPublishingUnchecked(now, TypeEvent, sid, payload, "u").MessageId {
		t.Errorf("message id %q", pub.MessageId)
	}
}

func equalPublishing(a, b amqp.Publishing) bool {
	return a.ContentType == b.ContentType && a.ContentEncoding == b.ContentEncoding && a.DeliveryMode == b.DeliveryMode &&
		a.CorrelationId == b.CorrelationId && a.MessageId == b.MessageId && a.Timestamp.Equal(b.Timestamp) &&
		a.Type == b.Type && a.UserId == b.UserId && bytes.Equal(a.Body, b.Body) && len(a.Headers) == len(b.Headers)
}

// TestAppendTimestamp: the hand-written form is the layout's, and the
// envelope's buffer is allocated once.
func TestAppendTimestamp(t *testing.T) {
	times := []time.Time{
		time.Unix(0, 0), time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.FixedZone("y", -7200)), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Now(),
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		// Any second of the years 1 to 9999, any nanosecond.
		times = append(times, time.Unix(-62135596800+r.Int64N(253402300800+62135596800), r.Int64N(1e9)))
	}
	for _, tm := range times {
		if got, want := string(appendTimestamp([]byte("x"), tm)), "x"+tm.UTC().Format(TimestampLayout); got != want {
			t.Fatalf("%v: %s, want %s", tm, got, want)
		}
	}
	const sid = "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10"
	env, err := NewAt(time.Now(), TypeTaskCompleted, sid, json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if b := appendValid(env); cap(b) != len(b) {
		t.Errorf("buffer of %d for %d bytes: the overhead is %d", cap(b), len(b), envelopeOverhead)
	}
}

// TestCheckObject: Validate's payload rules, worded without the field.
func TestCheckObject(t *testing.T) {
	if err := CheckObject([]byte(` {"a":{"b":[1,{"c":2}]},"d":"é"} `)); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		`{"a":1,"a":2}`:       `duplicate key "a" at offset 7`,
		`{"a":{"b":1,"b":2}}`: `duplicate key "b"`,
		"{\"a\":\"\xff\"}":    "not valid UTF-8",
		`[1]`:                 "must be a JSON object",
		`{"a":1} {}`:          "trailing data after the JSON object",
		`{"a":tru}`:           "invalid literal, expected true at offset 5",
		strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001): "nesting depth exceeds 10000",
	} {
		if err := CheckObject([]byte(in)); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "hcp envelope") {
			t.Errorf("%.40s: %v, want %q", in, err, want)
		}
	}
}

// TestMembersChecked: nested duplicates and invalid UTF-8 are refused;
// the top level's members all reach fn, a duplicate too.
func TestMembersChecked(t *testing.T) {
	var keys []string
	err := MembersChecked([]byte(`{"a":{"x":1},"b":[{"y":2}],"a":3}`), func(k, v []byte) error {
		keys = append(keys, string(k)+"="+string(v))
		return nil
	})
	if err != nil || strings.Join(keys, " ") != `a={"x":1} b=[{"y":2}] a=3` {
		t.Fatalf("%v %v", keys, err)
	}
	nop := func(k, v []byte) error { return nil }
	for in, want := range map[string]string{
		`{"a":{"x":1,"x":2}}`:   `duplicate key "x"`,
		`{"b":[{"y":2,"y":3}]}`: `duplicate key "y"`,
		"{\"a\":\"\xff\"}":      "not valid UTF-8",
		`{"a":1}x`:              "trailing data",
		`["a"]`:                 "expected a JSON object",
	} {
		if err := MembersChecked([]byte(in), nop); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}

// TestNewMessageIDs: ids drawn from the read-ahead randomness, by
// goroutines at once, are lowercase UUIDs v4, all distinct.
func TestNewMessageIDs(t *testing.T) {
	const workers, each = 4, 5000
	ids := make(chan string, workers*each)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				ids <- NewMessageID()
			}
		})
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		if !IsUUIDv4(id) || strings.ToLower(id) != id || seen[id] {
			t.Fatalf("id %q (seen before: %v)", id, seen[id])
		}
		seen[id] = true
	}
}
