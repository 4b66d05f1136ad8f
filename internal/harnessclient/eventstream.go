package harnessclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// StreamAck is a line of a callee sidecar's answer to an event stream
// (docs/harness-api.md, "Streaming events"): the first Through lines sent
// are done (confirmed by the broker; with async, sequenced), the last of
// them got Sequence. Error, on the last line, says why the stream ended
// early (the lines after Through are not done, or their outcome is
// unknown); Done says it ended because the body did, with every line done.
type StreamAck struct {
	Through  int       `json:"through"`
	Sequence int64     `json:"sequence,omitempty"`
	Error    *APIError `json:"error,omitempty"`
	Done     bool      `json:"done,omitempty"`
}

// EventStream is an open event stream to a callee sidecar: one request
// whose body carries the session's events, a line each, for as long as the
// harness writes, and whose answer acknowledges them cumulatively.
// Send and Flush are for one goroutine at a time; Acked and Wait for any.
type EventStream struct {
	pw     *io.PipeWriter
	bw     *bufio.Writer
	cancel context.CancelFunc // ends the request: the body and the answer

	mu      sync.Mutex
	changed chan struct{} // closed and replaced at every ack
	last    StreamAck
	ended   bool
	err     error // how the answer ended, if not with an ack line
}

// OpenEventStream opens an event stream for session id on the callee
// sidecar at c.BaseURL. With async the acks come once the events are
// sequenced and written to the broker's channel, not confirmed
// (Prefer: respond-async). It returns once the sidecar answered: an
// *APIError if it refused (no such session, not running).
func (c *Client) OpenEventStream(ctx context.Context, id string, async bool) (*EventStream, error) {
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(ctx)
	// The transport reads the body until it ends, even after the
	// connection failed, and Do waits for that: the body ends with ctx.
	context.AfterFunc(ctx, func() { _ = pw.CloseWithError(errors.New("the event stream was cancelled")) })
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+"/hcp/v1/sessions/"+url.PathEscape(id)+"/events", pr)
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	if async {
		req.Header.Set("Prefer", "respond-async")
	}
	// A stream lives as long as the session: no client timeout.
	var rt http.RoundTripper
	if c.HTTP != nil {
		rt = c.HTTP.Transport
		if c.HTTP.Timeout > 0 { // bounds the answer, not the stream
			t := time.AfterFunc(c.HTTP.Timeout, cancel)
			defer t.Stop()
		}
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
		_ = resp.Body.Close()
		cancel()
		return nil, c.apiError(resp.StatusCode, data)
	}
	s := &EventStream{pw: pw, bw: bufio.NewWriterSize(pw, 32<<10), cancel: cancel, changed: make(chan struct{})}
	go s.readAcks(resp.Body, c)
	return s, nil
}

// readAcks reads the answer's lines until it ends.
func (s *EventStream) readAcks(body io.ReadCloser, c *Client) {
	defer s.cancel()
	defer func() { _ = body.Close() }()
	dec := json.NewDecoder(bufio.NewReader(body))
	var err error
	for {
		var a StreamAck
		if err = dec.Decode(&a); err != nil {
			break
		}
		if a.Error != nil {
			a.Error.Peer = c.Peer
		}
		s.mu.Lock()
		s.last = a
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	if !s.last.Done && s.last.Error == nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		s.err = fmt.Errorf("the event stream's answer ended without its last line: %w", err)
	}
	close(s.changed)
	// A writer blocked on a body nobody reads any more gets the error.
	_ = s.pw.CloseWithError(errors.Join(errors.New("the event stream ended"), s.endErr()))
}

// endErr is how the stream ended, nil if with every line done. Called with mu.
func (s *EventStream) endErr() error {
	switch {
	case s.err != nil:
		return s.err
	case s.last.Error != nil:
		return s.last.Error
	}
	return nil
}

// Send writes ev (marshalled to one line of JSON: event_type, data,
// idempotency_key) to the stream's buffer; Flush sends what is buffered.
func (s *EventStream) Send(ev any) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return s.SendLine(b)
}

// SendLine writes one event, already JSON without a newline, to the
// stream's buffer.
func (s *EventStream) SendLine(b []byte) error {
	if _, err := s.bw.Write(b); err != nil {
		return err
	}
	return s.bw.WriteByte('\n')
}

// Flush sends what Send buffered.
func (s *EventStream) Flush() error { return s.bw.Flush() }

// Acked is the last ack so far.
func (s *EventStream) Acked() StreamAck {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Wait waits until the first n lines are done and returns the ack that
// says so, or an error: the stream ended first (its error), or ctx did.
func (s *EventStream) Wait(ctx context.Context, n int) (StreamAck, error) {
	for {
		s.mu.Lock()
		a, ended, ch := s.last, s.ended, s.changed
		var err error
		if ended {
			err = s.endErr()
		}
		s.mu.Unlock()
		switch {
		case a.Through >= n:
			return a, nil
		case ended && err == nil:
			return a, fmt.Errorf("the event stream ended after %d lines, before line %d", a.Through, n)
		case ended:
			return a, err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return a, ctx.Err()
		}
	}
}

// Close flushes, ends the body and waits for the answer's last line: nil
// if every line sent is done, else why not (the last ack says how many
// are).
func (s *EventStream) Close(ctx context.Context) (StreamAck, error) {
	// A sidecar that does not read (its window full) holds the flush: ctx
	// ends it, and the stream with it.
	stop := context.AfterFunc(ctx, s.cancel)
	defer stop()
	ferr := s.bw.Flush()
	_ = s.pw.Close()
	for {
		s.mu.Lock()
		a, ended, ch := s.last, s.ended, s.changed
		err := s.endErr()
		s.mu.Unlock()
		if ctx.Err() != nil {
			return a, ctx.Err()
		}
		if ended {
			return a, errors.Join(err, ferr)
		}
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
}
