// Package samplecaller is the sample caller app: a program that submits HCP
// tasks and consumes their event streams using nothing but the caller
// sidecar's local HTTP API (docs/harness-api.md, "Caller side"), as an app
// in any language would.
//
// Recorder serves POST /hcp/v1/events (and the batch and stream endpoints
// when offered, see offer.go): it records every message the sidecar
// delivers and checks the stream guarantees as it goes, per session:
// task_accepted before any event, event sequences contiguous and strictly
// increasing (no duplicate, no gap, no reordering), nothing but a late
// session_closed after the terminal task_completed or task_failed, and no
// message_id twice. A message received again with redelivered=true (the
// sidecar died between this app's 2xx and recording it) is recognised and
// not processed again, as the API asks of non-idempotent apps; it is
// counted as deduplicated. GET /received returns what it saw, for tests
// and the demo. Client submits tasks and watches them.
package samplecaller

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"
)

// typeEvent is Message.Type of an event (the others are the task's
// answers and terminal messages).
const typeEvent = "event"

// Message is the body the caller sidecar POSTs to /hcp/v1/events.
type Message struct {
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
	Redelivered   bool            `json:"redelivered"`
	// Lost names the sequences right before this event that the sidecar
	// gave up on (they will never come), and why.
	Lost *Lost `json:"lost,omitempty"`
}

// Lost is a range of sequences the sidecar announced as lost.
type Lost struct {
	From   int64  `json:"from"`
	To     int64  `json:"to"`
	Reason string `json:"reason"`
}

// Received is one recorded message.
type Received struct {
	Type        string    `json:"type"`
	MessageID   string    `json:"message_id"`
	Sequence    int64     `json:"sequence,omitempty"`
	EventType   string    `json:"event_type,omitempty"`
	Redelivered bool      `json:"redelivered,omitempty"`
	At          time.Time `json:"at"`
	// Data is an event's data (progress, state_changed, ...).
	Data json.RawMessage `json:"data,omitempty"`
	// Lost is the announced gap before this event.
	Lost *Lost `json:"lost,omitempty"`
	// Payload is the message's whole payload as the app received it: what
	// an independent checker compares with the wire (test/checker).
	Payload json.RawMessage `json:"payload,omitempty"`
}

// SessionLog is what the app saw of one session.
type SessionLog struct {
	SessionID     string `json:"session_id"`
	CalleeID      string `json:"callee_id"`
	TaskMessageID string `json:"task_message_id,omitempty"`
	// Answer is task_accepted or task_rejected.
	Answer string `json:"answer,omitempty"`
	// Terminal is task_completed or task_failed.
	Terminal string `json:"terminal,omitempty"`
	// LastSequence is the highest event sequence received.
	LastSequence int64 `json:"last_sequence"`
	// Events counts event messages accepted (duplicates excluded).
	Events int `json:"events"`
	// Duplicates are messages received a second time (by message_id or
	// (session, sequence)) without redelivered=true: the sidecar promises
	// there are none.
	Duplicates int `json:"duplicates"`
	// Deduplicated are messages received a second time with
	// redelivered=true: the sidecar was stopped between this app's 2xx and
	// recording it (a process kill can do that). The app recognises them by
	// (session_id, sequence) or message_id and does not process them again,
	// as the API asks of apps whose processing is not idempotent.
	Deduplicated int `json:"deduplicated"`
	// Lost are the gaps the sidecar announced (events it gave up on).
	Lost []Lost `json:"lost,omitempty"`
	// Problems are violations of the stream guarantees, in words.
	Problems []string   `json:"problems,omitempty"`
	Messages []Received `json:"messages"`
	// Repeated are the messages counted in Duplicates, as received.
	Repeated []Received `json:"repeated,omitempty"`
	// FinalState is session_closed's final_state.
	FinalState string `json:"final_state,omitempty"`
}

