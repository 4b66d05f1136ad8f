package caller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/tracing"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// EventsPath is where the sidecar POSTs messages on the app.
const EventsPath = "/hcp/v1/events"

// AppMessage is the body of POST {app}/hcp/v1/events: one message of a
// session's stream. Type is the L1 message type: task_accepted,
// task_rejected, event, task_completed or task_failed. Payload is the L1
// payload verbatim; for events Sequence, EventType and Data repeat its
// fields for convenience.
type AppMessage struct {
	SessionID     string          `json:"session_id"`
	MessageID     string          `json:"message_id"`
	Type          string          `json:"type"`
	Timestamp     string          `json:"timestamp"`
	CalleeID      string          `json:"callee_id"`
	TaskMessageID string          `json:"task_message_id,omitempty"`
	Sequence      int64           `json:"sequence,omitempty"`
	EventType     string          `json:"event_type,omitempty"`
	Data          json.RawMessage `json:"data,omitempty"`
	Payload       json.RawMessage `json:"payload"`
	// Redelivered: the broker delivered this message before (to this
	// sidecar before a restart or reconnect, or before a failed attempt).
	// The app may have processed it already if the sidecar was killed
	// between the app's 2xx and recording it; deduplicate on (session_id,
	// sequence) or message_id when processing twice would hurt.
	Redelivered bool `json:"redelivered"`
	// Lost, on the first event after sequences the sidecar gave up on,
	// names them: they will never be delivered (see docs/harness-api.md,
	// "Gaps").
	Lost *Lost `json:"lost,omitempty"`
	// Traceparent and Tracestate are the W3C trace context the message
	// carried from the callee (its AMQP headers: the session's trace), if
	// any. The request's traceparent header is the same, or, with tracing
	// on, the caller sidecar's delivery span in that trace.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
}

// Lost is a range of a session's sequences that the sidecar gave up on,
// and why: LostNotInQueue, LostGapTimeout or LostBufferOverflow.
type Lost struct {
	From   int64  `json:"from"`
	To     int64  `json:"to"`
	Reason string `json:"reason"`
}

// Reasons of Lost.
const (
	// LostNotInQueue: the callee's sidecar had the broker's confirm for
	// them before it published an event that has arrived since
	// (envelope.HeaderConfirmedThrough), so the queue no longer holds them
	// (message TTL, overflow, delivery limit, or a callee replica lost
	// before its confirm), or a previous pod of this caller delivered them.
	LostNotInQueue = "not_in_queue"
	// LostGapTimeout: a sender that does not mark its events left the gap
	// open for GapTimeout (L2: log a warning and continue).
	LostGapTimeout = "gap_timeout"
	// LostBufferOverflow: more events waited behind the gap than the
	// reorder buffer holds.
	LostBufferOverflow = "buffer_overflow"
)

// Headers set on every POST to the app, besides Content-Type.
const (
	HeaderSessionID      = "HCP-Session-ID"
	HeaderSequence       = "HCP-Sequence"
	HeaderMessageType    = "HCP-Message-Type"
	HeaderIdempotencyKey = "Idempotency-Key"
)

// HeaderBatchMax is how an app offers batch delivery: a 2xx answer that
// carries "HCP-Batch-Max: N" (2 to config.MaxAppBatch) lets the sidecar
// POST up to N ready events of a session at once to BatchPath from then
// on. Every answer decides again: a 2xx without it, or the batch endpoint
// answering 404, 405 or 501, takes the sidecar back to one event per
// request, and after such a refusal offers are ignored for
// batchRefusalHold. Options.AppMaxBatch above 1 fixes the batch size
// instead, and the header is then ignored.
const HeaderBatchMax = "HCP-Batch-Max"

// batchRefusalHold is how long the sidecar ignores the app's offers after
// its batch endpoint refused a batch: an app that offers batches but does
// not serve them (a misconfigured route) costs one refused request a
// minute, not one per event.
const batchRefusalHold = time.Minute

func (s *Sidecar) appMessage(it *item, calleeID, taskMessageID string) AppMessage {
	m := AppMessage{
		SessionID:     it.env.Session(),
		MessageID:     it.env.MessageID,
		Type:          string(it.env.Type),
		Timestamp:     it.env.Timestamp.UTC().Format(envelope.TimestampLayout),
		CalleeID:      calleeID,
		TaskMessageID: taskMessageID,
		Payload:       it.env.Payload,
		Redelivered:   it.d.Redelivered,
	}
	if tc := tracing.FromAMQP(it.d.Headers); !tc.IsZero() {
		m.Traceparent, m.Tracestate = tc.Parent, tc.State
	}
	if it.event != nil {
		m.Sequence = it.event.Sequence
		m.EventType = string(it.event.EventType)
		m.Data = it.event.Data
	}
	return m
}

// BatchPath is where the sidecar POSTs several events of one session at
// once when Options.AppMaxBatch is above 1 (body: AppBatch).
const BatchPath = "/hcp/v1/events/batch"

