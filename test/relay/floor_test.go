package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// floorRun is the harness API's floor: the least any relay between the
// benchmark's harness and app has to do, done as cheaply as raw
// amqp091-go allows. The harness POSTs the same batches as to the callee
// sidecar (in the same mode; async is answered once published); an HTTP
// handler splits each batch and publishes every event's data as it came,
// persistent and mandatory, within the raw baseline's confirm window, on
// one channel; one consumer with the raw baseline's prefetch POSTs all
// the deliveries that are ready to the app's batch endpoint in one body
// and acks them (multiple) on its 2xx. It has no envelope, sequencing
// check, session state, journal, dedup or status.
//
// What it costs beyond raw amqp091-go is the harness API's part (an HTTP
// hop and its JSON on each side, and a harness and an app beside the
// broker and the client). On a machine where all of them share the
// cores, a relay behind the harness API, which has to do all of this and
// more, has little room above the floor; how close it gets is what its
// own work costs.
//
// It is built for every harness mode and app mode the relay is measured
// in: in async mode a batch is answered once published, in batch and
// simple mode (one event per request) once its events are confirmed, in
// stream mode each line is acked (cumulatively) once confirmed
// (floorPublisher.serveStream); to an app that takes batches the consumer
// POSTs what is ready in one body, to one that does not, one POST per
// event, to one that offers a stream it writes what is ready as a line
// per session on one stream (deliverStream). The bodies it publishes are
// the harness's event data padded with JSON white space to the relay's
// envelope size (cfg.Body), with the relay's headers (cfg.Headers).
type floorRun struct {
	mode     emitMode
	app      appMode
	sessions int
}

// floorEvent is what the floor reads of a harness event.
type floorEvent struct {
	EventType string          `json:"event_type"`
	Data      json.RawMessage `json:"data"`
}

