package caller

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"hash/maphash"
	"testing"

	"github.com/hcp-io/hcp-operator/internal/heapmeter"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// eventItem is a delivered event of sequence seq with a 300-byte payload.
func eventItem(seq int64) *item {
	payload := fmt.Appendf(nil, `{"event_type":"progress","sequence":%d,"data":{"message":"%0280d"}}`, seq, seq)
	return &item{env: &envelope.Envelope{Payload: payload}, event: &session.EventPayload{Sequence: seq}}
}

// A busy session's worker remembers the digest of up to bodyWindow event
// bodies to tell a contradiction from a duplicate; with sha256 digests
// (32 bytes) that map took some 97 KiB per busy session, with 8-byte keyed
// digests 35. Each sequence is still told apart.
func TestBusySessionDigestsStaySmall(t *testing.T) {
	const sessions = 20
	items := make([]*item, bodyWindow)
	for i := range items {
		items[i] = eventItem(int64(i + 1))
	}
	var first *stream
	per := heapmeter.PerItem(sessions, func(int) any {
		w := &stream{}
		for _, it := range items {
			if !w.sameBody(it) {
				t.Fatalf("sequence %d: a first body taken for a contradiction", it.seq())
			}
		}
		first = cmp.Or(first, w)
		return w
	})
	if limit := 48.0 * 1024; per > limit {
		t.Errorf("a busy session's digests take %.1f KiB; want at most %.0f", per/1024, limit/1024)
	}
	t.Logf("%.1f KiB of digests per busy session (%d sequences)", per/1024, bodyWindow)
	// Every copy is recognised as the same body.
	for _, it := range items {
		if !first.sameBody(eventItem(it.seq())) {
			t.Fatalf("sequence %d: an identical copy taken for a contradiction", it.seq())
		}
	}
}

// BenchmarkBodyDigest: the keyed 64-bit digest of a 300-byte event body
// against sha256 (the digest before), in the same run.
func BenchmarkBodyDigest(b *testing.B) {
	body := eventItem(42).env.Payload
	b.Run("sha256", func(b *testing.B) {
		for b.Loop() {
			_ = sha256.Sum256(body)
		}
	})
	seed := maphash.MakeSeed() // as bodySeed
	b.Run("maphash", func(b *testing.B) {
		for b.Loop() {
			_ = maphash.Bytes(seed, body)
		}
	})
}
