package caller

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
)

// openStream POSTs to StreamPath and waits (up to AppTimeout) for the
// app's answer. Like a request, the stream is not bound to the run
// context: a graceful stop ends it after the last delivery (endStream).
func (s *Sidecar) openStream() (*appStream, error) {
	var (
		body   streamBody
		cancel func()
		resp   *http.Response
		err    error
	)
	if s.appConns != nil {
		var c *streamConn
		c, resp, err = s.appConns.openStream(s.o.AppTimeout)
		if c != nil {
			body, cancel = c, func() { _ = c.nc.Close() }
		}
	} else {
		body, cancel, resp, err = s.openHTTPStream()
	}
	fail := func(err error) (*appStream, error) {
		if resp != nil {
			_ = resp.Body.Close()
		}
		if cancel != nil {
			cancel()
			_ = body.Close()
		}
		return nil, err
	}
	switch {
	case errors.Is(err, errAppTimeout):
		// The app took the request and did not answer in time: as for a
		// request, that counts as refused.
		return fail(refusal{fmt.Errorf("the app did not answer %s within %s", StreamPath, s.o.AppTimeout)})
	case err != nil:
		return fail(err)
	}
	switch code := resp.StatusCode; {
	case code >= 200 && code <= 299:
	case code == http.StatusNotFound || code == http.StatusMethodNotAllowed || code == http.StatusNotImplemented:
		if s.o.AppStream {
			return fail(refusal{fmt.Errorf("app answered %s on %s (%s is set)", resp.Status, StreamPath, config.EnvAppStream)})
		}
		// An older app rolled out: requests again, offers ignored a while.
		s.appStreams.refusedAt.Store(s.clk.Now().UnixNano())
		s.appStreams.offered.Store(false)
		s.log.Info("The app does not serve its stream endpoint; delivering by requests", "status", resp.Status, "hold", batchRefusalHold.String())
		return fail(errStreamNotServed)
	default:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fail(refusal{fmt.Errorf("app answered %s on %s: %s", resp.Status, StreamPath, bytes.TrimSpace(msg))})
	}
	s.noteBatchOffer(StreamPath, resp.StatusCode, resp.Header)
	st := &appStream{s: s, pw: body, cancel: cancel, done: make(chan struct{})}
	go st.read(resp.Body)
	s.log.Info("Opened a stream to the app", "path", StreamPath)
	return st, nil
}

// streamBody is the body of the stream's request: each Write one delivery
// line, Close its end, CloseWithError a break.
type streamBody interface {
	io.WriteCloser
	CloseWithError(error) error
}

// openHTTPStream is openStream's request through Options.HTTPClient (see
// appConns for when): the body is a pipe that the transport copies. No
// answer within AppTimeout is errAppTimeout, as for a request.
func (s *Sidecar) openHTTPStream() (body streamBody, cancel func(), resp *http.Response, err error) {
	pr, pw := io.Pipe()
	ctx, cancelCtx := context.WithCancel(context.WithoutCancel(s.ctx()))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(s.cfg.HarnessURL, "/")+StreamPath, pr)
	if err != nil {
		return pw, cancelCtx, nil, err
	}
	req.Header.Set("Content-Type", server.ContentTypeNDJSON)
	// Connection: close has a server that does not read the body answer at
	// once: Go's, for one, otherwise reads (to discard) up to 256 KiB of
	// it or its end before it writes a 404, and neither ever comes.
	req.Close = true
	// The transport reads the body until it ends, even after the request
	// failed or was cancelled (and Do waits for that): end it with the
	// request.
	context.AfterFunc(ctx, func() { _ = pw.CloseWithError(errStreamEnded) })
	timer := s.clk.AfterFunc(s.o.AppTimeout, cancelCtx)
	resp, err = s.http.Do(req)
	if !timer.Stop() {
		err = timeoutErr(err)
	}
	return pw, cancelCtx, resp, err
}
