package transport

import (
	"slices"
	"sync"
)

// tracker holds the delivery tags of one channel not yet settled.
type tracker struct {
	// sendMu is held from settling tags here to sending their frame: an
	// ack with multiple=true covers every tag below it that is settled
	// here, so a nack settled here must be on the wire before it.
	sendMu sync.Mutex
	mu     sync.Mutex
	tags   map[uint64]struct{}
	idleCh chan struct{} // closed while tags is empty
	// wire is the socket of the channel's connection (AckAll batches its
	// frames there); nil in tests of the tracker alone.
	wire *wire
}

func newTracker() *tracker {
	t := &tracker{tags: map[uint64]struct{}{}, idleCh: make(chan struct{})}
	close(t.idleCh)
	return t
}

func (t *tracker) add(tag uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.tags) == 0 {
		t.idleCh = make(chan struct{})
	}
	t.tags[tag] = struct{}{}
}

// settle removes tag (and with multiple every smaller tag) and reports
// whether anything was unsettled.
func (t *tracker) settle(tag uint64, multiple bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	found := false
	if multiple {
		for k := range t.tags {
			if k <= tag {
				delete(t.tags, k)
				found = true
			}
		}
	} else if _, ok := t.tags[tag]; ok {
		delete(t.tags, tag)
		found = true
	}
	if found && len(t.tags) == 0 {
		close(t.idleCh)
	}
	return found
}

// settleAll removes the unsettled ones of tags. upTo (0: none) is the
// highest of them below every other unsettled tag, so one ack with
// multiple=true settles exactly those; single are the rest, to ack one by
// one. Tags delivered later are higher than all of these: a concurrent
// delivery never falls under upTo.
func (t *tracker) settleAll(tags []uint64) (upTo uint64, single []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	mine := make(map[uint64]bool, len(tags))
	for _, tag := range tags {
		if _, ok := t.tags[tag]; ok {
			mine[tag] = true
		}
	}
	if len(mine) == 0 {
		return 0, nil
	}
	var lowestOther uint64 // 0: none
	for k := range t.tags {
		if !mine[k] && (lowestOther == 0 || k < lowestOther) {
			lowestOther = k
		}
	}
	for tag := range mine {
		delete(t.tags, tag)
		if lowestOther == 0 || tag < lowestOther {
			upTo = max(upTo, tag)
		} else {
			single = append(single, tag)
		}
	}
	slices.Sort(single)
	if len(t.tags) == 0 {
		close(t.idleCh)
	}
	return upTo, single
}

func (t *tracker) idle() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.idleCh
}

func (t *tracker) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.tags)
}
