package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
)

// The floor's two streams: the harness's event stream into the floor, and
// the floor's deliveries over the app's stream, each as cheap as the
// protocol allows.

// floorStreamWindow is how many lines the floor reads ahead of the
// confirms, as the callee sidecar does (its streamWindow).
const floorStreamWindow = 1000

// floorChunk is the lines read together and published in one call.
type floorChunk struct {
	confirms []*amqp.DeferredConfirmation
	through  int // lines read up to the chunk's last
}

// serveStream serves an event stream (modeStream) full duplex, with the
// callee sidecar's ack protocol: the lines that arrived together are
// published together; a second goroutine waits for their confirms in
// order (with Prefer: respond-async, for none) and writes a cumulative
// ack {"through": n} whenever no more chunks are waiting; the last line
// has "done": true, or an error. It reads at most floorStreamWindow lines
// ahead of the confirms. No sequencing, idempotency or hostile input:
// the harness is the benchmark's.
func (p *floorPublisher) serveStream(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", contentTypeNDJSON)
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	sid := r.PathValue("id")
	async := slices.Contains(r.Header.Values("Prefer"), "respond-async")
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	chunks := make(chan floorChunk, floorStreamWindow)
	credit := make(chan struct{}, floorStreamWindow)
	writeAck := func(through int, tail string) bool {
		b := strconv.AppendInt([]byte(`{"through":`), int64(through), 10)
		_, err := w.Write(append(append(b, tail...), "}\n"...))
		return err == nil && rc.Flush() == nil
	}
	type outcome struct {
		through int
		err     error
	}
	acked := make(chan outcome, 1)
	go func() {
		var o outcome
		written := 0
		for c := range chunks {
			if o.err != nil {
				continue // let the reader finish
			}
			if !async {
				for _, dc := range c.confirms {
					if o.err = waitConfirm(ctx, dc); o.err != nil {
						break
					}
				}
			}
			if o.err == nil {
				o.through = c.through
				if len(chunks) == 0 || o.through-written >= 256 {
					if writeAck(o.through, "") {
						written = o.through
					} else {
						o.err = errors.New("writing an ack failed")
					}
				}
			}
			if o.err != nil {
				cancel()
				continue
			}
			for range c.confirms {
				<-credit
			}
		}
		acked <- o
	}()
	readErr := p.readStream(ctx, sid, bufio.NewReaderSize(r.Body, 64<<10), chunks, credit)
	close(chunks)
	o := <-acked
	switch {
	case o.err == nil && errors.Is(readErr, io.EOF):
		writeAck(o.through, `,"done":true`)
	case ctx.Err() != nil && r.Context().Err() != nil:
		// The harness went away: nobody reads the answer.
	default:
		msg, _ := json.Marshal(errors.Join(o.err, readErr).Error())
		writeAck(o.through, `,"error":{"code":"unavailable","message":`+string(msg)+`}`)
	}
}

// readStream reads lines, publishes those that arrived together (up to
// maxBatch) in one call and queues their confirms on chunks, until the
// body ends (io.EOF) or something fails.
func (p *floorPublisher) readStream(ctx context.Context, sid string, br *bufio.Reader, chunks chan<- floorChunk, credit chan struct{}) error {
	events := make([]floorEvent, 0, maxBatch)
	lines := 0
	for {
		events = events[:0]
		var readErr error
		for len(events) < maxBatch && (len(events) == 0 || lineBuffered(br)) {
			line, err := readNDJSONLine(br, 1<<20)
			if err != nil {
				readErr = err
				break
			}
			var ev floorEvent
			if err := json.Unmarshal(line, &ev); err != nil {
				readErr = fmt.Errorf("line %d: %w", lines+len(events)+1, err)
				break
			}
			select {
			case credit <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
			events = append(events, ev)
		}
		if len(events) > 0 {
			confirms, err := p.publish(ctx, sid, events)
			if err != nil {
				return err
			}
			lines += len(events)
			chunks <- floorChunk{confirms: confirms, through: lines}
		}
		if readErr != nil {
			return readErr
		}
	}
}

// deliverStream is the floor's consumer for an app that offers a stream:
// one full-duplex POST to the app's caller.StreamPath; the deliveries that
// are ready (up to prefetch) are written at once, a line per run of one
// session's deliveries; the app's cumulative acks are turned into
// multiple acks of the last delivery they cover, once per burst and at
// the latest every half window, as deliver does. It returns when
// deliveries closes (ending the body) or the stream fails.
func deliverStream(ctx context.Context, deliveries <-chan amqp.Delivery, prefetch int, appURL string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	defer func() { _ = pw.Close() }()
	// The transport reads the body until it ends, even after the request
	// failed: end it with the request.
	context.AfterFunc(ctx, func() { _ = pw.CloseWithError(context.Canceled) })
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, appURL+caller.StreamPath, pr)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", contentTypeNDJSON)
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s", caller.StreamPath, resp.Status)
	}

	// Lines written and not yet acked, in order: each has a delivery, and
	// the broker has at most prefetch unacked.
	inFlight := make(chan streamLine, prefetch)
	errc := make(chan error, 1)
	go func() {
		errc <- ackStream(resp.Body, inFlight, prefetch)
		cancel()
	}()
	var (
		buf bytes.Buffer
		n   int64
	)
	for d := range deliveries {
		buf.Reset()
		ready := []amqp.Delivery{d}
		for len(ready) < prefetch && len(deliveries) > 0 {
			ready = append(ready, <-deliveries)
		}
		for len(ready) > 0 {
			k := 1
			for k < len(ready) && ready[k].CorrelationId == ready[0].CorrelationId {
				k++
			}
			n++
			buf.WriteString(`{"delivery":`)
			buf.WriteString(strconv.FormatInt(n, 10))
			buf.WriteString(`,"session_id":"`)
			buf.WriteString(ready[0].CorrelationId)
			buf.WriteString(`","messages":[`)
			for i, m := range ready[:k] {
				if i > 0 {
					buf.WriteByte(',')
				}
				writeAppMessage(&buf, m)
			}
			buf.WriteString("]}\n")
			inFlight <- streamLine{n: n, count: k, last: ready[k-1]}
			ready = ready[k:]
		}
		if _, err := pw.Write(buf.Bytes()); err != nil {
			select {
			case err = <-errc:
			case <-ctx.Done():
			}
			return fmt.Errorf("the stream to the app: %w", err)
		}
	}
	return nil
}

// streamLine is a line deliverStream wrote: its delivery number, how
// many AMQP deliveries it carries and the last of them.
type streamLine struct {
	n     int64
	count int
	last  amqp.Delivery
}

// ackStream reads the app's answers and acks the deliveries they cover.
func ackStream(body io.Reader, inFlight <-chan streamLine, prefetch int) error {
	sc := bufio.NewScanner(body)
	unacked := 0
	for sc.Scan() {
		var a struct {
			Ack   *int64 `json:"ack"`
			Nack  *int64 `json:"nack"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil || a.Ack == nil {
			return fmt.Errorf("the app answered %q on its stream", sc.Bytes())
		}
		var last streamLine
		for last.n < *a.Ack {
			select {
			case last = <-inFlight:
			default:
				return fmt.Errorf("the app acked delivery %d, beyond those written", *a.Ack)
			}
			unacked += last.count
		}
		if len(inFlight) > 0 && unacked < max(prefetch/2, 1) {
			continue
		}
		if err := last.last.Ack(true); err != nil {
			return err
		}
		unacked = 0
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.EOF
}
