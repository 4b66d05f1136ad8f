package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/conformance"
)

// runCallee is the callee kit: the flags of hcp-conformance before the
// caller kit, plus the common ones.
func runCallee(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hcp-conformance callee", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg                 conformance.Config
		c                   common
		inputs, abortInputs string
	)
	c.bind(fs, &cfg.AMQPURL, &cfg.Vhost, &cfg.ManagementURL, &cfg.Timeout)
	fs.StringVar(&cfg.CalleeID, "callee", "", "id of the callee under test (its command queue is hcp.cmd.ID)")
	fs.StringVar(&cfg.CallerID, "caller", "", "the kit's caller id: the user in the URL (its event queue is hcp.evt.ID)")
	fs.StringVar(&cfg.CalleeUser, "callee-user", "", "the callee's broker username its messages must carry as user_id (profile hcp-operator; default: derived from the operator's naming scheme when the caller's username follows it)")
	fs.StringVar(&cfg.Capability, "capability", "", "a capability whose task the callee accepts and completes")
	fs.StringVar(&inputs, "inputs", "{}", "JSON object: inputs of that task")
	fs.StringVar(&cfg.AbortCapability, "abort-capability", "", "a capability whose task runs long enough to abort (several seconds, with events); default --capability")
	fs.StringVar(&abortInputs, "abort-inputs", "", "JSON object: inputs of the long task; default --inputs")
	fs.StringVar(&cfg.DataClassification, "data-class", "", "constraints.data_classification of the tasks (T1..T4); default none")
	fs.StringVar(&cfg.UnknownCapability, "unknown-capability", conformance.DefaultUnknownCapability, "a capability the callee does not offer")
	fs.DurationVar(&cfg.Disconnect, "disconnect", conformance.DefaultDisconnect, "how long the kit stays disconnected in the continuity check")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "Usage: hcp-conformance [callee] --amqp-url URI --callee ID --caller ID --capability NAME [flags]\n\n"+
			"Plays a caller against an HCP callee and prints one row per spec statement.\n"+
			"Exit status: 0 pass, 1 a check failed, 2 usage error.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := parse(fs, args, stderr); !ok {
		return code
	}
	if !c.url(&cfg.AMQPURL, stderr) {
		return 2
	}
	cfg.Inputs, cfg.AbortInputs, cfg.Profile = json.RawMessage(inputs), json.RawMessage(abortInputs), c.profile
	if !c.quiet {
		cfg.Log = stderr
	}
	if err := cfg.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "hcp-conformance: %v\n\n", err)
		fs.Usage()
		return 2
	}
	ctx, stop := signalContext()
	defer stop()
	rep := conformance.Run(ctx, cfg)
	return finish(rep, fmt.Sprintf("HCP conformance: callee %q, caller %q", cfg.CalleeID, cfg.CallerID), &c, stdout, stderr)
}

// runCaller is the caller kit.
func runCaller(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hcp-conformance caller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg            conformance.CallerConfig
		c              common
		apiURL, listen string
	)
	c.bind(fs, &cfg.AMQPURL, &cfg.Vhost, &cfg.ManagementURL, &cfg.Timeout)
	fs.StringVar(&cfg.CalleeID, "callee", "", "the kit's own callee id: the user in the URL (its command queue is hcp.cmd.ID)")
	fs.StringVar(&cfg.CallerID, "caller", "", "id of the caller under test (its event queue is hcp.evt.ID)")
	fs.StringVar(&cfg.CallerUser, "caller-user", "", "the caller's broker username: the reconnect check closes its connections; profile hcp-operator checks its commands' user_id (default: derived from the operator's naming scheme when the kit's username follows it)")
	fs.StringVar(&apiURL, "caller-api", "", "base URL of the caller's app API (this project's caller sidecar: http://127.0.0.1:9090), through which the kit submits and aborts")
	fs.StringVar(&listen, "app-listen", "127.0.0.1:8080", "address the kit serves the caller's app API on (POST /hcp/v1/events): the caller's app URL must point here")
	fs.StringVar(&cfg.Capability, "capability", conformance.DefaultKitCapability, "capability named in the kit's tasks")
	fs.StringVar(&cfg.DataClassification, "data-class", "", "constraints.data_classification of the tasks (T1..T4); default none")
	fs.DurationVar(&cfg.RetryWait, "retry-wait", 0, "how long the kit leaves one task_submit unanswered, waiting for the caller to republish it (longer than the caller's answer timeout; this project's sidecar: 30s); 0 skips SUB-2")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "Usage: hcp-conformance caller --amqp-url URI --callee ID --caller ID --caller-api URL [flags]\n\n"+
			"Plays a callee against an HCP caller and prints one row per spec statement.\n"+
			"Exit status: 0 pass, 1 a check failed, 2 usage error.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := parse(fs, args, stderr); !ok {
		return code
	}
	if !c.url(&cfg.AMQPURL, stderr) {
		return 2
	}
	cfg.Profile = c.profile
	if !c.quiet {
		cfg.Log = stderr
	}
	if apiURL != "" {
		cfg.Driver = conformance.NewAppAPIDriver(apiURL)
	}
	if err := cfg.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "hcp-conformance caller: %v\n\n", err)
		fs.Usage()
		return 2
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "hcp-conformance caller: --app-listen: %v\n", err)
		return 2
	}
	srv := &http.Server{Handler: cfg.Driver.(*conformance.AppAPIDriver).Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_, _ = fmt.Fprintf(stderr, "hcp-conformance caller: app API: %v\n", err)
		}
	}()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	ctx, stop := signalContext()
	defer stop()
	rep := conformance.RunCaller(ctx, cfg)
	return finish(rep, fmt.Sprintf("HCP conformance: caller %q, the kit as callee %q", cfg.CallerID, cfg.CalleeID), &c, stdout, stderr)
}
