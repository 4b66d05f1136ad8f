package relay

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// splitHops times the two halves of each event's way, split at the
// envelope's timestamp (the moment the callee sidecar built the envelope,
// to the millisecond): the harness's stamp to the envelope (the harness
// API and the callee sidecar's intake), and the envelope to the app (the
// publish, the broker, the caller sidecar, the app API). Where a tail
// latency comes from, without touching the sidecars.
type splitHops struct {
	mu           sync.Mutex
	intake, rest []time.Duration
}

func (h *splitHops) add(sent time.Time, timestamp string) {
	built, err := time.Parse(envelope.TimestampLayout, timestamp)
	if err != nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	h.intake = append(h.intake, built.Sub(sent))
	h.rest = append(h.rest, now.Sub(built))
	h.mu.Unlock()
}

// String is both halves' p50 and p99 (the intake is a millisecond coarse:
// the envelope's timestamp is truncated).
func (h *splitHops) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.rest) == 0 {
		return "no event timed"
	}
	pct := func(ds []time.Duration, p float64) string {
		s := slices.Clone(ds)
		slices.Sort(s)
		return fmt.Sprintf("%.2fms", float64(s[int(p*float64(len(s)-1))])/float64(time.Millisecond))
	}
	return fmt.Sprintf("harness stamp → envelope built p50 %s p99 %s; envelope built → app p50 %s p99 %s",
		pct(h.intake, 0.5), pct(h.intake, 0.99), pct(h.rest, 0.5), pct(h.rest, 0.99))
}
