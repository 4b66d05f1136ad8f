// Command hcp-sidecar is the HCP protocol sidecar injected next to a callee
// harness or a caller app. It speaks AMQP 0-9-1 to RabbitMQ and a small
// local HTTP API to its harness (docs/harness-api.md), and records sessions
// as HCPSession objects. Its configuration is the environment contract of
// internal/sidecar/config; --mode overrides HCP_MODE.
//
// Ports: HCP_API_ADDR serves the local harness API; HCP_PROBE_ADDR serves
// /healthz, /readyz and /metrics.
//
// On SIGTERM it stops consuming, finishes the deliveries in hand, lets
// running sessions end (callee mode: up to 20 s, then fails the rest),
// flushes HCPSession status and closes the broker connection.
//
// The wiring is internal/sidecar/runner. Exit codes: 0 stopped by a
// signal, 1 failed, 2 invalid configuration.
package main

import (
	"flag"
	"os"

	"github.com/hcp-io/hcp-operator/internal/sidecar/runner"
)

func main() {
	var f runner.Flags
	f.Bind(flag.CommandLine)
	flag.Parse()
	os.Exit(runner.Main(f))
}
