package transport

import (
	"slices"
	"testing"
)

// settleAll acks with one multiple=true only what is below every other
// unsettled tag; the rest one by one; nothing twice.
func TestTrackerSettleAll(t *testing.T) {
	tr := newTracker()
	for tag := uint64(1); tag <= 8; tag++ {
		tr.add(tag)
	}
	steps := []struct {
		tags   []uint64
		upTo   uint64
		single []uint64
	}{
		{[]uint64{3, 2, 5}, 0, []uint64{2, 3, 5}}, // 1 is unsettled: nothing may go with multiple
		{[]uint64{1}, 1, nil},                     // 2, 3 are gone already; 4 is next
		{[]uint64{7, 4, 6}, 7, nil},               // 5 is gone; 8, the only other, is above them all
		{[]uint64{4}, 0, nil},                     // settled before: nothing
		{[]uint64{8}, 8, nil},
	}
	for i, s := range steps {
		upTo, single := tr.settleAll(s.tags)
		if upTo != s.upTo || !slices.Equal(single, s.single) {
			t.Fatalf("step %d, settleAll(%v) = %d, %v; want %d, %v", i, s.tags, upTo, single, s.upTo, s.single)
		}
	}
	select {
	case <-tr.idle():
	default:
		t.Fatal("every tag settled, but the tracker is not idle")
	}
}
