package relay

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/hcp-io/hcp-operator/internal/harnessclient"
)

// The benchmark harness's stream mode (modeStream) and what the stand-ins
// of the stream endpoints share.

// contentTypeNDJSON is the media type of both directions of every stream.
const contentTypeNDJSON = "application/x-ndjson"

// openStreams opens an event stream for each session (not async: a line
// is done once the broker confirmed it, as in batch mode). On an error the
// streams already open are cut by ctx, which emit cancels.
func (r *harnessDriver) openStreams(ctx context.Context, sids []string) ([]*harnessclient.EventStream, error) {
	c := &harnessclient.Client{BaseURL: r.base, HTTP: r.hc, Peer: "the harness API"}
	out := make([]*harnessclient.EventStream, 0, len(sids))
	for _, sid := range sids {
		st, err := c.OpenEventStream(ctx, sid, false)
		if err != nil {
			return nil, fmt.Errorf("opening the event stream of %s: %w", sid, err)
		}
		out = append(out, st)
	}
	return out, nil
}

// sendStream is one session's harness in stream mode: each event of ch a
// line, flushed when ch has nothing more ready (paced events go at once,
// unpaced ones coalesce, up to the client's buffer), without waiting for
// acks; at the end it closes the stream and wants every line done.
func (r *harnessDriver) sendStream(ctx context.Context, st *harnessclient.EventStream, ch <-chan benchEvent, total int) error {
	pad := strings.Repeat("x", eventPadding())
	var buf bytes.Buffer
	lines := 0
	write := func(ev benchEvent) error {
		buf.Reset()
		writeEvent(&buf, ev, total, pad)
		lines++
		return st.SendLine(buf.Bytes())
	}
	fail := func(err error) error {
		// The stream's own error, if it ended, says more than the pipe's.
		_, cerr := st.Close(ctx)
		return fmt.Errorf("event stream, line %d (%d done): %w", lines, st.Acked().Through, errors.Join(err, cerr))
	}
	for ev := range ch {
		if err := write(ev); err != nil {
			return fail(err)
		}
	ready:
		for {
			select {
			case next, ok := <-ch:
				if !ok {
					break ready
				}
				if err := write(next); err != nil {
					return fail(err)
				}
			default:
				break ready
			}
		}
		if err := st.Flush(); err != nil {
			return fail(err)
		}
	}
	a, err := st.Close(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("closing the event stream: %d of %d lines done: %w", a.Through, lines, err)
	case !a.Done || a.Through != lines:
		return fmt.Errorf("the event stream ended with %d of %d lines done (done %t)", a.Through, lines, a.Done)
	}
	return nil
}

// readNDJSONLine reads one line (its newline dropped) of at most max
// bytes; a last line without a newline counts. The line is valid until
// the next read.
func readNDJSONLine(br *bufio.Reader, max int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		long := append([]byte(nil), line...)
		for errors.Is(err, bufio.ErrBufferFull) && len(long) <= max {
			line, err = br.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	switch {
	case len(line) > max:
		return nil, fmt.Errorf("a line over %d bytes", max)
	case err == nil:
		return line[:len(line)-1], nil
	case len(line) > 0 && errors.Is(err, io.EOF):
		return line, nil
	}
	return nil, err
}

// lineBuffered reports whether a whole line is buffered in br already.
func lineBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}
