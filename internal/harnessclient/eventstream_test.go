package harnessclient

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// stalledSidecar is a transport whose sidecar answered 200 and then stopped
// reading the body (its window of 1,000 lines is full while the broker
// holds the confirms back: a memory alarm, a full reject-publish queue),
// and has written no ack yet. Writes to the body block, as they do once
// TCP's buffers are full.
type stalledSidecar struct{ answer *io.PipeWriter }

func (s *stalledSidecar) RoundTrip(req *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	s.answer = pw
	return &http.Response{StatusCode: 200, Status: "200 OK", Header: http.Header{"Content-Type": {"application/x-ndjson"}},
		Body: pr, Request: req, ProtoMajor: 1, ProtoMinor: 1}, nil
}

// TestEventStreamCloseHonoursContext: EventStream.Close
// flushes before it looks at its context, and the flush blocks for as long
// as the sidecar does not read, so Close(ctx) with a deadline never
// would return: a harness that ends its session with a bounded Close
// would hang.
func TestEventStreamCloseHonoursContext(t *testing.T) {
	rt := &stalledSidecar{}
	hc := New("http://sidecar.invalid", "")
	hc.HTTP = &http.Client{Transport: rt}
	es, err := hc.OpenEventStream(t.Context(), "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10", false)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rt.answer.Close() }()
	if err := es.SendLine([]byte(`{"event_type":"log","data":{"level":"info","message":"` + strings.Repeat("x", 100) + `"}}`)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := es.Close(ctx); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Close reported every line done; nothing was acked")
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Close(ctx) with a 300ms deadline still blocked after 3s: its flush waits on a body the sidecar does not read, before the context is looked at")
	}
}

// TestEventStreamOpenFailsInTime: a sidecar that takes the
// stream's request and drops the connection without an answer (a crash; or
// an idle keep-alive connection the server had closed, which the transport
// reuses: see the "http: panic serving … invalid concurrent Body.Read call"
// in TestEventStreamHostileInput's log) must make OpenEventStream fail, at
// the latest when its context ends: http.Client.Do waits for the
// transport's write loop, which is blocked reading the request body, so
// the body pipe must end with the context.
func TestEventStreamOpenFailsInTime(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // read the request's head, then drop the connection
				br := bufio.NewReader(c)
				for {
					l, err := br.ReadString('\n')
					if err != nil || l == "\r\n" {
						break
					}
				}
				_ = c.Close()
			}()
		}
	}()
	hc := New("http://"+ln.Addr().String(), "")
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		es, err := hc.OpenEventStream(ctx, "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10", false)
		if es != nil {
			_, _ = es.Close(context.Background())
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a stream opened on a connection dropped without an answer")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OpenEventStream still blocked 5s after the connection dropped and 4s after its context ended (Do waits for a write loop blocked on the body pipe)")
	}
}
