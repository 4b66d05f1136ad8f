// Package kubectlhcp is the kubectl plugin `kubectl hcp`: sessions, watch,
// describe, logs, abort, submit, resubmit, topology and doctor
// (docs/kubectl-plugin.md).
//
// Each command gathers what it shows through the API (and, for submit,
// the Caller sidecar's local API; for topology and doctor, the broker's
// management API) into plain values, and renders them with pure functions
// (render*.go) that the unit tests call with fixed inputs.
package kubectlhcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Exit codes. A watched session's outcome is the exit code of watch (and
// of submit --watch); see docs/kubectl-plugin.md.
const (
	ExitOK = 0
	// ExitFailure: the command could not do its job (bad input, API errors,
	// a doctor check failed).
	ExitFailure = 1
	// ExitFailed: the session ended FAILED.
	ExitFailed = 2
	// ExitAborted: the session ended ABORTED.
	ExitAborted = 3
	// ExitRejected: the task was rejected (REJECTED, or task_rejected at
	// submit).
	ExitRejected = 4
	// ExitGone: the session was deleted before it ended.
	ExitGone = 5
	// ExitTimeout: --timeout passed before the session ended.
	ExitTimeout = 6
)

// ExitError carries an exit code out of a command.
type ExitError struct {
	Code int
	// Err is printed on stderr when set; nil means the command has already
	// said everything.
	Err error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// exitWith returns an error that makes the command exit with code, printing
// nothing more.
func exitWith(code int) error {
	if code == ExitOK {
		return nil
	}
	return &ExitError{Code: code}
}

// Env is what every command runs with: the kubeconfig flags, the streams
// and the clock. Tests set Client to skip kubeconfig loading.
type Env struct {
	Flags   *genericclioptions.ConfigFlags
	Streams genericiooptions.IOStreams
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// IsTerminal tells whether Out is a terminal (progress bars) or not
	// (plain lines). Detected from Out when nil.
	IsTerminal func() bool

	// Client and Namespace, when set, are used instead of what Flags give.
	Client    client.WithWatch
	Namespace string
	// RESTConfig, when set, is used instead of Flags' (port-forward).
	RESTConfig *rest.Config
	// Logs, when set, serves pods' logs instead of the API server (tests:
	// envtest has no kubelet).
	Logs LogSource
}

func (e *Env) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// client returns the API client.
func (e *Env) client() (client.WithWatch, error) {
	if e.Client != nil {
		return e.Client, nil
	}
	cfg, err := e.restConfig()
	if err != nil {
		return nil, err
	}
	s, err := Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("connecting to the API server: %w", err)
	}
	e.Client = c
	return c, nil
}

func (e *Env) restConfig() (*rest.Config, error) {
	if e.RESTConfig != nil {
		return e.RESTConfig, nil
	}
	cfg, err := e.Flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	e.RESTConfig = cfg
	return cfg, nil
}

// namespace is -n, else the kubeconfig context's namespace, else default.
func (e *Env) namespace() (string, error) {
	if e.Namespace != "" {
		return e.Namespace, nil
	}
	ns, _, err := e.Flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("the namespace from the kubeconfig: %w", err)
	}
	e.Namespace = ns
	return ns, nil
}

// clientAndNamespace returns the API client and the namespace the command
// works in.
func (e *Env) clientAndNamespace() (client.WithWatch, string, error) {
	c, err := e.client()
	if err != nil {
		return nil, "", err
	}
	ns, err := e.namespace()
	if err != nil {
		return nil, "", err
	}
	return c, ns, nil
}

func (e *Env) terminal() bool {
	if e.IsTerminal != nil {
		return e.IsTerminal()
	}
	return isTerminal(e.Streams.Out)
}

// NewCommand returns `kubectl hcp` with its subcommands.
func NewCommand(env *Env) *cobra.Command {
	if env.Flags == nil {
		env.Flags = genericclioptions.NewConfigFlags(true)
	}
	root := &cobra.Command{
		Use:   "kubectl-hcp",
		Short: "Work with HCP sessions, harnesses and the operator",
		Long: `kubectl hcp: list, watch, describe, abort, submit and resubmit HCP task
sessions and show their harness's logs; show a harness's RabbitMQ topology;
check an installation. sessions, describe, topology and resubmit take -o
json|yaml|name|wide (docs/kubectl-plugin.md#output).

Exit codes of watch and submit --watch: 0 COMPLETED, 2 FAILED, 3 ABORTED,
4 REJECTED, 5 the session was deleted, 6 --timeout passed, 1 any other error.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations: map[string]string{
			// kubectl shows the plugin as "kubectl hcp" in usage lines.
			cobra.CommandDisplayNameAnnotation: "kubectl hcp",
		},
	}
	root.SetIn(env.Streams.In)
	root.SetOut(env.Streams.Out)
	root.SetErr(env.Streams.ErrOut)
	env.Flags.AddFlags(root.PersistentFlags())
	root.AddCommand(
		newSessionsCommand(env),
		newWatchCommand(env),
		newDescribeCommand(env),
		newAbortCommand(env),
		newSubmitCommand(env),
		newTopologyCommand(env),
		newDoctorCommand(env),
		newLogsCommand(env),
		newResubmitCommand(env),
	)
	return root
}

// Main runs the plugin with args and returns the exit code.
func Main(ctx context.Context, args []string, streams genericiooptions.IOStreams) int {
	env := &Env{Streams: streams}
	cmd := NewCommand(env)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	return report(err, streams.ErrOut)
}

// report prints err (if it has something to say) and returns the exit code.
func report(err error, w io.Writer) int {
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			_, _ = fmt.Fprintln(w, "error:", ee.Err)
		}
		return ee.Code
	}
	_, _ = fmt.Fprintln(w, "error:", err)
	return ExitFailure
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	return fi.Mode()&os.ModeCharDevice != 0
}
