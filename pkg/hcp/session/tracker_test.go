package session

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// delivery stands in for an AMQP delivery and its sequence.
type delivery struct {
	seq int64
}

func newTracker(t *testing.T, opts TrackerOptions) *Tracker[delivery] {
	t.Helper()
	tr, err := NewTracker[delivery]("s1", opts)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func seqs(es []Entry[delivery]) []int64 {
	var out []int64
	for _, e := range es {
		out = append(out, e.Seq)
		if e.Item.seq != e.Seq {
			panic(fmt.Sprintf("entry %d carries item for %d", e.Seq, e.Item.seq))
		}
	}
	return out
}

// offer offers seq and checks the verdict and the ready sequences.
func offer(t *testing.T, tr *Tracker[delivery], seq int64, want Verdict, ready ...int64) Outcome[delivery] {
	t.Helper()
	out := tr.Offer(seq, delivery{seq: seq})
	if out.Verdict != want {
		t.Fatalf("Offer(%d) verdict %s, want %s", seq, out.Verdict, want)
	}
	if got := seqs(out.Ready); !slices.Equal(got, ready) {
		t.Fatalf("Offer(%d) ready %v, want %v", seq, got, ready)
	}
	return out
}

func commit(t *testing.T, tr *Tracker[delivery], seqs ...int64) {
	t.Helper()
	for _, s := range seqs {
		if err := tr.Commit(s); err != nil {
			t.Fatalf("Commit(%d): %v", s, err)
		}
	}
}

func TestTrackerInOrder(t *testing.T) {
	tr := newTracker(t, TrackerOptions{})
	for s := int64(1); s <= 5; s++ {
		out := offer(t, tr, s, Deliver, s)
		if out.Gap != nil || out.Skipped != nil {
			t.Fatalf("unexpected gap %v / skip %v", out.Gap, out.Skipped)
		}
		commit(t, tr, s)
	}
	if tr.LastProcessed() != 5 || tr.NextExpected() != 6 || tr.InFlight() != 0 || tr.Buffered() != 0 {
		t.Fatalf("state last=%d next=%d", tr.LastProcessed(), tr.NextExpected())
	}
}

func TestTrackerDuplicatesAfterRedelivery(t *testing.T) {
	tr := newTracker(t, TrackerOptions{})
	for s := int64(1); s <= 3; s++ {
		offer(t, tr, s, Deliver, s)
		commit(t, tr, s)
	}
	// The caller crashed before its acks reached the broker: 1..3 come again.
	for s := int64(1); s <= 3; s++ {
		offer(t, tr, s, Duplicate)
	}
	offer(t, tr, 4, Deliver, 4)
	// 4 is handed out but not processed yet; a copy of it is InFlight.
	offer(t, tr, 4, InFlight)
	commit(t, tr, 4)
	offer(t, tr, 4, Duplicate)
	if err := tr.Commit(4); err != nil {
		t.Fatalf("re-commit: %v", err)
	}
	offer(t, tr, 0, Invalid)
	offer(t, tr, -1, Invalid)
}

func TestTrackerOutOfOrderWithinBuffer(t *testing.T) {
	tr := newTracker(t, TrackerOptions{MaxBuffer: 4})
	offer(t, tr, 1, Deliver, 1)
	out := offer(t, tr, 3, Buffered)
	if out.Gap == nil || *out.Gap != (Range{2, 2}) {
		t.Fatalf("gap = %v, want 2", out.Gap)
	}
	out = offer(t, tr, 4, Buffered)
	if out.Gap != nil {
		t.Fatalf("same gap reported twice: %v", out.Gap)
	}
	offer(t, tr, 3, Duplicate) // already buffered
	out = offer(t, tr, 2, Deliver, 2, 3, 4)
	if out.Gap != nil || out.Skipped != nil {
		t.Fatalf("gap %v skip %v after fill", out.Gap, out.Skipped)
	}
	// The app processes 1..4 in order.
	commit(t, tr, 1, 2, 3, 4)
	if tr.LastProcessed() != 4 || tr.Buffered() != 0 {
		t.Fatalf("last=%d buffered=%d", tr.LastProcessed(), tr.Buffered())
	}
}

func TestTrackerGapThenFill(t *testing.T) {
	tr := newTracker(t, TrackerOptions{MaxBuffer: 8})
	offer(t, tr, 1, Deliver, 1)
	commit(t, tr, 1)
	out := offer(t, tr, 5, Buffered)
	if out.Gap == nil || *out.Gap != (Range{2, 4}) || out.Gap.Len() != 3 || out.Gap.String() != "2-4" {
		t.Fatalf("gap = %v", out.Gap)
	}
	out = offer(t, tr, 8, Buffered)
	if out.Gap != nil {
		t.Fatalf("gap reported again: %v", out.Gap)
	}
	out = offer(t, tr, 3, Buffered)
	if out.Gap == nil || *out.Gap != (Range{2, 2}) {
		t.Fatalf("narrowed gap = %v, want 2", out.Gap)
	}
	out = offer(t, tr, 2, Deliver, 2, 3)
	if out.Gap == nil || *out.Gap != (Range{4, 4}) {
		t.Fatalf("next gap = %v, want 4", out.Gap)
	}
	offer(t, tr, 4, Deliver, 4, 5)
	offer(t, tr, 6, Deliver, 6)
	out = offer(t, tr, 7, Deliver, 7, 8)
	if out.Gap != nil {
		t.Fatalf("gap %v after everything arrived", out.Gap)
	}
	// Commits must follow sequence order.
	if err := tr.Commit(3); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("Commit(3) before 2: %v", err)
	}
	commit(t, tr, 2, 3, 4, 5, 6, 7, 8)
	if err := tr.Commit(9); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("Commit(9) never handed out: %v", err)
	}
}

