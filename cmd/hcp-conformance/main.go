// Command hcp-conformance checks an HCP callee against the specification:
// it connects to the broker as a caller, drives the callee through every
// path the spec describes (tasks, a duplicate, rejections, malformed
// commands, an abort, a caller reconnect) and prints a pass/fail table
// with one row per spec sentence. See docs/conformance-kit.md.
//
// Exit status: 0 all checks passed (or were skipped), 1 a check failed,
// 2 usage error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/conformance"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hcp-conformance", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg                          conformance.Config
		urlFile, inputs, abortInputs string
		quiet                        bool
	)
	fs.StringVar(&cfg.AMQPURL, "amqp-url", "", "AMQP URI of a caller user (amqp[s]://user:pass@host:port/vhost); default $HCP_CONFORMANCE_AMQP_URL")
	fs.StringVar(&urlFile, "amqp-url-file", "", "read the AMQP URI from this file (e.g. the key uri of a Caller's credentials Secret)")
	fs.StringVar(&cfg.CalleeID, "callee", "", "id of the callee under test (its command queue is hcp.cmd.ID)")
	fs.StringVar(&cfg.CallerID, "caller", "", "caller id of the user in the URL (its event queue is hcp.evt.ID)")
	fs.StringVar(&cfg.Vhost, "vhost", "", "vhost; overrides the URL's")
	fs.StringVar(&cfg.CalleeUser, "callee-user", "", "the callee's broker username its messages must carry as user_id (default: derived from the operator's naming scheme when the caller's username follows it)")
	fs.StringVar(&cfg.Capability, "capability", "", "a capability whose task the callee accepts and completes")
	fs.StringVar(&inputs, "inputs", "{}", "JSON object: inputs of that task")
	fs.StringVar(&cfg.AbortCapability, "abort-capability", "", "a capability whose task runs long enough to abort (several seconds, with events); default --capability")
	fs.StringVar(&abortInputs, "abort-inputs", "", "JSON object: inputs of the long task; default --inputs")
	fs.StringVar(&cfg.DataClassification, "data-class", "", "constraints.data_classification of the tasks (T1..T4); default none")
	fs.StringVar(&cfg.UnknownCapability, "unknown-capability", conformance.DefaultUnknownCapability, "a capability the callee does not offer")
	fs.StringVar(&cfg.ManagementURL, "management-url", "", "RabbitMQ management API, http(s)://user:pass@host:15672; without it the MGMT checks are skipped")
	fs.DurationVar(&cfg.Timeout, "timeout", conformance.DefaultTimeout, "bound of each wait for an answer or an event")
	fs.DurationVar(&cfg.Disconnect, "disconnect", conformance.DefaultDisconnect, "how long the kit stays disconnected in the continuity check")
	fs.BoolVar(&quiet, "quiet", false, "no progress lines on stderr")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "Usage: hcp-conformance --amqp-url URI --callee ID --caller ID --capability NAME [flags]\n\n"+
			"Checks an HCP callee against the specification and prints one row per spec sentence.\n"+
			"Exit status: 0 pass, 1 a check failed, 2 usage error.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "hcp-conformance: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if cfg.AMQPURL == "" && urlFile != "" {
		b, err := os.ReadFile(urlFile)
		if err != nil {
			_, _ = fmt.Fprintf(stderr, "hcp-conformance: --amqp-url-file: %v\n", err)
			return 2
		}
		cfg.AMQPURL = strings.TrimSpace(string(b))
	}
	if cfg.AMQPURL == "" {
		cfg.AMQPURL = os.Getenv("HCP_CONFORMANCE_AMQP_URL")
	}
	cfg.Inputs = json.RawMessage(inputs)
	cfg.AbortInputs = json.RawMessage(abortInputs)
	if !quiet {
		cfg.Log = stderr
	}
	if err := cfg.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "hcp-conformance: %v\n\n", err)
		fs.Usage()
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	rep := conformance.Run(ctx, cfg)
	_, _ = fmt.Fprintf(stdout, "HCP conformance: callee %q, caller %q, %s, %s\n\n", cfg.CalleeID, cfg.CallerID,
		start.UTC().Format(time.RFC3339), time.Since(start).Round(100*time.Millisecond))
	if err := rep.Print(stdout); err != nil {
		_, _ = fmt.Fprintf(stderr, "hcp-conformance: %v\n", err)
		return 1
	}
	if rep.Failed() {
		return 1
	}
	return 0
}
