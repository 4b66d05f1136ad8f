package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/harnessclient"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// emitMode is how the benchmark harness posts its events.
type emitMode string

const (
	// modeSimple: one event per POST, answered after the broker's confirm.
	modeSimple emitMode = "simple"
	// modeBatch: the events ready (up to maxBatch) per POST, answered
	// after the confirms.
	modeBatch emitMode = "batch"
	// modeAsync: modeBatch with "Prefer: respond-async".
	modeAsync emitMode = "async"
	// modeStream: one event stream per session (harnessclient), an event
	// a line, flushed whenever the session has no more events ready; no
	// wait for acks (the sidecar's window of lines ahead of its confirms
	// holds the harness back); at the end the stream is closed and every
	// line must be done (confirmed).
	modeStream emitMode = "stream"
)

const maxBatch = 100

type benchEvent struct {
	seq  int
	sent int64 // UnixNano; 0: stamped when the sender takes it
}

// harnessDriver is the benchmark's harness: it posts events to the
// harness API at base (a callee sidecar's, or the floor's) in its mode.
type harnessDriver struct {
	hc   *http.Client
	base string
	mode emitMode
}

func newHarnessDriver(base string, mode emitMode) harnessDriver {
	return harnessDriver{
		hc:   &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}},
		base: base, mode: mode,
	}
}

// emit posts n events over the sessions, round robin, paced at rate
// events/s in all (0: as fast as the senders take them). Paced events are
// stamped when due; unpaced ones when the harness takes them to post, as
// the raw baseline stamps a message when its window lets it publish.
func (r *harnessDriver) emit(ctx context.Context, sids []string, n int, rate float64, rec *benchutil.Recorder) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var streams []*harnessclient.EventStream
	if r.mode == modeStream {
		// Opened before the clock starts, as a set-up: what is timed is
		// the events.
		var err error
		if streams, err = r.openStreams(ctx, sids); err != nil {
			return err
		}
	}
	chans := make([]chan benchEvent, len(sids))
	errc := make(chan error, len(sids))
	var wg sync.WaitGroup
	for i, sid := range sids {
		chans[i] = make(chan benchEvent, 1024)
		wg.Go(func() {
			var err error
			if streams != nil {
				err = r.sendStream(ctx, streams[i], chans[i], n)
			} else {
				err = r.send(ctx, sid, chans[i], n)
			}
			if err != nil {
				errc <- fmt.Errorf("session %s: %w", sid, err)
				cancel()
			}
		})
	}
	pacer := benchutil.NewPacer(rate)
	rec.Start()
	var err error
	for i := 0; i < n && err == nil; i++ {
		if err = pacer.Wait(ctx); err != nil {
			break
		}
		ev := benchEvent{seq: i}
		if rate > 0 {
			ev.sent = time.Now().UnixNano()
		}
		select {
		case chans[i%len(chans)] <- ev:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	for _, c := range chans {
		close(c)
	}
	wg.Wait()
	select {
	case e := <-errc:
		return e
	default:
		return err
	}
}

// send is one session's harness: it posts the events of ch in order.
func (r *harnessDriver) send(ctx context.Context, sid string, ch <-chan benchEvent, total int) error {
	url := r.base + "/hcp/v1/sessions/" + sid + "/events"
	pad := strings.Repeat("x", eventPadding())
	var buf bytes.Buffer
	appendEvent := func(ev benchEvent) { writeEvent(&buf, ev, total, pad) }
	for ev := range ch {
		buf.Reset()
		if r.mode == modeSimple {
			appendEvent(ev)
		} else {
			buf.WriteByte('[')
			appendEvent(ev)
		more:
			for k := 1; k < maxBatch; k++ {
				select {
				case next, ok := <-ch:
					if !ok {
						break more
					}
					buf.WriteByte(',')
					appendEvent(next)
				default:
					break more
				}
			}
			buf.WriteByte(']')
		}
		if err := r.post(ctx, url, buf.Bytes(), r.mode == modeAsync); err != nil {
			return err
		}
	}
	return nil
}

// writeEvent writes ev as the harness's JSON event, stamped now if it has
// no stamp yet.
func writeEvent(buf *bytes.Buffer, ev benchEvent, total int, pad string) {
	if ev.sent == 0 {
		ev.sent = time.Now().UnixNano()
	}
	fmt.Fprintf(buf, `{"event_type":"progress","data":{"stage":"bench","percent":%d,"message":"%d %d %s"}}`,
		ev.seq*100/total, ev.seq, ev.sent, pad)
}

func (r *harnessDriver) post(ctx context.Context, url string, body []byte, async bool) error {
	return postJSON(ctx, r.hc, url, body, async)
}

// postJSON POSTs a JSON body ("Prefer: respond-async" if async) and wants
// a 2xx.
func postJSON(ctx context.Context, hc *http.Client, url string, body []byte, async bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if async {
		req.Header.Set("Prefer", "respond-async")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// Sizes: the harness pads each progress message so that the relay's AMQP
// body (the event envelope) is about benchutil.DefaultBodySize bytes; the
// raw baseline publishes bodies of the same size.
var sizes = sync.OnceValues(func() (pad int, body []byte) {
	build := func(pad int) []byte {
		p := 50.0
		data, _ := json.Marshal(session.ProgressData{Stage: "bench", Percent: &p,
			Message: fmt.Sprintf("%d %d %s", 1234, time.Now().UnixNano(), strings.Repeat("x", pad))})
		env, err := envelope.NewAt(time.Now(), envelope.TypeEvent, envelope.NewMessageID(),
			session.EventPayload{EventType: session.EventProgress, Sequence: 1234, Data: data})
		if err != nil {
			panic(err)
		}
		body, err := envelope.Encode(env)
		if err != nil {
			panic(err)
		}
		return body
	}
	pad = max(0, benchutil.DefaultBodySize-len(build(0)))
	return pad, build(pad)
})

func eventPadding() int { p, _ := sizes(); return p }

// relayEnvelope is a relay event envelope as the callee sidecar publishes
// it for the benchmark harness's events: the body raw and the floor
// publish.
func relayEnvelope() []byte { _, b := sizes(); return b }

// benchHarness is the callee harness of the benchmark: it takes tasks
// (the driver posts their events) and lists them for the sidecar's
// watchdog.
type benchHarness struct {
	mu    sync.Mutex
	tasks map[string]bool
	mux   *http.ServeMux
}

func newBenchHarness() *benchHarness {
	h := &benchHarness{tasks: map[string]bool{}, mux: http.NewServeMux()}
	h.mux.HandleFunc("POST /hcp/v1/tasks", func(w http.ResponseWriter, r *http.Request) {
		var t struct {
			SessionID string `json:"session_id"`
		}
		if err := json.NewDecoder(r.Body).Decode(&t); err != nil || t.SessionID == "" {
			http.Error(w, "want a task", http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		h.tasks[t.SessionID] = true
		h.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	})
	h.mux.HandleFunc("GET /hcp/v1/tasks", func(w http.ResponseWriter, _ *http.Request) {
		h.mu.Lock()
		out := []map[string]string{}
		for id := range h.tasks {
			out = append(out, map[string]string{"session_id": id})
		}
		h.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"tasks": out})
	})
	h.mux.HandleFunc("POST /hcp/v1/sessions/{id}/abort", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	})
	return h
}

func (h *benchHarness) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func (h *benchHarness) running(sid string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.tasks[sid]
}