func TestTrackerGapNeverFilledOverflow(t *testing.T) {
	tr := newTracker(t, TrackerOptions{MaxBuffer: 3})
	offer(t, tr, 1, Deliver, 1)
	commit(t, tr, 1)
	// 2 is lost for good (for example dropped by the queue's TTL).
	offer(t, tr, 3, Buffered)
	offer(t, tr, 4, Buffered)
	offer(t, tr, 5, Buffered)
	out := offer(t, tr, 6, Buffered, 3, 4, 5, 6)
	if out.Skipped == nil || *out.Skipped != (Range{2, 2}) {
		t.Fatalf("skipped = %v, want 2", out.Skipped)
	}
	if out.Gap != nil {
		t.Fatalf("gap %v after skip", out.Gap)
	}
	commit(t, tr, 3, 4, 5, 6)
	// 2 turns up after all: too late.
	offer(t, tr, 2, Late)
	if tr.LastProcessed() != 6 {
		t.Fatalf("last = %d", tr.LastProcessed())
	}
}

func TestTrackerExplicitSkip(t *testing.T) {
	tr := newTracker(t, TrackerOptions{})
	if out := tr.Skip(); out.Verdict != None || out.Ready != nil || out.Skipped != nil {
		t.Fatalf("Skip with nothing buffered = %+v", out)
	}
	offer(t, tr, 1, Deliver, 1)
	offer(t, tr, 4, Buffered)
	offer(t, tr, 7, Buffered)
	out := tr.Skip()
	if got := seqs(out.Ready); !slices.Equal(got, []int64{4}) || *out.Skipped != (Range{2, 3}) {
		t.Fatalf("Skip = ready %v skipped %v", got, out.Skipped)
	}
	if out.Gap == nil || *out.Gap != (Range{5, 6}) {
		t.Fatalf("gap after skip = %v, want 5-6", out.Gap)
	}
	offer(t, tr, 3, Late)
	offer(t, tr, 5, Deliver, 5)
	commit(t, tr, 1, 4, 5) // commits jump over the skipped 2-3
	offer(t, tr, 2, Late)
	if tr.LastProcessed() != 5 || tr.Buffered() != 1 {
		t.Fatalf("last %d buffered %d", tr.LastProcessed(), tr.Buffered())
	}
}

func TestTrackerRestartFromPersisted(t *testing.T) {
	store := NewMemoryStore()
	tr := newTracker(t, TrackerOptions{Store: store})
	for s := int64(1); s <= 3; s++ {
		offer(t, tr, s, Deliver, s)
	}
	commit(t, tr, 1, 2) // crash while 3 is being processed
	if v, _ := store.Load("s1"); v != 2 {
		t.Fatalf("stored %d, want 2", v)
	}
	// Restart: the broker redelivers 1..3 and then 4.
	tr2 := newTracker(t, TrackerOptions{Store: store})
	if tr2.LastProcessed() != 2 || tr2.NextExpected() != 3 {
		t.Fatalf("restarted at last=%d next=%d", tr2.LastProcessed(), tr2.NextExpected())
	}
	offer(t, tr2, 1, Duplicate)
	offer(t, tr2, 2, Duplicate)
	offer(t, tr2, 3, Deliver, 3)
	offer(t, tr2, 4, Deliver, 4)
	commit(t, tr2, 3, 4)
	if v, _ := store.Load("s1"); v != 4 {
		t.Fatalf("stored %d, want 4", v)
	}
	if v, _ := store.Load("other"); v != 0 {
		t.Fatalf("unknown session stored %d", v)
	}
	store.Delete("s1")
	if v, _ := store.Load("s1"); v != 0 {
		t.Fatal("Delete did not forget")
	}
}