// Snapshot is the body of GET /received.
type Snapshot struct {
	Total int `json:"total"`
	// Requests counts the POSTs that carried them (fewer with batches).
	Requests int `json:"requests"`
	// Streams counts the streams the sidecar opened (POST
	// /hcp/v1/events/stream), StreamDeliveries the deliveries processed
	// on them (lines: one message, or a batch).
	Streams          int                    `json:"streams"`
	StreamDeliveries int                    `json:"stream_deliveries"`
	Duplicates       int                    `json:"duplicates"`
	Deduplicated     int                    `json:"deduplicated"`
	Problems         int                    `json:"problems"`
	Failed           int                    `json:"failed_on_purpose"`
	Sessions         map[string]*SessionLog `json:"sessions"`
}

// Recorder is the sample app's event endpoint. The zero value is not
// usable; create it with NewRecorder.
type Recorder struct {
	mu       sync.Mutex
	sessions map[string]*SessionLog
	seen     map[string]bool
	total    int
	requests int
	dups     int
	deduped  int
	problems int
	failed   int
	// fail, when set, decides to answer a message with 500 (tests and the
	// demo inject app failures with it).
	fail func(Message) bool
	// delay is added to every delivery (a slow app).
	delay time.Duration
	// batchMax, above 1, is offered to the sidecar on every 2xx answer
	// (headerBatchMax); batchGone answers the batch endpoint 404, as an
	// app without it does.
	batchMax  int
	batchGone bool
	// streamOffer offers the stream on every 2xx answer (HCP-Stream: 1);
	// streamGone answers the stream endpoint 404 and ends open streams.
	streamOffer bool
	streamGone  bool
	// streams counts the streams opened; the last one is the sidecar's
	// only live stream (see handleStream). lines counts their deliveries.
	streams int
	lines   int
	// notify receives a tick after every recorded message.
	notify chan struct{}
	// receipts, when set, gets every message before it is acknowledged
	// (SetReceiptLog).
	receipts *ReceiptLog
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{sessions: map[string]*SessionLog{}, seen: map[string]bool{}, notify: make(chan struct{}, 1)}
}

// FailWhen makes the app answer 500, without recording, to every message
// for which f returns true (nil: never).
func (r *Recorder) FailWhen(f func(Message) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = f
}

// SetDelay makes every delivery take at least d.
func (r *Recorder) SetDelay(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.delay = d
}

// Changed is signalled (capacity one) after each recorded message.
func (r *Recorder) Changed() <-chan struct{} { return r.notify }

// Handler serves POST /hcp/v1/events, POST /hcp/v1/events/batch (the
// sidecar's batch delivery: HCP_APP_MAX_BATCH above 1, or OfferBatches),
// POST /hcp/v1/events/stream (stream delivery: HCP_APP_STREAM, or
// OfferStream) and GET /received.
func (r *Recorder) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hcp/v1/events", r.handleEvent)
	mux.HandleFunc("POST /hcp/v1/events/batch", r.handleEvent)
	mux.HandleFunc("POST "+streamPath, r.handleStream)
	mux.HandleFunc("GET /received", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(r.Snapshot())
	})
	return mux
}

// Record checks and records one message, received now.
func (r *Recorder) Record(m Message) { r.RecordAt(m, time.Now()) }

