package callee

import (
	"testing"
	"time"
)

// The confirm queue hands publishes out in order, asks for a worker only
// when none runs, lets the worker go when it is empty, holds at most
// confirmQueueSize (a publish beyond waits for a slot) and, once closed,
// tells the last worker to finish the session.
func TestConfirmQueue(t *testing.T) {
	var q confirmQueue
	if q.own() {
		t.Fatal("owning an empty queue asked for a worker")
	}
	if !q.push(&pending{index: 1}) {
		t.Fatal("the first publish did not ask for a worker")
	}
	if q.push(&pending{index: 2}) {
		t.Fatal("a publish asked for a second worker")
	}
	for want := int64(1); want <= 2; want++ {
		p, _, ok := q.pop()
		if !ok || p.index != want {
			t.Fatalf("pop = %v, ok %v; want index %d", p, ok, want)
		}
	}
	if _, over, ok := q.pop(); ok || over {
		t.Fatalf("pop of an empty open queue: ok %v, over %v", ok, over)
	}
	if !q.push(&pending{index: 3}) {
		t.Fatal("a publish after the worker left did not ask for one")
	}
	for i := range confirmQueueSize - 1 {
		q.push(&pending{index: int64(4 + i)})
	}
	pushed := make(chan struct{})
	go func() { q.push(&pending{index: 999}); close(pushed) }()
	select {
	case <-pushed:
		t.Fatal("a publish beyond confirmQueueSize did not wait")
	case <-time.After(50 * time.Millisecond):
	}
	if p, _, _ := q.pop(); p.index != 3 {
		t.Fatalf("popped %d, want 3", p.index)
	}
	<-pushed
	if q.close() {
		t.Fatal("close asked for a second worker")
	}
	n := 0
	for {
		p, over, ok := q.pop()
		if !ok {
			if !over {
				t.Fatal("the closed queue's last pop did not say over")
			}
			break
		}
		n++
		if n == confirmQueueSize && p.index != 999 {
			t.Fatalf("the last publish is %d, want 999", p.index)
		}
	}
	if n != confirmQueueSize {
		t.Fatalf("%d publishes after close, want %d", n, confirmQueueSize)
	}
	var idle confirmQueue
	idle.own()
	if !idle.close() {
		t.Fatal("closing an idle queue did not ask for a worker to finish the session")
	}
	// A session never registered (a test's) has no worker: nothing is
	// started, as a channel without its reader.
	var unowned confirmQueue
	if unowned.push(&pending{index: 1}) || unowned.close() {
		t.Fatal("a queue without its session asked for a worker")
	}
}