type failingStore struct {
	loadErr, saveErr error
	load             int64
	saved            []int64
}

func (f *failingStore) Load(string) (int64, error) { return f.load, f.loadErr }
func (f *failingStore) Save(_ string, s int64) error {
	f.saved = append(f.saved, s)
	return f.saveErr
}

func TestTrackerStoreErrors(t *testing.T) {
	boom := errors.New("boom")
	if _, err := NewTracker[delivery]("s", TrackerOptions{Store: &failingStore{loadErr: boom}}); !errors.Is(err, boom) {
		t.Fatalf("load error = %v", err)
	}
	if _, err := NewTracker[delivery]("s", TrackerOptions{Store: &failingStore{load: -1}}); err == nil {
		t.Fatal("negative stored value accepted")
	}
	fs := &failingStore{saveErr: boom}
	tr := newTracker(t, TrackerOptions{Store: fs})
	offer(t, tr, 1, Deliver, 1)
	if err := tr.Commit(1); !errors.Is(err, boom) {
		t.Fatalf("save error = %v", err)
	}
	// The event was processed: the in-memory value advanced regardless.
	if tr.LastProcessed() != 1 {
		t.Fatalf("last = %d", tr.LastProcessed())
	}
	offer(t, tr, 1, Duplicate)
}

func TestTrackerRequeue(t *testing.T) {
	tr := newTracker(t, TrackerOptions{MaxBuffer: 2})
	offer(t, tr, 1, Deliver, 1)
	offer(t, tr, 3, Buffered)
	offer(t, tr, 4, Buffered)
	offer(t, tr, 2, Deliver, 2, 3, 4)
	commit(t, tr, 1)
	// The app fails on 2: it is nacked; 3 and 4 go back to the buffer.
	if err := tr.Requeue(2); err != nil {
		t.Fatal(err)
	}
	if tr.NextExpected() != 2 || tr.Buffered() != 2 || tr.InFlight() != 0 {
		t.Fatalf("after requeue next=%d buffered=%d inflight=%d", tr.NextExpected(), tr.Buffered(), tr.InFlight())
	}
	// More events arrive before 2 comes back; the buffer exceeds MaxBuffer
	// but a requeued event is never skipped, and its hole is not a gap.
	out := offer(t, tr, 5, Buffered)
	if out.Skipped != nil || out.Gap != nil {
		t.Fatalf("requeued event skipped (%v) or reported as gap (%v)", out.Skipped, out.Gap)
	}
	offer(t, tr, 2, Deliver, 2, 3, 4, 5)
	commit(t, tr, 2, 3, 4, 5)
	if err := tr.Requeue(2); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("requeue of committed: %v", err)
	}
	// Once 2 is back, overflow skipping works again.
	offer(t, tr, 7, Buffered)
	offer(t, tr, 8, Buffered)
	out = offer(t, tr, 9, Buffered, 7, 8, 9)
	if out.Skipped == nil || *out.Skipped != (Range{6, 6}) {
		t.Fatalf("skipped = %v", out.Skipped)
	}
}

func TestTrackerExplicitSkipOverRequeued(t *testing.T) {
	tr := newTracker(t, TrackerOptions{})
	offer(t, tr, 1, Deliver, 1)
	offer(t, tr, 2, Deliver, 2)
	commit(t, tr, 1)
	if err := tr.Requeue(2); err != nil {
		t.Fatal(err)
	}
	offer(t, tr, 3, Buffered)
	out := tr.Skip() // the broker dropped 2 for good; the caller gives up
	if *out.Skipped != (Range{2, 2}) || !slices.Equal(seqs(out.Ready), []int64{3}) {
		t.Fatalf("Skip = %+v", out)
	}
	offer(t, tr, 2, Late)
}

