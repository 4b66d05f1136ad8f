package transport

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"testing"
)

// recordingConn records each write; fail makes writes fail.
type recordingConn struct {
	net.Conn
	writes [][]byte
	fail   error
	closed bool
}

func (c *recordingConn) Write(p []byte) (int, error) {
	if c.fail != nil {
		return 0, c.fail
	}
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *recordingConn) Close() error { c.closed = true; return nil }

func (c *recordingConn) got() []string {
	var s []string
	for _, w := range c.writes {
		s = append(s, string(w))
	}
	return s
}

// TestWireKeepsOrder: a batch's publishes go out in one write at its end;
// a write that is not a batch's publish goes out at once, preceded by
// what is held; outside a batch nothing is held.
func TestWireKeepsOrder(t *testing.T) {
	rc := &recordingConn{}
	w := &wire{Conn: rc}
	write := func(s string) {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	publish := func(s string) { w.own(func() { write(s) }) }

	publish("p0")
	w.beginBatch()
	publish("p1")
	publish("p2")
	write("heartbeat") // another goroutine's write: not held, nothing overtaken
	publish("p3")
	publish("p4")
	w.endBatch()
	publish("p5")
	if want := []string{"p0", "p1p2heartbeat", "p3p4", "p5"}; !slices.Equal(rc.got(), want) {
		t.Fatalf("socket writes %q, want %q", rc.got(), want)
	}

	rc.writes = nil
	w.beginBatch()
	publish(string(make([]byte, wireHoldMax)))
	publish("after")
	w.endBatch()
	if len(rc.writes) != 2 || len(rc.writes[0]) != wireHoldMax {
		t.Fatalf("a batch over wireHoldMax: writes of %d bytes, want %d then the rest", lens(rc.writes), wireHoldMax)
	}
}

func lens(ws [][]byte) []int {
	var n []int
	for _, w := range ws {
		n = append(n, len(w))
	}
	return n
}

// TestWireWriteError: a held write that fails closes the socket and
// fails every later write, so amqp091-go sees the connection fail.
func TestWireWriteError(t *testing.T) {
	rc := &recordingConn{}
	w := &wire{Conn: rc}
	w.beginBatch()
	w.own(func() {
		if _, err := w.Write([]byte("held")); err != nil {
			t.Fatalf("a held write failed: %v", err)
		}
	})
	rc.fail = errors.New("connection reset")
	w.endBatch()
	if !rc.closed {
		t.Fatal("the socket stayed open after a held write failed")
	}
	if _, err := w.Write([]byte("next")); err == nil {
		t.Fatal("a write after the failure succeeded")
	}
}
