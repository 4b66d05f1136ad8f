package caller

import "sync"

// mailbox is a session worker's inbox. The consumer puts deliveries in and
// never blocks; the worker takes all of them at once. It holds no buffer
// of its own while empty: the prefetch bounds what a channel has
// unsettled, but a worker busy retrying its app can also hold the stale
// deliveries of channels gone meanwhile, so a fixed buffer had to be
// several windows large (4 × prefetch + 16 pointers, 576 bytes per live
// worker) and could still fill, which left a live delivery unsettled
// until its channel closed.
type mailbox struct {
	mu    sync.Mutex
	items []*item
	// ready has a value when something was put since the last take.
	ready chan struct{}
}

func (m *mailbox) init() { m.ready = make(chan struct{}, 1) }

// put queues it; called by the consumer (under the Sidecar's mu).
func (m *mailbox) put(it *item) {
	m.mu.Lock()
	m.items = append(m.items, it)
	m.mu.Unlock()
	select {
	case m.ready <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// take returns what was put since the last take, in order (none after a
// wake-up whose deliveries an earlier take had).
func (m *mailbox) take() []*item {
	m.mu.Lock()
	defer m.mu.Unlock()
	items := m.items
	m.items = nil
	return items
}

// len is how many deliveries wait.
func (m *mailbox) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.items)
}
