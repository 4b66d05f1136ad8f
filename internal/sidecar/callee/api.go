package callee

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// Request body limits of the local API.
const (
	maxEventBody = envelope.MaxEnvelopeBytes // one event (it must fit an envelope)
	maxBatchBody = 8 << 20                   // a batch of events
	maxBatchSize = 1000
)

// harnessEvent is one event the harness posts: an event type it may emit
// and its data, which is forwarded as sent (unknown fields included).
type harnessEvent struct {
	EventType session.EventType `json:"event_type"`
	Data      json.RawMessage   `json:"data"`
	// IdempotencyKey, when set, makes a retried event (same key, same
	// session) answer with the sequence it already got instead of being
	// published again; keys survive a sidecar restart.
	IdempotencyKey string `json:"idempotency_key,omitempty"`

	// decoded is Data decoded and validated by parseEvents (for a
	// progress event, what the HCPSession's status shows).
	decoded session.EventData
}

// routes is the harness → sidecar side of the local API (docs/harness-api.md).
func (s *Sidecar) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/events", s.apiEvents)
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/pause", s.apiReason((*sess).pause))
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/resume", s.apiReason((*sess).resume))
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/aborted", s.apiReason((*sess).aborted))
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/checkpoint", s.apiCheckpoint)
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/complete", s.apiComplete)
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/fail", s.apiFail)
	mux.HandleFunc("GET /hcp/v1/sessions/{id}", s.apiGet)
	mux.HandleFunc("GET /hcp/v1/sessions", s.apiList)
	mux.HandleFunc("/hcp/v1/sessions/{id}/{action}", func(w http.ResponseWriter, r *http.Request) {
		server.Errorf(w, http.StatusNotFound, server.CodeNotFound, "no endpoint %s %s", r.Method, r.URL.Path)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		server.Errorf(w, http.StatusNotFound, server.CodeNotFound, "no endpoint %s %s", r.Method, r.URL.Path)
	})
	return mux
}

// lookup finds the session of the request or answers 404 (503 while
// the sessions of a previous incarnation are being re-adopted).
func (s *Sidecar) lookup(w http.ResponseWriter, r *http.Request) *sess {
	id := r.PathValue("id")
	if ss := s.session(strings.ToLower(id)); ss != nil {
		if ss.lost.Load() {
			writeAPIError(w, ownershipLostError())
			return nil
		}
		return ss
	}
	if s.adopting.Load() {
		server.Errorf(w, http.StatusServiceUnavailable, server.CodeUnavailable, "the sidecar restarted and is re-adopting its sessions; retry")
		return nil
	}
	server.Errorf(w, http.StatusNotFound, server.CodeNotFound, "no session %q runs on this sidecar (it never existed, ended long ago, or runs on another replica)", truncate(id, 64))
	return nil
}

func writeAPIError(w http.ResponseWriter, e *apiError) { server.WriteError(w, e.status, e.body) }

// apiEvents: POST /hcp/v1/sessions/{id}/events with one event object or an
// array of them (published with consecutive sequence numbers).
func (s *Sidecar) apiEvents(w http.ResponseWriter, r *http.Request) {
	stream := isNDJSON(r)
	if stream {
		// One stream per connection: a stream refused or ended early
		// leaves its body unread, and net/http must not read on for a
		// next request on the connection.
		w.Header().Set("Connection", "close")
		if !fullDuplex(w) {
			return
		}
	}
	ss := s.lookup(w, r)
	if ss == nil {
		return
	}
	if stream {
		s.apiEventStream(w, r, ss)
		return
	}
	body, err := server.ReadJSON(r, maxBatchBody, false)
	if err != nil {
		err.(*server.RequestError).Write(w)
		return
	}
	evs, batch, err := parseEvents(body)
	if err != nil {
		writeAPIError(w, badRequest(err))
		return
	}
	ps, seqs, e := ss.publishEvents(r.Context(), evs)
	if e != nil {
		writeAPIError(w, e)
		return
	}
	if batch {
		respond(w, r, ss, ps, map[string]any{"sequences": seqs})
	} else {
		respond(w, r, ss, ps, map[string]any{"sequence": seqs[0]})
	}
}

