package caller

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Stream delivery (docs/harness-api.md, "Stream delivery"): instead of a
// request per delivery, one long-lived full-duplex POST to StreamPath
// carries every session's deliveries as NDJSON lines, and the app answers
// each with an ack line. A delivery is what a request would carry (one
// message, or a batch of one session's events), so the session workers,
// their order, retries and dead letters do not change: deliver and
// deliverBatch send over the stream when it is on.

// StreamPath is the app's stream endpoint.
const StreamPath = "/hcp/v1/events/stream"

// HeaderStream is how an app offers stream delivery: a 2xx answer to a
// request that carries "HCP-Stream: 1" has the sidecar open a stream to
// StreamPath for its next delivery. The stream endpoint answering 404, 405
// or 501 takes the sidecar back to requests (the refused delivery is sent
// as one at once), and offers are then ignored for batchRefusalHold.
// Options.AppStream uses the stream whatever the answers say.
const HeaderStream = "HCP-Stream"

// maxAckLine bounds one line the app writes on the stream (a nack's error
// included); a longer one breaks the stream.
const maxAckLine = 64 << 10

// errStreamNotServed: the app's stream endpoint does not exist; deliver by
// request.
var errStreamNotServed = errors.New("the app does not serve " + StreamPath)

var errStreamEnded = errors.New("the stream to the app ended")

// streamState is the sidecar's side of stream delivery.
type streamState struct {
	// mu serialises opening: the senders that find no stream wait for one.
	mu  sync.Mutex
	cur *appStream
	// offered: the app's last word was an offer (HeaderStream);
	// refusedAt is when its stream endpoint last answered 404, 405 or 501
	// (unix nanos).
	offered   atomic.Bool
	refusedAt atomic.Int64
}

// appStream is one open POST {app}/hcp/v1/events/stream.
type appStream struct {
	s      *Sidecar
	pw     streamBody // the request body
	cancel func()
	done   chan struct{} // closed when the reader returns

	// wmu: one writer at a time, so lines go out whole and in the order
	// of their delivery numbers; buf is the line being written.
	wmu sync.Mutex
	buf []byte

	mu      sync.Mutex
	sent    int64           // deliveries numbered so far
	waiting []*streamWaiter // in flight, in delivery order
	err     error           // why the stream closed; nil while open
	ending  bool            // the sidecar closes it (a stop): not a failure
}

// streamWaiter is one delivery in flight: done gets its outcome once.
type streamWaiter struct {
	n       int64
	done    chan error
	expired bool // AppTimeout passed before it was written (under appStream.mu)
}

// streamOn reports whether deliveries go over the stream.
func (s *Sidecar) streamOn() bool { return s.o.AppStream || s.appStreams.offered.Load() }

// noteStreamOffer records an offer on a 2xx answer to a request. Only the
// stream endpoint withdraws one: while the stream is on, no request is
// answered.
func (s *Sidecar) noteStreamOffer(header http.Header) {
	if s.o.AppStream || header.Get(canonStream) != "1" || s.appStreams.offered.Load() {
		return
	}
	if at := s.appStreams.refusedAt.Load(); at != 0 && s.clk.Since(time.Unix(0, at)) < batchRefusalHold {
		return
	}
	if !s.appStreams.offered.Swap(true) {
		s.log.Info("The app offers a stream; delivering over it", "header", HeaderStream, "path", StreamPath)
	}
}

// deliverStream sends ms, messages of one session in order, as one
// delivery on the stream, and reports false if the stream is off or the
// app does not serve it (then the caller sends a request).
func (s *Sidecar) deliverStream(sessionID string, ms []AppMessage) (bool, error) {
	if !s.streamOn() {
		return false, nil
	}
	st, err := s.appStream()
	if errors.Is(err, errStreamNotServed) {
		return false, nil
	}
	if err == nil {
		err = st.send(sessionID, ms)
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	s.m.AppDeliveries.WithLabelValues(result).Add(float64(len(ms)))
	return true, err
}

// appStream returns the open stream, opening one if there is none.
func (s *Sidecar) appStream() (*appStream, error) {
	s.appStreams.mu.Lock()
	defer s.appStreams.mu.Unlock()
	if st := s.appStreams.cur; st != nil && st.open() {
		return st, nil
	}
	st, err := s.openStream()
	s.appStreams.cur = st
	return st, err
}

func (st *appStream) open() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.err == nil
}

// send writes one delivery and waits for its ack (nil), its nack (a
// refusal), AppTimeout (a refusal; the stream is closed) or the stream's
// end (an error, not a refusal: the delivery is retried on a new stream).
func (st *appStream) send(sessionID string, ms []AppMessage) error {
	w := &streamWaiter{done: make(chan error, 1)}
	// Armed before the write: a write the app does not read is bounded too.
	timer := st.s.clk.AfterFunc(st.s.o.AppTimeout, func() { st.expire(w) })
	defer timer.Stop()

	st.wmu.Lock()
	st.mu.Lock()
	if st.err != nil || w.expired {
		err, expired := st.err, w.expired
		st.mu.Unlock()
		st.wmu.Unlock()
		if expired {
			// Queued behind writes the app did not read for AppTimeout.
			err = fmt.Errorf("the app did not read its stream for %s", st.s.o.AppTimeout)
			st.close(err)
			return refusal{err}
		}
		return fmt.Errorf("the stream to the app closed: %w", err)
	}
	st.sent++
	w.n = st.sent
	st.waiting = append(st.waiting, w)
	st.mu.Unlock()
	st.buf = appendDelivery(st.buf[:0], w.n, sessionID, ms)
	_, err := st.pw.Write(st.buf)
	if cap(st.buf) > 1<<20 {
		st.buf = nil // a large batch: do not keep its buffer
	}
	st.wmu.Unlock()
	if err != nil {
		st.close(fmt.Errorf("writing delivery %d: %w", w.n, err))
	}
	return <-w.done
}

