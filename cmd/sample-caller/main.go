// Command sample-caller is a sample HCP caller app. It speaks only the
// caller sidecar's local HTTP API (docs/harness-api.md, "Caller side").
//
// Serve mode (the default) receives the event streams the sidecar delivers
// on POST /hcp/v1/events, checks their guarantees (per session: in order,
// no duplicates, no gaps) and shows what it received on GET /received:
//
//	sample-caller serve --listen :8080 [--fail-every 7] [--delay 5ms] [--batch-max 100] [--stream]
//
// Submit mode submits one task through the sidecar and watches it until
// its session ends:
//
//	sample-caller submit --sidecar http://127.0.0.1:9090 --callee lab-cvd \
//	    --capability analyze --intent "analyze the run" --inputs '{"steps":5}' \
//	    --data-class T1
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
)

// The subcommands; serve is the default.
const (
	cmdServe  = "serve"
	cmdSubmit = "submit"
)

func main() {
	args := os.Args[1:]
	cmd := cmdServe
	if len(args) > 0 && (args[0] == cmdServe || args[0] == cmdSubmit) {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case cmdServe:
		err = serve(args)
	case cmdSubmit:
		err = submit(args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sample-caller:", err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", envOr("APP_ADDR", ":8080"), "address of the app API (the sidecar's HCP_HARNESS_URL points here)")
	failEvery := fs.Int("fail-every", 0, "answer 500 to every n-th delivery (fault injection; 0: never)")
	delay := fs.Duration("delay", 0, "time spent processing each delivery")
	batchMax := fs.Int("batch-max", 100, "offer the sidecar batches of up to this many events (the HCP-Batch-Max answer header; below 2: one event per request)")
	stream := fs.Bool("stream", false, "offer the sidecar stream delivery (the HCP-Stream answer header): one long-lived POST /hcp/v1/events/stream carries every delivery")
	_ = fs.Parse(args)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	rec := samplecaller.NewRecorder()
	rec.SetDelay(*delay)
	rec.OfferBatches(*batchMax)
	if *stream {
		rec.OfferStream()
	}
	if *failEvery > 0 {
		var n atomic.Int64
		rec.FailWhen(func(samplecaller.Message) bool { return n.Add(1)%int64(*failEvery) == 0 })
	}
	// HCP_SAMPLE_RECEIPT_LOG: a file (on a hostPath the chaos suite mounts)
	// that every message is appended to before it is acknowledged
	// (samplecaller.ReceiptLog).
	if path := os.Getenv("HCP_SAMPLE_RECEIPT_LOG"); path != "" {
		pod, _ := os.Hostname()
		receipts, err := samplecaller.OpenReceiptLog(path, pod)
		if err != nil {
			return fmt.Errorf("HCP_SAMPLE_RECEIPT_LOG: %w", err)
		}
		defer func() { _ = receipts.Close() }()
		rec.SetReceiptLog(receipts)
	}
	srv := &http.Server{Addr: *listen, Handler: rec.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errCh := make(chan error, 1)
	go func() { errCh <- srv.ListenAndServe() }()
	fmt.Fprintf(os.Stderr, "sample-caller: serving POST /hcp/v1/events (/batch, /stream) and GET /received on %s\n", *listen)
	select {
	case err := <-errCh:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap := rec.Snapshot()
	fmt.Fprintf(os.Stderr, "sample-caller: received %d messages in %d sessions, %d duplicates, %d problems\n",
		snap.Total, len(snap.Sessions), snap.Duplicates, snap.Problems)
	return srv.Shutdown(sctx)
}

func submit(args []string) error {
	fs := flag.NewFlagSet("submit", flag.ExitOnError)
	sidecar := fs.String("sidecar", envOr("HCP_SIDECAR_URL", "http://127.0.0.1:9090"), "base URL of the caller sidecar's local API")
	callee := fs.String("callee", "", "callee id (required)")
	capability := fs.String("capability", "", "capability to invoke (required)")
	intent := fs.String("intent", "sample task", "what the task should do, in words")
	inputs := fs.String("inputs", "{}", "task inputs, a JSON object")
	dataClass := fs.String("data-class", "T1", "data classification T1..T4")
	maxRisk := fs.String("max-risk", "", "highest risk level accepted, R1..R5")
	maxDuration := fs.String("max-duration", "", "ISO 8601 maximum duration, e.g. PT10M")
	messageID := fs.String("message-id", "", "UUID v4 to make the submit idempotent (default: the sidecar picks one)")
	watch := fs.Bool("watch", true, "watch the task and its session until it ends")
	poll := fs.Duration("poll", 250*time.Millisecond, "watch poll interval")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up watching after this long")
	_ = fs.Parse(args)
	if *callee == "" || *capability == "" {
		return errors.New("submit: --callee and --capability are required")
	}
	if !json.Valid([]byte(*inputs)) {
		return fmt.Errorf("submit: --inputs is not valid JSON: %s", *inputs)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	c := samplecaller.NewClient(*sidecar)
	t, err := c.Submit(ctx, samplecaller.SubmitRequest{
		MessageID:  *messageID,
		CalleeID:   *callee,
		Capability: *capability,
		Intent:     *intent,
		Inputs:     json.RawMessage(*inputs),
		Constraints: samplecaller.Constraints{
			DataClassification: *dataClass,
			MaxRiskLevel:       *maxRisk,
			MaxDuration:        *maxDuration,
		},
	})
	if err != nil {
		return err
	}
	fmt.Printf("submitted task %s to %s (expected session %s)\n", t.MessageID, t.CalleeID, t.SessionID)
	if t.Warning != "" {
		fmt.Println("warning:", t.Warning)
	}
	if !*watch {
		return nil
	}
	task, sess, err := c.Watch(ctx, t.MessageID, *poll, os.Stdout)
	if err != nil {
		return err
	}
	switch {
	case task.Status != "accepted":
		return fmt.Errorf("task %s", task.Status)
	case sess.Terminal == "task_failed" || sess.State == "FAILED" || sess.State == "ABORTED":
		return fmt.Errorf("session ended %s", sess.State)
	}
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
