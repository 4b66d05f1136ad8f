package status

import (
	"math/rand/v2"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

// DefaultWritesPerSecond and DefaultWriteBurst are the default API write
// budget of one Writer (Callee spec.sessions.statusWritesPerSecond): the
// status and label writes of all its sessions together, a token bucket.
const (
	DefaultWritesPerSecond = 50
	DefaultWriteBurst      = 2 * DefaultWritesPerSecond
)

// SetBudget changes the write budget: perSecond API writes a second on
// average, with bursts of twice as many (<= 0 is ignored). Writes that make
// a change visible (a new state, its label, a terminal state, a Flush)
// wait for a token; a write that only moves progress or sequences is put
// off while fewer than half the burst's tokens are left, and carries the
// latest status when it goes. So with many sessions streaming the writer
// stays within the budget, progress is coalesced further, and state
// changes still go first. Progress writes are also paced, one per
// 1/perSecond at most and spread evenly over the interval
// (writeBudget.spare): sessions that started together would otherwise
// write their progress together every interval, a burst of API writes
// that the API server and etcd serve on the cores the sessions' events
// need (at 10 sessions on 2 cores that burst tripled the relay's p99).
func (w *Writer) SetBudget(perSecond float64) {
	if perSecond <= 0 {
		return
	}
	w.budget.tokens.SetLimit(rate.Limit(perSecond))
	w.budget.tokens.SetBurst(burstOf(perSecond))
}

func burstOf(perSecond float64) int { return max(int(2*perSecond), 2) }

// plan counts the API writes e's next attempt makes (its status, its
// label) and whether they make a change visible (see SetBudget). Called
// with w.mu held.
func (w *Writer) plan(e *entry, statusDue bool) (writes int, visible bool) {
	if statusDue {
		writes++
	}
	if w.labelKey != "" && e.want().State != "" && !labelHolds(e.label, e.want().State) {
		writes++
	}
	return writes, !statusDue || e.force || stateChange(e)
}

// writeBudget is the API write budget every write of a Writer takes from:
// a token bucket, and closing, closed when Run's context ends (the final
// flush does not wait for tokens). A type of its own: it needs none of the
// Writer's state and none of its lock (rate.Limiter locks itself).
type writeBudget struct {
	tokens *rate.Limiter
	// pace spaces progress writes (spare) evenly: at most the budget's
	// rate, with a burst of one.
	pace    *rate.Limiter
	clk     clock.WithTicker
	closing chan struct{}
}

// await waits until the budget grants writes tokens (or the writer
// closes). The burst is at least the two writes of a state change, so the
// reservation is always granted.
func (b *writeBudget) await(writes int) {
	if writes == 0 {
		return
	}
	now := b.clk.Now()
	if d := b.tokens.ReserveN(now, writes).DelayFrom(now); d > 0 {
		select {
		case <-b.clk.After(d):
		case <-b.closing:
		}
	}
}

func (b *writeBudget) closed() bool {
	select {
	case <-b.closing:
		return true
	default:
		return false
	}
}

// spare takes n tokens if more than half the burst would be left for the
// writes that make a change visible, and the last progress write is at
// least a pace interval ago. The pace interval is the longer of a token's
// time and spread (the Writer gives half its interval over its sessions),
// so that their progress writes, each due once an interval, go spaced
// through it instead of back to back. Otherwise it says when to try
// again: when the budget is short, after the longer of coalesce and the
// time its tokens take to come back; when only the pace refused, within a
// few pace intervals, at random, so that writes that were due together do
// not meet again. The Writer calls it with w.mu held.
func (b *writeBudget) spare(n int, coalesce, spread time.Duration) (bool, time.Duration) {
	now := b.clk.Now()
	perToken := float64(time.Second) / float64(b.tokens.Limit())
	if missing := float64(n+b.tokens.Burst()/2) - b.tokens.TokensAt(now); missing > 0 {
		return false, max(coalesce, time.Duration(missing*perToken))
	}
	perPace := max(perToken, float64(spread))
	b.pace.SetLimitAt(now, rate.Limit(float64(time.Second)/perPace))
	if missing := 1 - b.pace.TokensAt(now); missing > 0 {
		return false, time.Duration(missing*perPace) + rand.N(time.Duration(4*perPace)+1)
	}
	b.pace.AllowN(now, 1)
	return b.tokens.AllowN(now, n), 0
}
