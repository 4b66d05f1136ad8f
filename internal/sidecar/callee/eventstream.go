package callee

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
)

// An event stream is the harness API's streaming form of POST …/events
// (docs/harness-api.md, "Streaming events"): a request body of
// newline-delimited events, read for as long as the harness writes, and a
// response of newline-delimited cumulative acknowledgements written while
// the body is still read (HTTP/1.1 full duplex, or HTTP/2). It spares the
// harness and the sidecar an HTTP exchange per event; the events are the
// same, sequenced, logged and published exactly as a request's.
const (
	// streamWindow is how many credit tokens a stream has: a line read
	// and not yet done (confirmed by the broker; with Prefer:
	// respond-async, written to the channel) holds one per started
	// streamTokenBytes, so the sidecar reads at most 1,000 lines, or about
	// 16 MiB, ahead; beyond it it stops reading and TCP holds the harness
	// back.
	streamWindow     = 1000
	streamTokenBytes = 16 << 10
	// streamAckEvery is how many lines may be confirmed before an ack is
	// written although more are already queued behind them.
	streamAckEvery = 256
)

// streamAck is a line of a stream's answer. Through counts the body's
// lines (from 1; blank lines are not counted) that are done: published and
// confirmed (with respond-async: sequenced and written to the channel);
// Sequence is the sequence the last of them got. Error, on the last line,
// says why the stream ended early: the lines after Through have not been
// published, or their outcome is unknown (retry them with their
// idempotency keys). Done, on the last line, says every line was read and
// is done.
type streamAck struct {
	Through  int           `json:"through"`
	Sequence int64         `json:"sequence,omitempty"`
	Error    *server.Error `json:"error,omitempty"`
	Done     bool          `json:"done,omitempty"`
}

// streamChunk is what one publishEvents call made of some lines: the
// pendings to confirm and where the lines end.
type streamChunk struct {
	ps      []*pending
	tokens  int // the credit its lines hold
	through int
	seq     int64
}

// isNDJSON reports whether the request's body is an event stream.
func isNDJSON(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == server.ContentTypeNDJSON
}

// fullDuplex lets the handler answer while the body is still being
// written, before anything else is answered: without it net/http reads the
// rest of a body the handler did not read before it sends an answer (an
// error's too), which a stream's harness writes only after that answer.
// HTTP/2 is full duplex already.
func fullDuplex(w http.ResponseWriter) bool {
	err := http.NewResponseController(w).EnableFullDuplex()
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		server.Errorf(w, http.StatusInternalServerError, server.CodeUnavailable, "cannot stream: %v", err)
		return false
	}
	return true
}

// apiEventStream serves POST …/events with an NDJSON body. The handler's
// goroutine reads the body and publishes the lines that arrived together
// in one call (one log write); a second goroutine waits for their confirms
// in order and writes the acks, coalesced.
func (s *Sidecar) apiEventStream(w http.ResponseWriter, r *http.Request, ss *sess) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", server.ContentTypeNDJSON)
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()

	st := &eventStream{
		ss: ss, async: slices.Contains(r.Header.Values("Prefer"), "respond-async"),
		chunks: make(chan streamChunk, streamWindow), credit: make(chan struct{}, streamWindow),
		dead: make(chan struct{}),
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	// Ending ctx wakes a read that waits for the harness, and bounds a
	// write to a harness that does not read its answer.
	stop := context.AfterFunc(ctx, func() {
		_ = rc.SetReadDeadline(time.Now())
		_ = rc.SetWriteDeadline(time.Now().Add(time.Second))
	})
	defer stop()
	go func() { // the sidecar stopping ends the stream too
		select {
		case <-s.life.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	type outcome struct {
		last streamAck
		err  error
	}
	confirmed := make(chan outcome, 1)
	go func() { last, err := st.confirm(ctx, cancel, w, rc); confirmed <- outcome{last, err} }()
	readErr := st.read(ctx, bufio.NewReaderSize(r.Body, 64<<10))
	close(st.chunks)
	o := <-confirmed
	last := o.last
	var refused *apiError
	switch {
	case o.err == nil && readErr == nil:
		last.Done = true
	case o.err != nil && !errors.Is(o.err, context.Canceled) && !errors.Is(o.err, errAnswerLost):
		last.Error = publishError(o.err).body
	case s.life.Err() != nil:
		last.Error = &server.Error{Code: server.CodeUnavailable, Message: "the sidecar is stopping; open a new stream and send the lines after through again"}
	case errors.As(readErr, &refused) && o.err == nil:
		last.Error = refused.body
	default:
		return // the harness went away, or stopped reading: nobody reads the answer
	}
	writeAckLine(w, rc, last)
}

// eventStream is one stream's state, shared by its reader and confirmer.
type eventStream struct {
	ss     *sess
	async  bool
	chunks chan streamChunk
	credit chan struct{} // the tokens of the lines read and not yet done
	dead   chan struct{} // closed when the confirmer gives up
	lines  int
}

// read reads and publishes lines until the body ends (nil) or fails, a
// line is refused, ctx ends or the confirmer gives up; an error other
// than the body's end or ctx's is an *apiError.
func (st *eventStream) read(ctx context.Context, br *bufio.Reader) error {
	evs := make([]harnessEvent, 0, 64)
	for {
		evs = evs[:0]
		var (
			refused        *apiError
			readErr        error // after the lines read before it are published
			tokens, nbytes int
		)
		// Take the lines that are here already (at least one), up to a
		// request's worth: they are published together.
		for len(evs) < maxBatchSize && nbytes < maxBatchBody && (len(evs) == 0 || br.Buffered() > 0) {
			line, err := readLine(br)
			if err != nil {
				readErr = err
				break
			}
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			n := 1 + len(line)/streamTokenBytes
			if !st.take(ctx, n) {
				st.give(tokens)
				return ctx.Err()
			}
			ev, err := parseEvent(line)
			if err != nil {
				refused = badRequest(fmt.Errorf("line %d: %w", st.lines+len(evs)+1, err))
				st.give(n)
				break
			}
			evs = append(evs, ev)
			tokens += n
			nbytes += len(line)
		}
		if len(evs) > 0 {
			ps, seqs, e := st.ss.publishEvents(ctx, evs)
			if e != nil {
				// As for a request that fails: the outcome of this call's
				// lines is unknown; the harness retries them with their
				// idempotency keys.
				st.give(tokens)
				return e
			}
			st.lines += len(evs)
			st.chunks <- streamChunk{ps: ps, tokens: tokens, through: st.lines, seq: seqs[len(seqs)-1]}
		}
		if refused != nil {
			return refused
		}
		if readErr != nil {
			return st.endOfBody(ctx, readErr)
		}
	}
}

// take waits for n credit tokens; false if ctx ended or the confirmer gave
// up first (the tokens taken are given back).
func (st *eventStream) take(ctx context.Context, n int) bool {
	for i := range n {
		select {
		case st.credit <- struct{}{}:
		case <-st.dead:
			st.give(i)
			return false
		case <-ctx.Done():
			st.give(i)
			return false
		}
	}
	return true
}

// give returns n credit tokens.
func (st *eventStream) give(n int) {
	for range n {
		<-st.credit
	}
}

// endOfBody words why reading stopped with nothing read: the body's end
// (nil), or an error.
func (st *eventStream) endOfBody(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, bufio.ErrBufferFull):
		return &apiError{http.StatusRequestEntityTooLarge, &server.Error{Code: server.CodeTooLarge,
			Message: fmt.Sprintf("line %d is over %d bytes; an event must fit an envelope", st.lines+1, maxEventBody)}}
	}
	return &apiError{http.StatusBadRequest, &server.Error{Code: server.CodeBadRequest, Message: "reading the stream: " + err.Error()}}
}