// parseEvents parses the body of POST .../events: one event, or a batch (a
// JSON array of 1 to maxBatchSize events). A valid body is decoded in one
// pass; only one that fails is taken apart again, to name the event at
// fault.
func parseEvents(body []byte) (evs []harnessEvent, batch bool, err error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '[' {
		ev, err := parseEvent(body)
		if err != nil {
			return nil, false, err
		}
		return []harnessEvent{ev}, false, nil
	}
	if evs, ok := parseBatchFast(body); ok {
		return evs, true, nil
	}
	if err := decodeStrict(body, &evs); err != nil {
		return nil, true, batchError(body, err)
	}
	if len(evs) == 0 || len(evs) > maxBatchSize {
		return nil, true, fmt.Errorf("a batch holds 1 to %d events, got %d", maxBatchSize, len(evs))
	}
	for i := range evs {
		if err := checkEvent(&evs[i]); err != nil {
			return nil, true, fmt.Errorf("event [%d]: %w", i, err)
		}
	}
	return evs, true, nil
}

// parseEvent parses one event object (a request's body, a stream's line).
func parseEvent(b []byte) (harnessEvent, error) {
	if ev, ok := parseEventFast(b); ok {
		return ev, nil
	}
	var ev harnessEvent
	if err := decodeStrict(b, &ev); err != nil {
		return ev, fmt.Errorf("want {\"event_type\": ..., \"data\": {...}}: %w", err)
	}
	return ev, checkEvent(&ev)
}

// decodeStrict decodes exactly one JSON value, refusing unknown fields.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if len(bytes.TrimSpace(b[dec.InputOffset():])) != 0 {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// batchError words why a batch did not decode: which event, or the
// batch's own syntax.
func batchError(body []byte, err error) error {
	var items []json.RawMessage
	if json.Unmarshal(body, &items) != nil {
		return fmt.Errorf("invalid batch: %w", err)
	}
	for i, it := range items {
		var ev harnessEvent
		if e := decodeStrict(it, &ev); e != nil {
			return fmt.Errorf("event [%d]: want {\"event_type\": ..., \"data\": {...}}: %w", i, e)
		}
	}
	return fmt.Errorf("invalid batch: %w", err)
}

// checkEvent validates one harness event: a type the harness may emit and
// data valid for it (pkg/hcp/session), within the envelope size limit. It
// keeps the decoded data. Data goes into the envelope as the harness wrote
// it (valid JSON, its own whitespace kept: compacting it would be one more
// pass over every event for a few bytes).
func checkEvent(ev *harnessEvent) error {
	if len(ev.Data) > maxEventBody-1024 {
		return fmt.Errorf("the event's data is %d bytes; an event must fit an envelope of %d bytes", len(ev.Data), maxEventBody)
	}
	if !ev.EventType.Valid() {
		return fmt.Errorf("unknown event_type %q (progress, intermediate_result, log, warning or error)", truncate(string(ev.EventType), 64))
	}
	if !ev.EventType.HarnessEmittable() {
		return fmt.Errorf("event_type %s is the sidecar's to emit; use the pause, resume, checkpoint, complete, fail and aborted endpoints", ev.EventType)
	}
	p := session.EventPayload{EventType: ev.EventType, Sequence: 1, Data: ev.Data}
	d, err := p.Decode()
	if err != nil {
		return err
	}
	// What the envelope's validation would refuse (encoding/json keeps
	// the last of duplicate keys and takes invalid UTF-8): the harness's
	// 400 now, not a failed publish after the event took a sequence. The
	// envelope is then built without validating it again
	// (sequenceHarnessEventLocked).
	if err := envelope.CheckObject(ev.Data); err != nil {
		return &task.ValidationError{Kind: "event", Fields: []*task.FieldError{{Field: keyData, Message: err.Error()}}}
	}
	ev.decoded = d
	return nil
}

type reasonBody struct {
	Reason string `json:"reason"`
}

// apiReason serves pause, resume and aborted: an optional {"reason": ...}.
func (s *Sidecar) apiReason(op func(*sess, context.Context, string) ([]*pending, *apiError)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ss := s.lookup(w, r)
		if ss == nil {
			return
		}
		var b reasonBody
		if err := server.DecodeJSON(r, 64<<10, true, &b); err != nil {
			err.(*server.RequestError).Write(w)
			return
		}
		ps, e := op(ss, r.Context(), truncate(b.Reason, 512))
		if e != nil {
			writeAPIError(w, e)
			return
		}
		s.answerState(w, r, ss, ps)
	}
}

// answerState answers with the session's state; a session still running
// (pause, resume) is answered only while this replica owns it
// (respond's owner), an outcome recorded (complete, aborted) in any case.
func (s *Sidecar) answerState(w http.ResponseWriter, r *http.Request, ss *sess, ps []*pending) {
	body := map[string]any{}
	owner := ss
	if in, e := ss.info(r.Context()); e == nil {
		body["state"] = in.State
		body["last_sequence"] = in.LastSequence
		if in.State.IsTerminal() {
			owner = nil
		}
	}
	respond(w, r, owner, ps, body)
}