func TestTrackerResetAfterChannelLoss(t *testing.T) {
	tr := newTracker(t, TrackerOptions{})
	offer(t, tr, 1, Deliver, 1) // being processed when the channel dies
	offer(t, tr, 3, Buffered)
	offer(t, tr, 4, Buffered)
	dropped := tr.Reset()
	if got := seqs(dropped); !slices.Equal(got, []int64{3, 4}) {
		t.Fatalf("Reset dropped %v", got)
	}
	// Redeliveries on the new channel: 1 is still being processed.
	offer(t, tr, 1, InFlight)
	out := offer(t, tr, 3, Buffered)
	if out.Gap == nil || *out.Gap != (Range{2, 2}) {
		t.Fatalf("gap after reset = %v", out.Gap)
	}
	commit(t, tr, 1)
	offer(t, tr, 1, Duplicate)
	offer(t, tr, 2, Deliver, 2, 3)
}

func TestTrackerRequeueMiddle(t *testing.T) {
	tr := newTracker(t, TrackerOptions{})
	offer(t, tr, 1, Deliver, 1)
	offer(t, tr, 2, Deliver, 2)
	offer(t, tr, 3, Deliver, 3)
	if err := tr.Requeue(2); err != nil {
		t.Fatal(err)
	}
	if tr.InFlight() != 1 || tr.Buffered() != 1 {
		t.Fatalf("inflight %d buffered %d", tr.InFlight(), tr.Buffered())
	}
	commit(t, tr, 1)
	offer(t, tr, 2, Deliver, 2, 3)
}

func TestTrackerLateBeyondMemory(t *testing.T) {
	tr := newTracker(t, TrackerOptions{MaxBuffer: 1})
	// Create more skipped gaps than the tracker remembers.
	var s int64 = 1
	offer(t, tr, s, Deliver, s)
	for i := 0; i < maxSkipped+4; i++ {
		s += 2 // leave one hole
		tr.Offer(s, delivery{seq: s})
		tr.Skip()
	}
	// The oldest hole (2) is forgotten yet still recognised as late, never
	// delivered out of order.
	offer(t, tr, 2, Late)
}

func TestTrackerConcurrent(t *testing.T) {
	tr := newTracker(t, TrackerOptions{Store: NewMemoryStore(), MaxBuffer: 1000})
	const n = 500
	var mu sync.Mutex
	var delivered []int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for s := int64(n - w); s >= 1; s -= 4 { // reverse order, interleaved, with duplicates
				for _, e := range tr.Offer(s, delivery{seq: s}).Ready {
					mu.Lock()
					delivered = append(delivered, e.Seq)
					mu.Unlock()
				}
				tr.Offer(s, delivery{seq: s})
			}
		}(w)
	}
	wg.Wait()
	slices.Sort(delivered)
	if len(delivered) != n || delivered[0] != 1 || delivered[n-1] != n {
		t.Fatalf("delivered %d events", len(delivered))
	}
	for s := int64(1); s <= n; s++ {
		if err := tr.Commit(s); err != nil {
			t.Fatal(err)
		}
	}
}

func TestVerdictString(t *testing.T) {
	for v, want := range map[Verdict]string{None: "none", Deliver: "deliver", Buffered: "buffered",
		Duplicate: "duplicate", InFlight: "in-flight", Late: "late", Invalid: "invalid", 99: "Verdict(99)"} {
		if v.String() != want {
			t.Errorf("%d.String() = %q", int(v), v.String())
		}
	}
	if (Range{3, 3}).String() != "3" {
		t.Error("single range string")
	}
}

// TestTrackerSkipThrough: a gap is given up only as far as the events are
// known to be gone; the rest is still waited for, and what fills it is
// delivered in order.
func TestTrackerSkipThrough(t *testing.T) {
	tr := newTracker(t, TrackerOptions{})
	if out := tr.SkipThrough(5); out.Skipped != nil || out.Ready != nil {
		t.Fatalf("SkipThrough with nothing buffered = %+v", out)
	}
	offer(t, tr, 1, Deliver, 1)
	offer(t, tr, 6, Buffered)
	if out := tr.SkipThrough(1); out.Skipped != nil || out.Ready != nil {
		t.Fatalf("SkipThrough below the gap = %+v", out)
	}
	out := tr.SkipThrough(3) // 2-3 are gone; 4-5 may still come
	if out.Skipped == nil || *out.Skipped != (Range{2, 3}) || out.Ready != nil {
		t.Fatalf("SkipThrough(3) = ready %v skipped %v", seqs(out.Ready), out.Skipped)
	}
	if out.Gap == nil || *out.Gap != (Range{4, 5}) || tr.NextExpected() != 4 {
		t.Fatalf("gap after SkipThrough(3) = %v, next %d; want 4-5, 4", out.Gap, tr.NextExpected())
	}
	offer(t, tr, 3, Late)
	offer(t, tr, 4, Deliver, 4)
	out = tr.SkipThrough(100) // capped below the lowest buffered event
	if got := seqs(out.Ready); !slices.Equal(got, []int64{6}) || *out.Skipped != (Range{5, 5}) {
		t.Fatalf("SkipThrough(100) = ready %v skipped %v", got, out.Skipped)
	}
	commit(t, tr, 1, 4, 6)
	offer(t, tr, 7, Deliver, 7)
}

