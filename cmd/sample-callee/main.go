// Command sample-callee is a sample HCP callee harness. It speaks only the
// hcp-sidecar's local HTTP API (docs/harness-api.md): it accepts tasks on
// POST /hcp/v1/tasks, simulates them step by step and reports progress,
// checkpoints, pauses, completion or failure to the sidecar, and honours
// aborts. See package internal/samplecallee for the inputs it understands.
//
//	sample-callee --listen :8080 --sidecar http://127.0.0.1:9090
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/stdr"

	"github.com/hcp-io/hcp-operator/internal/samplecallee"
)

func main() {
	listen := flag.String("listen", envOr("HARNESS_ADDR", ":8080"), "address the harness API listens on (the Callee's spec.harness.port)")
	sidecar := flag.String("sidecar", envOr("HCP_SIDECAR_URL", "http://127.0.0.1:9090"), "base URL of the hcp-sidecar's local API")
	flag.Parse()

	log := stdr.New(nil).WithName("sample-callee")
	if err := run(*listen, *sidecar, log); err != nil {
		fmt.Fprintln(os.Stderr, "sample-callee:", err)
		os.Exit(1)
	}
}

func run(listen, sidecar string, log logr.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	h := samplecallee.New(sidecar, log)
	// HCP_SAMPLE_STEP_LOG: a file (on a hostPath the chaos suite mounts)
	// that every step executed is appended to (samplecallee.StepLog).
	if path := os.Getenv("HCP_SAMPLE_STEP_LOG"); path != "" {
		pod, _ := os.Hostname()
		steps, err := samplecallee.OpenStepLog(path, pod)
		if err != nil {
			return fmt.Errorf("HCP_SAMPLE_STEP_LOG: %w", err)
		}
		h.SetStepLog(steps)
	}
	srv := &http.Server{Addr: listen, Handler: h.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errCh := make(chan error, 1)
	go func() { errCh <- srv.ListenAndServe() }()
	log.Info("Serving the harness API", "listen", listen, "sidecar", sidecar)
	select {
	case err := <-errCh:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
