// Command kubectl-hcp is the kubectl plugin `kubectl hcp`: HCP sessions
// (list, watch with progress bars, describe, logs, abort, submit,
// resubmit; -o json|yaml|name|wide), a harness's
// RabbitMQ topology, and a health check of an installation. Install it on
// PATH (or with krew, plugins/krew/hcp.yaml) and run `kubectl hcp --help`.
// See docs/kubectl-plugin.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/hcp-io/hcp-operator/internal/kubectlhcp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := kubectlhcp.Main(ctx, os.Args[1:], genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	stop()
	os.Exit(code)
}