func (f floorRun) run(ctx context.Context, cfg benchutil.Config) (benchutil.Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rec := benchutil.NewRecorder(benchutil.NewRunID("floor"), cfg.Messages)
	app := newBenchApp()
	app.streamOffer = f.app == appStream
	app.setRecorder(rec)
	appSrv := httptest.NewServer(app)
	defer appSrv.Close()

	consConn, cch, err := benchutil.DialChannel(cfg.URL, "bench-floor-consumer")
	if err != nil {
		return benchutil.Result{}, err
	}
	defer func() { _ = consConn.Close() }()
	if err := cch.Qos(cfg.Prefetch, 0, false); err != nil {
		return benchutil.Result{}, err
	}
	deliveries, err := cch.Consume(cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return benchutil.Result{}, err
	}
	consErr := make(chan error, 1)
	go func() { consErr <- f.deliver(ctx, deliveries, cfg.Prefetch, appSrv.URL) }()

	pubConn, pch, err := benchutil.DialChannel(cfg.URL, "bench-floor-publisher")
	if err != nil {
		return benchutil.Result{}, err
	}
	defer func() { _ = pubConn.Close() }()
	if err := pch.Confirm(false); err != nil {
		return benchutil.Result{}, err
	}
	// The first return, if any; the rest drained so that amqp091-go's
	// reader never blocks on them.
	returned := make(chan amqp.Return, 1)
	go func() {
		for r := range pch.NotifyReturn(make(chan amqp.Return, 16)) {
			select {
			case returned <- r:
			default:
			}
		}
	}()
	pub := &floorPublisher{ch: pch, cfg: cfg, seqs: map[string]int64{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hcp/v1/sessions/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") == contentTypeNDJSON {
			pub.serveStream(w, r)
			return
		}
		body, err := server.ReadJSON(r, 64<<20, false)
		var events []floorEvent
		if err == nil {
			if f.mode == modeSimple {
				events = make([]floorEvent, 1)
				err = json.Unmarshal(body, &events[0])
			} else {
				err = json.Unmarshal(body, &events)
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		confirms, err := pub.publish(r.Context(), r.PathValue("id"), events)
		if err == nil && f.mode != modeAsync {
			// batch and simple: answered once the broker confirmed them.
			for _, dc := range confirms {
				if err = waitConfirm(r.Context(), dc); err != nil {
					break
				}
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	ingest := httptest.NewServer(mux)
	defer ingest.Close()

	driver := newHarnessDriver(ingest.URL, f.mode)
	defer driver.hc.CloseIdleConnections()
	sids := make([]string, f.sessions)
	for i := range sids {
		sids[i] = testbed.RandomName("floor-")
	}
	if cfg.OnStart != nil {
		cfg.OnStart()
	}
	if err := driver.emit(ctx, sids, cfg.Messages, cfg.Rate, rec); err != nil {
		return benchutil.Result{}, err
	}
	select {
	case <-rec.Done():
	case r := <-returned:
		return benchutil.Result{}, fmt.Errorf("message returned: %d %s", r.ReplyCode, r.ReplyText)
	case err := <-consErr:
		return benchutil.Result{}, fmt.Errorf("delivery to the app: %w", err)
	case <-ctx.Done():
		return benchutil.Result{}, fmt.Errorf("%d of %d events at the app: %w", rec.Received(), cfg.Messages, ctx.Err())
	}
	if err := pub.drain(ctx); err != nil {
		return benchutil.Result{}, err
	}
	res := rec.Result()
	if p := app.problems(); len(p) > 0 {
		return res, fmt.Errorf("the app saw %d problems: %q", len(p), p[:min(len(p), 10)])
	}
	if res.Duplicates != 0 {
		return res, fmt.Errorf("the app received %d events twice", res.Duplicates)
	}
	return res, nil
}

// floorPublisher publishes the harness's events on one channel with the
// raw baseline's window of deferred confirms, numbering each session's
// events from 1.
type floorPublisher struct {
	cfg    benchutil.Config
	mu     sync.Mutex
	ch     *amqp.Channel
	window []*amqp.DeferredConfirmation
	seqs   map[string]int64
}

// publish publishes events and returns their deferred confirms.
func (p *floorPublisher) publish(ctx context.Context, sid string, events []floorEvent) ([]*amqp.DeferredConfirmation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(events))
	for _, ev := range events {
		if len(p.window) == p.cfg.Window {
			if err := p.waitOldest(ctx); err != nil {
				return nil, err
			}
		}
		p.seqs[sid]++
		body := ev.Data
		if pad := len(p.cfg.Body) - len(body); pad > 0 {
			// As large as the relay's envelope: JSON white space after
			// the data.
			body = append(make([]byte, 0, len(p.cfg.Body)), body...)
			body = append(body, bytes.Repeat([]byte{' '}, pad)...)
		}
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, p.cfg.RoutingKey, true, false, amqp.Publishing{
			ContentType:     "application/json",
			ContentEncoding: "utf-8",
			DeliveryMode:    amqp.Persistent,
			CorrelationId:   sid,
			MessageId:       strconv.FormatInt(p.seqs[sid], 10),
			Timestamp:       time.Now().UTC(),
			Type:            ev.EventType,
			Headers:         p.cfg.Headers,
			Body:            body,
		})
		if err != nil {
			return nil, err
		}
		p.window = append(p.window, dc)
		confirms = append(confirms, dc)
	}
	return confirms, nil
}

func (p *floorPublisher) waitOldest(ctx context.Context) error {
	dc := p.window[0]
	p.window = p.window[1:]
	return waitConfirm(ctx, dc)
}

// waitConfirm waits for dc's ack (a deferred confirmation may be waited
// for more than once).
func waitConfirm(ctx context.Context, dc *amqp.DeferredConfirmation) error {
	ok, err := dc.WaitContext(ctx)
	if err == nil && !ok {
		err = errors.New("publish nacked")
	}
	return err
}

// drain waits for the confirms still outstanding.
func (p *floorPublisher) drain(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.window) > 0 {
		if err := p.waitOldest(ctx); err != nil {
			return err
		}
	}
	return nil
}

// deliver POSTs the deliveries that are ready, up to prefetch, to the
// app's batch endpoint in one body (app batch; app single: each to the
// events endpoint; app stream: deliverStream) and acks them on its 2xx,
// until deliveries closes. Taking deliveries and POSTing them overlap:
// while one batch is at the app, the next is gathered.
func (f floorRun) deliver(ctx context.Context, deliveries <-chan amqp.Delivery, prefetch int, appURL string) error {
	if f.app == appStream {
		return deliverStream(ctx, deliveries, prefetch, appURL)
	}
	url, per := appURL+caller.BatchPath, prefetch
	if f.app == appSingle {
		url, per = appURL+caller.EventsPath, 1
	}
	type batch struct {
		body []byte
		n    int
		last amqp.Delivery
	}
	batches := make(chan batch, 1)
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		hc := &http.Client{Transport: &http.Transport{Proxy: nil}}
		defer hc.CloseIdleConnections()
		unacked := 0
		for b := range batches {
			if err := postJSON(ctx, hc, url, b.body, false); err != nil {
				errc <- err
				return
			}
			// The app has them: ack as the raw baseline's consumer does,
			// once per burst and at the latest every half window.
			if unacked += b.n; len(batches) > 0 && unacked < max(prefetch/2, 1) {
				continue
			}
			if err := b.last.Ack(true); err != nil {
				errc <- err
				return
			}
			unacked = 0
		}
	}()
	defer close(batches)
	var buf bytes.Buffer
	appendMessage := func(d amqp.Delivery) { writeAppMessage(&buf, d) }
	for d := range deliveries {
		buf = bytes.Buffer{}
		b := batch{n: 1, last: d}
		if per == 1 {
			appendMessage(d)
		} else {
			buf.WriteString(`{"messages":[`)
			appendMessage(d)
			for ; b.n < per && len(deliveries) > 0; b.n++ {
				b.last = <-deliveries
				buf.WriteByte(',')
				appendMessage(b.last)
			}
			buf.WriteString(`]}`)
		}
		b.body = buf.Bytes()
		select {
		case batches <- b:
		case err := <-errc:
			return err
		}
	}
	return nil
}

// writeAppMessage writes delivery d as the app's message.
func writeAppMessage(buf *bytes.Buffer, d amqp.Delivery) {
	buf.WriteString(`{"session_id":"`)
	buf.WriteString(d.CorrelationId)
	buf.WriteString(`","type":"event","sequence":`)
	buf.WriteString(d.MessageId)
	buf.WriteString(`,"event_type":"`)
	buf.WriteString(d.Type)
	buf.WriteString(`","data":`)
	buf.Write(d.Body)
	buf.WriteByte('}')
}

// TestHarnessAPIFloor runs the floor that make bench sets beside the relay,
// small: every event reaches the app once and in order, at 1 and at 3
// sessions, paced and not, in async, batch, simple and stream mode, to an
// app that takes batches, to one that does not and over the app's stream.
func TestHarnessAPIFloor(t *testing.T) {
	broker := testbed.EnsureRabbitMQ(t)
	for _, tc := range []struct {
		mode     emitMode
		app      appMode
		sessions int
		rate     float64
	}{{modeAsync, appBatch, 1, 0}, {modeAsync, appBatch, 3, 0}, {modeAsync, appBatch, 3, 2000},
		{modeBatch, appSingle, 3, 0}, {modeSimple, appBatch, 3, 0},
		{modeStream, appStream, 1, 0}, {modeStream, appStream, 3, 0}, {modeStream, appStream, 3, 2000}, {modeStream, appSingle, 3, 0}, {modeAsync, appStream, 3, 0}} {
		t.Run(fmt.Sprintf("mode=%s/app=%s/sessions=%d/rate=%v", tc.mode, tc.app, tc.sessions, tc.rate), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg, err := rawConfig(t, broker, "floor", sameMessages(benchutil.Config{Messages: 2000, Rate: tc.rate}))
			if err != nil {
				t.Fatal(err)
			}
			res, err := floorRun{mode: tc.mode, app: tc.app, sessions: tc.sessions}.run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(res.Latencies); got != cfg.Messages {
				t.Fatalf("the app timed %d events; want %d", got, cfg.Messages)
			}
			t.Logf("%d events over %d session(s): %.0f events/s, p99 %v", cfg.Messages, tc.sessions, res.Throughput(), res.Percentile(0.99))
		})
	}
}