// apiCheckpoint: checkpoint_created data (created_at defaults to now) and
// an optional state blob.
func (s *Sidecar) apiCheckpoint(w http.ResponseWriter, r *http.Request) {
	ss := s.lookup(w, r)
	if ss == nil {
		return
	}
	var raw json.RawMessage
	if err := server.DecodeJSON(r, checkpoint.MaxState*2+(64<<10), false, &raw); err != nil {
		err.(*server.RequestError).Write(w)
		return
	}
	var b struct {
		State []byte `json:"state"`
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		writeAPIError(w, badRequest(fmt.Errorf("state must be base64: %w", err)))
		return
	}
	var d session.CheckpointCreatedData
	if err := json.Unmarshal(raw, &d); err != nil {
		writeAPIError(w, badRequest(err))
		return
	}
	if d.CreatedAt.IsZero() {
		d.CreatedAt = task.NewTimestamp(s.clk.Now())
	}
	if err := d.Validate(); err != nil {
		writeAPIError(w, badRequest(err))
		return
	}
	if len(b.State) > checkpoint.MaxState {
		writeAPIError(w, &apiError{http.StatusRequestEntityTooLarge, &server.Error{Code: server.CodeTooLarge,
			Message: fmt.Sprintf("the checkpoint state is %d bytes; at most %d are stored (keep large state elsewhere and checkpoint a reference)", len(b.State), checkpoint.MaxState)}})
		return
	}
	ps, e := ss.checkpoint(r.Context(), &d, b.State)
	if e != nil {
		writeAPIError(w, e)
		return
	}
	respond(w, r, ss, ps, map[string]any{"sequence": ps[0].seq})
}

// apiComplete: a task_completed payload (summary filled in when omitted).
func (s *Sidecar) apiComplete(w http.ResponseWriter, r *http.Request) {
	ss := s.lookup(w, r)
	if ss == nil {
		return
	}
	var tc task.TaskCompleted
	if !decodeValid(w, r, maxEventBody-4096, true, &tc) {
		return
	}
	ps, e := ss.complete(r.Context(), &tc)
	if e != nil {
		writeAPIError(w, e)
		return
	}
	s.answerState(w, r, ss, ps)
}

// decodeValid decodes a JSON body of at most limit bytes into v and validates
// it, answering 4xx itself and reporting false when the request is bad.
func decodeValid(w http.ResponseWriter, r *http.Request, limit int64, allowEmpty bool, v interface{ Validate() error }) bool {
	err := server.DecodeJSON(r, limit, allowEmpty, v)
	var re *server.RequestError
	if errors.As(err, &re) {
		re.Write(w)
		return false
	}
	if err == nil {
		err = v.Validate()
	}
	if err != nil {
		writeAPIError(w, badRequest(err))
		return false
	}
	return true
}

// apiFail: a task_failed payload.
func (s *Sidecar) apiFail(w http.ResponseWriter, r *http.Request) {
	ss := s.lookup(w, r)
	if ss == nil {
		return
	}
	var tf task.TaskFailed
	if !decodeValid(w, r, 64<<10, false, &tf) {
		return
	}
	ps, e := ss.fail(r.Context(), &tf)
	if e != nil {
		writeAPIError(w, e)
		return
	}
	s.answerState(w, r, ss, ps)
}

// apiGet: the session as this sidecar knows it.
func (s *Sidecar) apiGet(w http.ResponseWriter, r *http.Request) {
	ss := s.lookup(w, r)
	if ss == nil {
		return
	}
	in, e := ss.info(r.Context())
	if e != nil {
		writeAPIError(w, e)
		return
	}
	server.WriteJSON(w, http.StatusOK, in)
}

// apiList: the sessions this sidecar runs or ran recently.
func (s *Sidecar) apiList(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	all := make([]*sess, 0, len(s.sessions))
	for _, ss := range s.sessions {
		all = append(all, ss)
	}
	s.mu.Unlock()
	out := make([]info, 0, len(all))
	for _, ss := range all {
		if in, e := ss.info(r.Context()); e == nil {
			out = append(out, in)
		}
	}
	slices.SortFunc(out, func(a, b info) int { return a.StartedAt.Compare(b.StartedAt.Time) })
	server.WriteJSON(w, http.StatusOK, map[string]any{"sessions": out})
}