// readLine reads one line of at most maxEventBody bytes (its newline
// dropped); a last line without a newline counts.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == nil {
		return line[:len(line)-1], nil
	}
	if errors.Is(err, bufio.ErrBufferFull) {
		long := append([]byte(nil), line...)
		for errors.Is(err, bufio.ErrBufferFull) && len(long) <= maxEventBody {
			line, err = br.ReadSlice('\n')
			long = append(long, line...)
		}
		if len(long) > maxEventBody {
			return nil, bufio.ErrBufferFull
		}
		if err == nil {
			return long[:len(long)-1], nil
		}
		line = long
	}
	if errors.Is(err, io.EOF) && len(line) > 0 {
		return line, nil
	}
	return nil, err
}

// errAnswerLost: an ack could not be written (the harness does not read
// its answer, or went away).
var errAnswerLost = errors.New("the stream's answer could not be written")

// confirm waits for each chunk's confirms in order and writes the acks,
// one per run of chunks that are done (at least every streamAckEvery
// lines). It returns the last ack done, and why it stopped early: a
// publish that failed, ctx, or errAnswerLost; then it cancels the reader.
func (st *eventStream) confirm(ctx context.Context, cancel context.CancelFunc, w io.Writer, rc *http.ResponseController) (streamAck, error) {
	var done, written streamAck
	fail := func(err error) (streamAck, error) {
		close(st.dead)
		cancel()
		for ch := range st.chunks { // let the reader finish
			st.give(ch.tokens)
		}
		return done, err
	}
	for ch := range st.chunks {
		if !st.async {
			if err := waitAll(ctx, ch.ps); err != nil {
				st.give(ch.tokens)
				return fail(err)
			}
		}
		st.give(ch.tokens)
		// An ack lets the harness go on: only an owner gives one
		// (respond).
		if err := st.ss.sc.fence(st.ss); err != nil {
			return fail(err)
		}
		done.Through, done.Sequence = ch.through, ch.seq
		if len(st.chunks) == 0 || done.Through-written.Through >= streamAckEvery {
			if !writeAckLine(w, rc, done) {
				return fail(errAnswerLost)
			}
			written = done
		}
	}
	return done, nil
}

// writeAckLine writes one line of the answer and flushes it.
func writeAckLine(w io.Writer, rc *http.ResponseController, a streamAck) bool {
	b := make([]byte, 0, 96)
	b = append(b, `{"through":`...)
	b = strconv.AppendInt(b, int64(a.Through), 10)
	if a.Sequence > 0 {
		b = append(b, `,"sequence":`...)
		b = strconv.AppendInt(b, a.Sequence, 10)
	}
	if a.Error != nil {
		e, _ := json.Marshal(a.Error)
		b = append(append(b, `,"error":`...), e...)
	}
	if a.Done {
		b = append(b, `,"done":true`...)
	}
	b = append(b, "}\n"...)
	if _, err := w.Write(b); err != nil {
		return false
	}
	return rc.Flush() == nil
}