// expire fails w, unanswered for AppTimeout, as refused, and closes the
// stream: its other deliveries are retried on a new one.
func (st *appStream) expire(w *streamWaiter) {
	st.mu.Lock()
	i := slices.Index(st.waiting, w)
	if w.n == 0 {
		w.expired = true // not written yet: send refuses it when its turn comes
	}
	if st.err != nil || i < 0 {
		st.mu.Unlock()
		return
	}
	st.waiting = slices.Delete(st.waiting, i, i+1)
	st.mu.Unlock()
	w.done <- refusal{fmt.Errorf("the app did not answer delivery %d on its stream within %s", w.n, st.s.o.AppTimeout)}
	st.close(fmt.Errorf("delivery %d unanswered for %s", w.n, st.s.o.AppTimeout))
}

// streamAnswer is one line of the app: {"ack": n} or {"nack": n, "error": "..."}.
type streamAnswer struct {
	Ack   *int64 `json:"ack"`
	Nack  *int64 `json:"nack"`
	Error string `json:"error"`
}

// read completes the waiters from the app's lines until the stream ends
// or the app breaks the protocol; either closes the stream.
func (st *appStream) read(body io.ReadCloser) {
	defer close(st.done)
	defer func() { _ = body.Close() }()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 512), maxAckLine)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var a streamAnswer
		if err := json.Unmarshal(line, &a); err != nil || (a.Ack == nil) == (a.Nack == nil) {
			st.close(fmt.Errorf("the app wrote a malformed line on its stream (want {\"ack\": n} or {\"nack\": n, \"error\": \"...\"}): %q", clip(line, 200)))
			return
		}
		if err := st.answer(a); err != nil {
			st.close(err)
			return
		}
	}
	err := sc.Err()
	switch {
	case errors.Is(err, bufio.ErrTooLong):
		err = fmt.Errorf("the app wrote a line longer than %d bytes on its stream", maxAckLine)
	case err == nil:
		err = errors.New("the app ended the stream")
	default:
		err = fmt.Errorf("reading the app's answers: %w", err)
	}
	st.close(err)
}

// answer completes the deliveries an ack or nack covers.
func (st *appStream) answer(a streamAnswer) error {
	n, nack := a.Ack, false
	if a.Nack != nil {
		n, nack = a.Nack, true
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if *n < 1 || *n > st.sent {
		return fmt.Errorf("the app answered delivery %d on its stream; deliveries 1 to %d were sent", *n, st.sent)
	}
	k := 0 // the waiters acked
	for k < len(st.waiting) && (st.waiting[k].n < *n || (!nack && st.waiting[k].n == *n)) {
		st.waiting[k].done <- nil
		k++
	}
	if nack {
		if k == len(st.waiting) || st.waiting[k].n != *n {
			return fmt.Errorf("the app refused delivery %d on its stream, which was answered already", *n)
		}
		st.waiting[k].done <- refusal{fmt.Errorf("app refused delivery %d on its stream: %s", *n, clip([]byte(a.Error), 512))}
		k++
	}
	st.waiting = st.waiting[k:]
	if len(st.waiting) == 0 {
		st.waiting = st.waiting[:0:0] // let the array go; appends start afresh
	}
	return nil
}

// close ends the stream once, failing its deliveries in flight (not as
// refusals: they are retried on a new stream).
func (st *appStream) close(why error) {
	st.mu.Lock()
	if st.err != nil {
		st.mu.Unlock()
		return
	}
	st.err = why
	waiting, ending := st.waiting, st.ending
	st.waiting = nil
	st.mu.Unlock()
	for _, w := range waiting {
		w.done <- fmt.Errorf("the stream to the app closed before delivery %d was answered: %w", w.n, why)
	}
	_ = st.pw.CloseWithError(why)
	st.cancel()
	if !ending {
		st.s.log.Info("The stream to the app closed; the next delivery opens a new one", "reason", why.Error(), "inFlight", len(waiting))
	}
}

// endStream ends the open stream, if any, after the last delivery (a
// stop): the request body ends, and the app's answer is awaited briefly.
func (s *Sidecar) endStream() {
	s.appStreams.mu.Lock()
	st := s.appStreams.cur
	s.appStreams.cur = nil
	s.appStreams.mu.Unlock()
	if st == nil {
		return
	}
	st.mu.Lock()
	st.ending = true
	st.mu.Unlock()
	_ = st.pw.Close()
	select {
	case <-st.done:
	case <-s.clk.After(s.o.DrainTimeout):
	}
	st.close(errors.New("the sidecar stopped"))
}

// clip shortens b for a log line or an error.
func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
