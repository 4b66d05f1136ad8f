package caller

import "sync"

// Ticket is the completion of one group commit: it is done once the
// write+fsync of the batch that holds a change (and every change queued
// with it, of any record) has returned. Callbacks registered with Then run
// in registration order, on the committer goroutine, right after that
// fsync; they must be quick and must not call the Store.
//
// A batch waits up to the Store's commit linger for more changes to join
// it before it is written; Wait and Hurry end that wait.
type Ticket struct {
	mu   sync.Mutex
	done bool
	err  error
	then []func(error)
	// ch is closed once the callbacks have run.
	ch chan struct{}
	// store is the Store whose batch this is (nil for a ticket made done).
	store *Store
}

func newTicket(s *Store) *Ticket { return &Ticket{ch: make(chan struct{}), store: s} }

// doneTicket is a ticket already done with err.
func doneTicket(err error) *Ticket {
	t := newTicket(nil)
	t.finish(err)
	return t
}

// finish marks t done and runs its callbacks.
func (t *Ticket) finish(err error) {
	t.mu.Lock()
	t.done, t.err = true, err
	cbs := t.then
	t.then = nil
	t.mu.Unlock()
	for _, f := range cbs {
		f(err)
	}
	close(t.ch)
}

// Then runs f(err) once t is done: at once, on the calling goroutine, if it
// already is. It does not hurry the batch: f runs when the linger ends, or
// earlier if something else hurries it.
func (t *Ticket) Then(f func(error)) {
	t.mu.Lock()
	if !t.done {
		t.then = append(t.then, f)
		t.mu.Unlock()
		return
	}
	err := t.err
	t.mu.Unlock()
	f(err)
}

// Hurry has t's batch written now rather than at the end of its linger.
func (t *Ticket) Hurry() {
	if t.store != nil && !t.Done() {
		t.store.hurry(t)
	}
}

// Wait hurries t's batch, then blocks until t is done and its callbacks
// have run.
func (t *Ticket) Wait() error {
	t.Hurry()
	<-t.ch
	return t.err
}

// Done reports whether t is done and its callbacks have run.
func (t *Ticket) Done() bool {
	select {
	case <-t.ch:
		return true
	default:
		return false
	}
}

func wait(t *Ticket) error { return t.Wait() }
