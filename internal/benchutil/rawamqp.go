package benchutil

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RawAMQP091 runs the baseline with plain amqp091-go and returns its result.
func RawAMQP091(ctx context.Context, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	if cfg.Messages <= 0 {
		return Result{}, errors.New("benchutil: Messages must be positive")
	}
	rec := NewRecorder(NewRunID("raw"), cfg.Messages)

	consConn, cch, err := DialChannel(cfg.URL, "bench-raw-consumer")
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = consConn.Close() }()
	if err := cch.Qos(cfg.Prefetch, 0, false); err != nil {
		return Result{}, err
	}
	deliveries, err := cch.Consume(cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return Result{}, err
	}
	consErr := make(chan error, 1)
	go func() {
		// Acks are cumulative (multiple=true): one per burst of deliveries
		// taken, at the latest every half window, the fewest frames a raw
		// consumer can send without holding the window.
		var unacked int
		for d := range deliveries {
			rec.ObserveHeaders(d.Headers)
			unacked++
			if len(deliveries) > 0 && unacked < max(cfg.Prefetch/2, 1) {
				continue
			}
			if err := d.Ack(true); err != nil {
				consErr <- err
				return
			}
			unacked = 0
		}
	}()

	pubConn, pch, err := DialChannel(cfg.URL, "bench-raw-publisher")
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = pubConn.Close() }()
	if err := pch.Confirm(false); err != nil {
		return Result{}, err
	}
	returns := pch.NotifyReturn(make(chan amqp.Return, 16))
	returned := make(chan amqp.Return, 1)
	go func() {
		for r := range returns {
			select {
			case returned <- r:
			default:
			}
		}
	}()

	body := cfg.Body
	if body == nil {
		body = Body(cfg.BodySize)
	}
	pacer := NewPacer(cfg.Rate)
	window := make([]*amqp.DeferredConfirmation, 0, cfg.Window)
	waitOldest := func() error {
		dc := window[0]
		window = window[1:]
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("benchutil: publish nacked")
		}
		return nil
	}
	if cfg.OnStart != nil {
		cfg.OnStart()
	}
	rec.Start()
	for i := 0; i < cfg.Messages; i++ {
		if err := pacer.Wait(ctx); err != nil {
			return Result{}, err
		}
		if len(window) == cfg.Window {
			if err := waitOldest(); err != nil {
				return Result{}, err
			}
		}
		dc, err := pch.PublishWithDeferredConfirmWithContext(ctx, cfg.Exchange, cfg.RoutingKey, true, false, amqp.Publishing{
			ContentType:     "application/json",
			ContentEncoding: "utf-8",
			DeliveryMode:    amqp.Persistent,
			CorrelationId:   runCorrelation,
			MessageId:       messageID(i),
			Timestamp:       time.Now().UTC(),
			Type:            "event",
			Headers:         stampWith(rec, i, cfg.Headers),
			Body:            body,
		})
		if err != nil {
			return Result{}, err
		}
		window = append(window, dc)
	}
	for len(window) > 0 {
		if err := waitOldest(); err != nil {
			return Result{}, err
		}
	}
	select {
	case <-rec.Done():
	case r := <-returned:
		return Result{}, fmt.Errorf("benchutil: message returned: %d %s (is queue %s bound with %q?)", r.ReplyCode, r.ReplyText, cfg.Queue, cfg.RoutingKey)
	case err := <-consErr:
		return Result{}, err
	case <-ctx.Done():
		return Result{}, fmt.Errorf("benchutil: %d of %d messages consumed: %w", rec.Received(), cfg.Messages, ctx.Err())
	}
	return rec.Result(), nil
}

// runCorrelation and messageID give the raw baseline's messages
// properties as long as an HCP event's (a session id and a UUID-long
// message id).
const runCorrelation = "00000000-0000-4000-8000-000000000000"

func messageID(i int) string { return fmt.Sprintf("%036d", i) }

// stampWith is rec's stamp of message seq plus extra headers.
func stampWith(rec *Recorder, seq int, extra amqp.Table) amqp.Table {
	h := rec.Stamp(seq)
	for k, v := range extra {
		h[k] = v
	}
	return h
}

// DialChannel opens a connection to url named name (as the management UI
// shows it) and a channel on it; the caller closes the connection.
func DialChannel(url, name string) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Heartbeat: 30 * time.Second, Properties: connName(name)})
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

func connName(n string) amqp.Table {
	p := amqp.NewConnectionProperties()
	p.SetClientConnectionName(n)
	return p
}
