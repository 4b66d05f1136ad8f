package relay

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// benchApp is the caller app of the benchmark: it times each benchmark
// event from the harness's stamp to its arrival and checks, per session,
// that events arrive once and in sequence order.
type benchApp struct {
	// onAccepted, if set before the run, is called with the session id of
	// each task_accepted received (the acceptance benchmark).
	onAccepted func(sid string)
	// batchOffer, above 1, is offered to the caller sidecar on every
	// answer (caller.HeaderBatchMax), before the run.
	batchOffer int
	// streamOffer, set before the run, offers the stream on every answer
	// (caller.HeaderStream) and serves caller.StreamPath.
	streamOffer bool
	// streamed counts the deliveries taken on the stream.
	streamed atomic.Int64
	// split, set before the run (HCP_BENCH_SPLIT=1), times each event's
	// two halves apart (splitHops).
	split bool
	hops  splitHops

	mu       sync.Mutex
	rec      *benchutil.Recorder
	sessions map[string]*appSession
	probs    []string
}

type appSession struct {
	last      int64
	accepted  bool
	completed bool
	closed    bool
}

var (
	canonBatchMax = http.CanonicalHeaderKey(caller.HeaderBatchMax)
	canonStream   = http.CanonicalHeaderKey(caller.HeaderStream)
)

func newBenchApp() *benchApp { return &benchApp{sessions: map[string]*appSession{}} }

func (a *benchApp) setRecorder(rec *benchutil.Recorder) {
	a.mu.Lock()
	a.rec = rec
	a.mu.Unlock()
}

func (a *benchApp) session(sid string) appSession {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.sessions[sid]; s != nil {
		return *s
	}
	return appSession{}
}

func (a *benchApp) problems() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.probs)
}

func (a *benchApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && r.URL.Path == caller.StreamPath && a.streamOffer {
		a.serveStream(w, r)
		return
	}
	if r.Method != http.MethodPost || (r.URL.Path != caller.EventsPath && r.URL.Path != caller.BatchPath) {
		http.NotFound(w, r)
		return
	}
	body, err := server.ReadJSON(r, 64<<20, false)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var batch struct {
		Messages []appMessage `json:"messages"`
	}
	if r.URL.Path == caller.BatchPath {
		err = json.Unmarshal(body, &batch)
	} else {
		batch.Messages = make([]appMessage, 1)
		err = json.Unmarshal(body, &batch.Messages[0])
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for _, m := range batch.Messages {
		a.take(m)
	}
	a.offer(w.Header())
	w.WriteHeader(http.StatusNoContent)
}

// offer sets the app's offers on an answer.
func (a *benchApp) offer(h http.Header) {
	if a.batchOffer > 1 {
		h[canonBatchMax] = []string{strconv.Itoa(a.batchOffer)}
	}
	if a.streamOffer {
		h[canonStream] = []string{"1"}
	}
}

// maxStreamLine bounds a delivery on the app's stream (a batch of up to
// the prefetch's events is under 100 KiB).
const maxStreamLine = 16 << 20

// serveStream serves caller.StreamPath full duplex: each line a delivery,
// its messages taken in order as a batch's are, then acked; the ack is
// left to the next line's (cumulative) when a whole line is buffered
// already. A line that is not a delivery ends the stream (and is a
// problem: the sidecar only writes deliveries).
func (a *benchApp) serveStream(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	a.offer(w.Header())
	w.Header().Set("Content-Type", contentTypeNDJSON)
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	br := bufio.NewReaderSize(r.Body, 64<<10)
	var out []byte
	for {
		line, err := readNDJSONLine(br, maxStreamLine)
		if err != nil {
			return // the body's end, or the sidecar gave up on the stream
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var d struct { // fresh: Unmarshal would merge into old elements
			Delivery int64        `json:"delivery"`
			Messages []appMessage `json:"messages"`
		}
		if err := json.Unmarshal(line, &d); err != nil || d.Delivery < 1 {
			a.problem(fmt.Sprintf("a line of the stream that is not a delivery (%v): %.200q", err, line))
			return
		}
		for _, m := range d.Messages {
			a.take(m)
		}
		a.streamed.Add(1)
		if lineBuffered(br) {
			continue
		}
		out = strconv.AppendInt(append(out[:0], `{"ack":`...), d.Delivery, 10)
		if _, err := w.Write(append(out, "}\n"...)); err != nil || rc.Flush() != nil {
			return
		}
	}
}

func (a *benchApp) problem(p string) {
	a.mu.Lock()
	a.probs = append(a.probs, p)
	a.mu.Unlock()
}

// appMessage is what the benchmark's app reads of a caller.AppMessage: as
// lean as the raw baseline's consumer (which reads two headers), so that
// on a machine the app shares with the sidecars it takes no more CPU than
// it must. The data is decoded with the message, in one pass; "stage" and
// "message" are strings in every event type that has them.
type appMessage struct {
	SessionID string `json:"session_id"`
	Timestamp string `json:"timestamp"`
	Type      string `json:"type"`
	Sequence  int64  `json:"sequence"`
	EventType string `json:"event_type"`
	Data      struct {
		Stage   string `json:"stage"`
		Message string `json:"message"`
	} `json:"data"`
}

// take checks and times one message.
func (a *benchApp) take(m appMessage) {
	var seq int
	var sent int64
	bench := false
	if m.Type == "event" && m.EventType == string(session.EventProgress) {
		if d := m.Data; d.Stage == "bench" {
			f := strings.Fields(d.Message)
			if len(f) >= 2 {
				s, err1 := strconv.Atoi(f[0])
				t, err2 := strconv.ParseInt(f[1], 10, 64)
				bench, seq, sent = err1 == nil && err2 == nil, s, t
			}
		}
	}
	a.mu.Lock()
	s := a.sessions[m.SessionID]
	if s == nil {
		s = &appSession{}
		a.sessions[m.SessionID] = s
	}
	switch m.Type {
	case "task_accepted":
		s.accepted = true
		if a.onAccepted != nil {
			defer a.onAccepted(m.SessionID)
		}
	case "task_completed":
		s.completed = true
	case "event":
		if m.Sequence != s.last+1 {
			a.probs = append(a.probs, fmt.Sprintf("session %s: event %d after %d", m.SessionID, m.Sequence, s.last))
		}
		s.last = max(s.last, m.Sequence)
		if m.EventType == string(session.EventSessionClosed) {
			s.closed = true
		}
	}
	rec := a.rec
	a.mu.Unlock()
	if bench && rec != nil {
		rec.Observe(seq, time.Unix(0, sent))
		if a.split {
			a.hops.add(time.Unix(0, sent), m.Timestamp)
		}
	}
}