// AppBatch is the body of POST {app}/hcp/v1/events/batch: consecutive
// events of one session, in sequence order. A 2xx means the app processed
// every one of them; anything else, none (the same batch is retried).
type AppBatch struct {
	SessionID string       `json:"session_id"`
	Messages  []AppMessage `json:"messages"`
}

// deliver sends m to the app, on the stream when it is on (see
// appstream.go), else in a POST, and reports whether the app took it.
func (s *Sidecar) deliver(m AppMessage) error {
	trace := tracing.Context{Parent: m.Traceparent, State: m.Tracestate}
	var span tracing.Span
	if tracing.Enabled() { // the attributes cost allocations: only when on
		span, trace = tracing.StartSpan("hcp.deliver "+m.Type, oteltrace.SpanKindClient, trace,
			attribute.String("hcp.session_id", m.SessionID), attribute.String("hcp.message_id", m.MessageID),
			attribute.String("hcp.message_type", m.Type), attribute.Int64("hcp.sequence", m.Sequence))
	}
	one := [1]AppMessage{m}
	streamed, err := s.deliverStream(m.SessionID, one[:])
	if !streamed {
		body := s.bodyBuf(320 + len(m.Payload) + len(m.Data))
		*body = m.AppendJSON(*body)
		seq := ""
		if m.Sequence > 0 {
			seq = strconv.FormatInt(m.Sequence, 10)
		}
		err = s.post(EventsPath, appHeaders(m.SessionID, m.Type, m.MessageID, seq, trace), *body, 1)
		s.bodyDone(body)
	}
	endDelivery(span, err)
	return err
}

// deliverBatch sends ms, events of one session in order, to the app, as
// one delivery on the stream when it is on, else in a POST to its batch
// endpoint, and reports whether the app took them. The request's
// traceparent is the first message's (each message carries its own in the
// body); with tracing on, the delivery span is in the first message's
// trace and links to the others'.
func (s *Sidecar) deliverBatch(ms []AppMessage) error {
	first, last := ms[0], ms[len(ms)-1]
	trace := tracing.Context{Parent: first.Traceparent, State: first.Tracestate}
	var span tracing.Span
	if tracing.Enabled() {
		others := make([]tracing.Context, 0, len(ms)-1)
		for _, m := range ms[1:] {
			others = append(others, tracing.Context{Parent: m.Traceparent, State: m.Tracestate})
		}
		span, trace = tracing.StartSpanLinked("hcp.deliver batch", oteltrace.SpanKindClient, trace, others,
			attribute.String("hcp.session_id", first.SessionID), attribute.Int("hcp.batch_size", len(ms)),
			attribute.Int64("hcp.sequence", first.Sequence), attribute.Int64("hcp.last_sequence", last.Sequence))
	}
	streamed, err := s.deliverStream(first.SessionID, ms)
	if !streamed {
		size := 64
		for i := range ms {
			size += 320 + len(ms[i].Payload) + len(ms[i].Data)
		}
		body := s.bodyBuf(size)
		*body = (&AppBatch{SessionID: first.SessionID, Messages: ms}).AppendJSON(*body)
		err = s.post(BatchPath, appHeaders(first.SessionID, first.Type, first.MessageID+".."+last.MessageID,
			strconv.FormatInt(first.Sequence, 10)+"-"+strconv.FormatInt(last.Sequence, 10), trace), *body, len(ms))
		s.bodyDone(body)
	}
	endDelivery(span, err)
	return err
}

// bodyBuf returns an empty buffer for a request body of about size bytes,
// to be given back with bodyDone once post has returned. The direct
// client's are pooled (a body per event was the largest allocation of a
// delivery): it copies a body into its connection's buffer before post
// returns. net/http may still read a body after Do returns, so its bodies
// are never reused.
func (s *Sidecar) bodyBuf(size int) *[]byte {
	if s.appConns == nil {
		b := make([]byte, 0, size)
		return &b
	}
	p := bodyPool.Get().(*[]byte)
	if cap(*p) < size {
		*p = make([]byte, 0, size)
	}
	*p = (*p)[:0]
	return p
}

// bodyDone gives back a buffer of bodyBuf; a large one is dropped.
func (s *Sidecar) bodyDone(p *[]byte) {
	if s.appConns != nil && cap(*p) <= 64<<10 {
		bodyPool.Put(p)
	}
}

// bodyPool holds the direct client's request bodies (*[]byte).
var bodyPool = sync.Pool{New: func() any { return new([]byte) }}

// batchLimit is how many events of a session the next request to the app
// may carry: Options.AppMaxBatch when above 1, otherwise what the app
// last offered (HeaderBatchMax), 1 without an offer.
func (s *Sidecar) batchLimit() int {
	if s.o.AppMaxBatch > 1 {
		return s.o.AppMaxBatch
	}
	return max(int(s.appBatchMax.Load()), 1)
}

