package callee

import "sync"

// confirmQueue is a session's publishes waiting for their confirm, in
// publish order. It holds at most confirmQueueSize of them (beyond it,
// queueing waits) and no more slots than are in use: a channel of
// confirmQueueSize would cost every live session its slots for its whole
// life. Its worker (sess.confirmLoop) runs while there is something to
// confirm: the first publish after the queue emptied starts it, and it
// exits when the queue is empty, so that a session waiting for its
// harness keeps no goroutine either. One worker at a time: the confirms
// are awaited in publish order, as before.
type confirmQueue struct {
	mu    sync.Mutex
	items []*pending
	// space is made by a publish that finds the queue full, and closed
	// when a slot frees.
	space  chan struct{}
	closed bool
	// owned is set when the session is registered (sess.register): only
	// then do publishes and the close start workers.
	owned   bool
	running bool // a worker runs, or is being started
	// cur is the publish the worker awaits now (popped last), if any.
	cur *pending
}

// own hands the queue to its registered session. It reports whether the
// caller must start a worker (something was queued or closed before).
func (q *confirmQueue) own() (start bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.owned = true
	return q.startLocked()
}

// startLocked reports whether a worker must be started, and marks it
// started. Called with mu held.
func (q *confirmQueue) startLocked() bool {
	if !q.owned || q.running || (len(q.items) == 0 && !q.closed) {
		return false
	}
	q.running = true
	return true
}

// keptSlots is the most slots an emptied queue keeps for its next
// publishes; a larger array (left by a burst) is let go.
const keptSlots = 8

// push queues p, waiting while the queue is full. It reports whether the
// caller must start a worker. Like a send on a closed channel, it panics
// after close.
func (q *confirmQueue) push(p *pending) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) >= confirmQueueSize && !q.closed {
		if q.space == nil {
			q.space = make(chan struct{})
		}
		space := q.space
		q.mu.Unlock()
		<-space
		q.mu.Lock()
	}
	if q.closed {
		panic("callee: a publish queued for its confirm after the session's queue closed")
	}
	q.items = append(q.items, p)
	return q.startLocked()
}

// close ends the session's publishes: the worker finishes what is queued,
// then the session (sess.finishConfirms). It reports whether the caller
// must start a worker for that. Like closing a channel, it panics if the
// queue is closed already.
func (q *confirmQueue) close() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		panic("callee: the session's confirm queue closed twice")
	}
	q.closed = true
	return q.startLocked()
}

// find returns the publish of event seq if the worker awaits it or it is
// queued, else nil.
func (q *confirmQueue) find(seq int64) *pending {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cur != nil && q.cur.seq == seq {
		return q.cur
	}
	for _, p := range q.items {
		if p.seq == seq {
			return p
		}
	}
	return nil
}

// queued returns the publishes queued now, oldest first (a copy).
func (q *confirmQueue) queued() []*pending {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]*pending(nil), q.items...)
}

// pop takes the oldest publish. On
// an empty queue ok is false and the worker must exit: over says the queue
// is closed too, and the worker finishes the session first.
func (q *confirmQueue) pop() (p *pending, over, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.cur = nil
	if len(q.items) == 0 {
		if cap(q.items) > keptSlots {
			q.items = nil
		}
		if !q.closed {
			q.running = false
		}
		return nil, q.closed, false
	}
	p = q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	q.cur = p
	if q.space != nil {
		close(q.space)
		q.space = nil
	}
	return p, false, true
}
