package caller

import (
	"bufio"
	"io"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestAppStreamTimeoutWhileQueued: a delivery whose
// AppTimeout timer fires while it still waits for the stream's write lock
// (another delivery's line is being written: the app reads slowly) is
// refused when its turn comes (it was found in no waiting list; once
// written nothing would have bounded its wait), and the stream is closed.
func TestAppStreamTimeoutWhileQueued(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	s := &Sidecar{o: Options{AppTimeout: 30 * time.Second}, clk: clk, log: logr.Discard()}
	body, pw := io.Pipe()    // the request body, read by the test as the app
	answers, aw := io.Pipe() // the app's answer
	st := &appStream{s: s, pw: pw, cancel: func() {}, done: make(chan struct{})}
	go st.read(answers)
	defer func() { _ = aw.Close(); _ = body.Close() }()

	msg := func(sid string) []AppMessage {
		return []AppMessage{{SessionID: sid, MessageID: "m-" + sid, Type: "event", Sequence: 1}}
	}
	first := make(chan error, 1)
	go func() { first <- st.send("s1", msg("s1")) }()
	waitUntil(t, func() bool { st.mu.Lock(); defer st.mu.Unlock(); return st.sent == 1 }) // holds wmu, blocked writing
	second := make(chan error, 1)
	go func() { second <- st.send("s2", msg("s2")) }()
	time.Sleep(200 * time.Millisecond) // its timer armed; parked on wmu

	// The app answers delivery 1 (it will have read it by the time this is
	// read) before its timeout...
	if _, err := aw.Write([]byte(`{"ack":1}` + "\n")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { st.mu.Lock(); defer st.mu.Unlock(); return len(st.waiting) == 0 })
	// ...but reads the body slowly: AppTimeout passes while delivery 2 waits
	// for the write lock.
	clk.Step(31 * time.Second)
	time.Sleep(200 * time.Millisecond)
	br := bufio.NewReader(body)
	if _, err := br.ReadBytes('\n'); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("delivery 1: %v", err)
	}
	// Delivery 2's AppTimeout passed while it waited to be written: it
	// ends as refused, unwritten, and the stream is closed.
	select {
	case err := <-second:
		if !isRefusal(err) {
			t.Fatalf("delivery 2: %v, want a refusal (AppTimeout)", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("delivery 2 is still waiting although its AppTimeout (30 s) passed while it waited for the write lock")
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