// noteBatchOffer records what the app's answer (status code, headers) to
// a POST on path says of batches (HeaderBatchMax), unless
// Options.AppMaxBatch fixes the size.
func (s *Sidecar) noteBatchOffer(path string, code int, header http.Header) {
	if s.o.AppMaxBatch > 1 {
		return
	}
	offer := int32(0)
	switch {
	case code >= 200 && code <= 299:
		v := header.Get(canonBatchMax) // canonical: Get allocates no key
		if v == "" {                   // most answers: no parse, no error to allocate
			break
		}
		n, err := strconv.Atoi(v)
		refused := s.batchRefusedAt.Load()
		if err == nil && n > 1 && (refused == 0 || s.clk.Since(time.Unix(0, refused)) >= batchRefusalHold) {
			offer = int32(min(n, config.MaxAppBatch))
		}
	case path == BatchPath && (code == http.StatusNotFound || code == http.StatusMethodNotAllowed || code == http.StatusNotImplemented):
		// The batch endpoint is gone (an older app rolled out): single
		// requests again, the failed batch included.
		s.batchRefusedAt.Store(s.clk.Now().UnixNano())
	default:
		return // a failure says nothing about batches
	}
	old := s.appBatchMax.Swap(offer)
	s.m.AppBatchMax.Set(float64(s.batchLimit()))
	if old != offer {
		if offer > 1 {
			s.log.Info("The app takes batches of events; delivering them together", "maxBatch", offer, "header", HeaderBatchMax)
		} else {
			s.log.Info("The app no longer offers batches; delivering one event per request", "status", code)
		}
	}
}

func endDelivery(span tracing.Span, err error) {
	if err != nil {
		span.Fail(err.Error())
	}
	span.End()
}

// The header names as net/http stores them.
var (
	canonSessionID      = http.CanonicalHeaderKey(HeaderSessionID)
	canonMessageType    = http.CanonicalHeaderKey(HeaderMessageType)
	canonIdempotencyKey = http.CanonicalHeaderKey(HeaderIdempotencyKey)
	canonSequence       = http.CanonicalHeaderKey(HeaderSequence)
)

// appHeaders are the headers of a POST to the app (keys in canonical form,
// so nothing is re-cased). The values share one backing array: one
// allocation for all of them, the trace headers included.
func appHeaders(sessionID, msgType, idempotencyKey, seq string, trace tracing.Context) http.Header {
	h := make(http.Header, 8)
	vals := make([]string, 0, 7)
	set := func(k, v string) {
		vals = append(vals, v)
		h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	set("Content-Type", "application/json")
	set(canonSessionID, sessionID)
	set(canonMessageType, msgType)
	set(canonIdempotencyKey, idempotencyKey)
	if seq != "" {
		set(canonSequence, seq)
	}
	if !trace.IsZero() {
		set(tracing.HTTPTraceparent, trace.Parent)
		if trace.State != "" {
			set(tracing.HTTPTracestate, trace.State)
		}
	}
	return h
}

// post sends body to the app's path, counting n messages. The request is
// not bound to the run context: a request cancelled halfway might have
// been processed by the app without the sidecar knowing, which is exactly
// the duplicate a graceful shutdown must not cause.
func (s *Sidecar) post(path string, h http.Header, body []byte, n int) error {
	var resp appResponse
	var err error
	if s.appConns != nil {
		resp, err = s.appConns.post(path, h, body, s.o.AppTimeout)
	} else {
		resp, err = s.postHTTP(path, h, body)
	}
	if err != nil {
		s.m.AppDeliveries.WithLabelValues("error").Add(float64(n))
		if errors.Is(err, errAppTimeout) {
			// The app took the request and did not answer in time: a
			// message that hangs it counts as refused.
			return refusal{err}
		}
		return err
	}
	s.noteBatchOffer(path, resp.code, resp.header)
	if resp.code < 200 || resp.code > 299 {
		s.m.AppDeliveries.WithLabelValues("error").Add(float64(n))
		return refusal{fmt.Errorf("app answered %s: %s", resp.status, bytes.TrimSpace(resp.msg))}
	}
	s.noteStreamOffer(resp.header)
	s.m.AppDeliveries.WithLabelValues("ok").Add(float64(n))
	return nil
}

// postHTTP is post through Options.HTTPClient (see appConns for when).
func (s *Sidecar) postHTTP(path string, h http.Header, body []byte) (appResponse, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx()), s.o.AppTimeout)
	defer cancel()
	url := strings.TrimSuffix(s.cfg.HarnessURL, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return appResponse{}, err
	}
	req.Header = h
	resp, err := s.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return appResponse{}, fmt.Errorf("%w: %w", errAppTimeout, err)
		}
		return appResponse{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // keep the connection reusable
	return appResponse{status: resp.Status, code: resp.StatusCode, header: resp.Header, msg: msg}, nil
}