// RecordAt checks and records one message received at at.
func (r *Recorder) RecordAt(m Message, at time.Time) {
	r.mu.Lock()
	defer func() {
		r.mu.Unlock()
		select {
		case r.notify <- struct{}{}:
		default:
		}
	}()
	r.total++
	s := r.sessions[m.SessionID]
	if s == nil {
		s = &SessionLog{SessionID: m.SessionID}
		r.sessions[m.SessionID] = s
	}
	if m.CalleeID != "" {
		s.CalleeID = m.CalleeID
	}
	if m.TaskMessageID != "" {
		s.TaskMessageID = m.TaskMessageID
	}
	problem := func(format string, args ...any) {
		s.Problems = append(s.Problems, fmt.Sprintf(format, args...))
		r.problems++
	}
	dupKey := fmt.Sprintf("%s/%d", m.SessionID, m.Sequence)
	if r.seen[m.MessageID] || (m.Type == typeEvent && r.seen[dupKey]) {
		if m.Redelivered {
			s.Deduplicated++
			r.deduped++
			return
		}
		s.Duplicates++
		r.dups++
		s.Repeated = append(s.Repeated, received(m, at))
		problem("duplicate %s message_id=%s sequence=%d without redelivered=true", m.Type, m.MessageID, m.Sequence)
		return
	}
	r.seen[m.MessageID] = true
	s.Messages = append(s.Messages, received(m, at))
	switch m.Type {
	case "task_accepted", "task_rejected":
		if s.Answer != "" {
			problem("second answer %s after %s", m.Type, s.Answer)
		}
		if s.Events > 0 {
			problem("%s after %d events", m.Type, s.Events)
		}
		s.Answer = m.Type
	case typeEvent:
		r.seen[dupKey] = true
		want := s.LastSequence + 1
		if l := m.Lost; l != nil {
			if l.From != want || l.To != m.Sequence-1 {
				problem("event %d announces lost %d-%d, but the gap is %d-%d", m.Sequence, l.From, l.To, want, m.Sequence-1)
			}
			s.Lost = append(s.Lost, *l)
			want = m.Sequence
		}
		if m.Sequence != want {
			problem("event sequence %d after %d (want %d)", m.Sequence, s.LastSequence, want)
		}
		if s.Terminal != "" && m.EventType != "session_closed" {
			problem("event %d (%s) after %s", m.Sequence, m.EventType, s.Terminal)
		}
		if m.Sequence > s.LastSequence {
			s.LastSequence = m.Sequence
		}
		s.Events++
		if m.EventType == "session_closed" {
			var d struct {
				FinalState string `json:"final_state"`
			}
			_ = json.Unmarshal(m.Data, &d)
			s.FinalState = d.FinalState
		}
	case "task_completed", "task_failed":
		if s.Terminal != "" {
			problem("second terminal %s after %s", m.Type, s.Terminal)
		}
		s.Terminal = m.Type
	default:
		problem("unknown message type %q", m.Type)
	}
}

// Snapshot returns a deep copy of what was recorded.
func (r *Recorder) Snapshot() Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := Snapshot{Total: r.total, Requests: r.requests, Streams: r.streams, StreamDeliveries: r.lines, Duplicates: r.dups, Deduplicated: r.deduped, Problems: r.problems, Failed: r.failed, Sessions: map[string]*SessionLog{}}
	for id, s := range r.sessions {
		c := *s
		c.Problems = append([]string(nil), s.Problems...)
		c.Messages = append([]Received(nil), s.Messages...)
		c.Lost = append([]Lost(nil), s.Lost...)
		out.Sessions[id] = &c
	}
	return out
}

// Session returns the log of one session (a copy) and whether it exists.
func (r *Recorder) Session(id string) (SessionLog, bool) {
	snap := r.Snapshot()
	s, ok := snap.Sessions[id]
	if !ok {
		return SessionLog{}, false
	}
	return *s, true
}

// Sequences returns the event sequences received for a session, in
// arrival order.
func (s SessionLog) Sequences() []int64 {
	var out []int64
	for _, m := range s.Messages {
		if m.Type == typeEvent {
			out = append(out, m.Sequence)
		}
	}
	return out
}

// SessionIDs returns the recorded sessions, sorted.
func (snap Snapshot) SessionIDs() []string {
	ids := make([]string, 0, len(snap.Sessions))
	for id := range snap.Sessions {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func received(m Message, at time.Time) Received {
	return Received{Type: m.Type, MessageID: m.MessageID, Sequence: m.Sequence, EventType: m.EventType, Redelivered: m.Redelivered, At: at, Data: m.Data, Lost: m.Lost, Payload: m.Payload}
}