// TestTrackerUnbuffer: the highest buffered events are handed back and
// nothing is skipped: the gap stays, their copies are buffered again, and
// the stream delivers in order once the gap fills.
func TestTrackerUnbuffer(t *testing.T) {
	tr := newTracker(t, TrackerOptions{})
	offer(t, tr, 1, Deliver, 1)
	for _, s := range []int64{3, 4, 6, 7} {
		offer(t, tr, s, Buffered)
	}
	if got := seqs(tr.Unbuffer(3)); !slices.Equal(got, []int64{4, 6, 7}) {
		t.Fatalf("Unbuffer(3) = %v, want [4 6 7]", got)
	}
	if lo, ok := tr.LowestBuffered(); !ok || lo != 3 || tr.Buffered() != 1 || tr.NextExpected() != 2 {
		t.Fatalf("after Unbuffer: lowest %d %v, buffered %d, next %d", lo, ok, tr.Buffered(), tr.NextExpected())
	}
	offer(t, tr, 7, Buffered) // copies come back: buffered, not late
	offer(t, tr, 6, Buffered)
	offer(t, tr, 2, Deliver, 2, 3)
	offer(t, tr, 4, Deliver, 4)
	offer(t, tr, 5, Deliver, 5, 6, 7)
	if got := seqs(tr.Unbuffer(5)); len(got) != 0 {
		t.Fatalf("Unbuffer with nothing buffered = %v", got)
	}
}

// TestTrackerReturn: in-flight events handed back (their deliveries
// nacked) are awaited again from the first of them, never skipped on
// overflow, and their hole is not reported as a gap; the events before
// them stay in flight.
func TestTrackerReturn(t *testing.T) {
	tr := newTracker(t, TrackerOptions{MaxBuffer: 2})
	offer(t, tr, 1, Deliver, 1)
	offer(t, tr, 2, Deliver, 2)
	offer(t, tr, 3, Deliver, 3)
	offer(t, tr, 5, Buffered)
	back, err := tr.Return(2)
	if err != nil || !slices.Equal(seqs(back), []int64{2, 3}) {
		t.Fatalf("Return(2) = %v, %v; want [2 3]", seqs(back), err)
	}
	if tr.NextExpected() != 2 || tr.InFlight() != 1 || tr.Buffered() != 1 {
		t.Fatalf("after Return: next %d, in flight %d, buffered %d", tr.NextExpected(), tr.InFlight(), tr.Buffered())
	}
	for _, s := range []int64{6, 7} {
		if out := offer(t, tr, s, Buffered); out.Skipped != nil || out.Gap != nil {
			t.Fatalf("offer %d: skipped %v, gap %v; a returned event is awaited", s, out.Skipped, out.Gap)
		}
	}
	commit(t, tr, 1)
	offer(t, tr, 3, Buffered)
	offer(t, tr, 2, Deliver, 2, 3)
	offer(t, tr, 4, Deliver, 4, 5, 6, 7)
	if _, err := tr.Return(9); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("Return of a sequence not in flight: %v", err)
	}
}

// TestTrackerGapFillingFromItsStartIsNotANewGap: a gap is reported once;
// events filling it from its start do not report it again (a long gap
// filled one event at a time logged one warning per event).
func TestTrackerGapFillingFromItsStartIsNotANewGap(t *testing.T) {
	tr := newTracker(t, TrackerOptions{})
	if out := offer(t, tr, 6, Buffered); out.Gap == nil || *out.Gap != (Range{1, 5}) {
		t.Fatalf("gap = %v, want 1-5", out.Gap)
	}
	for s := int64(1); s <= 3; s++ {
		if out := offer(t, tr, s, Deliver, s); out.Gap != nil {
			t.Fatalf("offer %d reported gap %v again", s, *out.Gap)
		}
	}
	if out := offer(t, tr, 5, Buffered); out.Gap == nil || *out.Gap != (Range{4, 4}) {
		t.Fatalf("gap after 5 arrived = %v, want 4-4 (a different gap)", out.Gap)
	}
	offer(t, tr, 4, Deliver, 4, 5, 6)
}
