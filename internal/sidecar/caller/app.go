package caller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

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

// deliver POSTs m to the app and reports whether it answered 2xx.
func (s *Sidecar) deliver(m AppMessage) error {
	body, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode app message: %w", err)
	}
	h := http.Header{}
	h.Set(HeaderSessionID, m.SessionID)
	h.Set(HeaderMessageType, m.Type)
	h.Set(HeaderIdempotencyKey, m.MessageID)
	if m.Sequence > 0 {
		h.Set(HeaderSequence, strconv.FormatInt(m.Sequence, 10))
	}
	return s.post(EventsPath, h, body, 1)
}

// deliverBatch POSTs ms, events of one session in order, to the app's
// batch endpoint and reports whether it answered 2xx.
func (s *Sidecar) deliverBatch(ms []AppMessage) error {
	body, err := json.Marshal(AppBatch{SessionID: ms[0].SessionID, Messages: ms})
	if err != nil {
		return fmt.Errorf("encode app messages: %w", err)
	}
	h := http.Header{}
	h.Set(HeaderSessionID, ms[0].SessionID)
	h.Set(HeaderMessageType, ms[0].Type)
	h.Set(HeaderIdempotencyKey, ms[0].MessageID+".."+ms[len(ms)-1].MessageID)
	h.Set(HeaderSequence, strconv.FormatInt(ms[0].Sequence, 10)+"-"+strconv.FormatInt(ms[len(ms)-1].Sequence, 10))
	return s.post(BatchPath, h, body, len(ms))
}

// post sends body to the app's path, counting n messages. The request is
// not bound to the run context: a request cancelled halfway might have
// been processed by the app without the sidecar knowing, which is exactly
// the duplicate a graceful shutdown must not cause.
func (s *Sidecar) post(path string, h http.Header, body []byte, n int) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx()), s.o.AppTimeout)
	defer cancel()
	url := strings.TrimSuffix(s.cfg.HarnessURL, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = h
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		s.m.AppDeliveries.WithLabelValues("error").Add(float64(n))
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // keep the connection reusable
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		s.m.AppDeliveries.WithLabelValues("error").Add(float64(n))
		return fmt.Errorf("app answered %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	s.m.AppDeliveries.WithLabelValues("ok").Add(float64(n))
	return nil
}
