package kubectlhcp

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AnnotationAbortReason records on an HCPSession why a user aborted it
// with kubectl hcp abort --reason. The API has no field for it
// (spec.abortRequested is a bool); the sidecar does not read it.
const AnnotationAbortReason = "hcp.io/abort-reason"

// fieldManager is the plugin's field manager on what it writes.
const fieldManager = "kubectl-hcp"

// AbortOptions are the flags of `kubectl hcp abort`.
type AbortOptions struct {
	Session string
	Reason  string
	// Wait follows the session until it ends (exit code: its outcome).
	Wait    bool
	Timeout time.Duration
}

func newAbortCommand(env *Env) *cobra.Command {
	var o AbortOptions
	cmd := &cobra.Command{
		Use:   "abort SESSION [--reason R] [--wait]",
		Short: "Abort a running session (sets spec.abortRequested)",
		Long: `Abort a session: sets spec.abortRequested=true on its HCPSession, as
kubectl patch would. The replica running it moves it to ABORTING, tells the
harness to stop and ends it ABORTED. The API has no field for a reason: with
--reason it is recorded in the annotation hcp.io/abort-reason, for people;
the sidecar does not forward it.`,
		Example: `  kubectl hcp abort 4b1c --reason "wrong substrate loaded"
  kubectl hcp abort 4b1c --wait`,
		Args: oneSession,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Session = args[0]
			return RunAbort(cmd.Context(), env, o)
		},
	}
	cmd.Flags().StringVar(&o.Reason, "reason", "", "why (recorded in the annotation "+AnnotationAbortReason+")")
	cmd.Flags().BoolVar(&o.Wait, "wait", false, "follow the session until it ends; the exit code is its outcome (3 ABORTED)")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", 0, "with --wait: give up after this long (exit code 6)")
	return cmd
}

// RunAbort requests the abort of a session.
func RunAbort(ctx context.Context, env *Env, o AbortOptions) error {
	c, ns, err := env.clientAndNamespace()
	if err != nil {
		return err
	}
	hs, err := getSession(ctx, c, ns, o.Session)
	if err != nil {
		return &ExitError{Code: ExitFailure, Err: err}
	}
	if s := stateOf(hs); s.IsTerminal() {
		return &ExitError{Code: ExitFailure, Err: fmt.Errorf("session %s already ended %s: nothing to abort", hs.Name, s)}
	}
	out := env.Streams.Out
	if hs.Spec.AbortRequested && o.Reason == "" {
		_, _ = fmt.Fprintf(out, "session %s: abort already requested (state %s)\n", hs.Name, stateOf(hs))
	} else {
		patch := map[string]any{"spec": map[string]any{"abortRequested": true}}
		if o.Reason != "" {
			patch["metadata"] = map[string]any{"annotations": map[string]string{AnnotationAbortReason: o.Reason}}
		}
		data, err := json.Marshal(patch)
		if err != nil {
			return err
		}
		if err := c.Patch(ctx, hs, client.RawPatch(types.MergePatchType, data), client.FieldOwner(fieldManager)); err != nil {
			return &ExitError{Code: ExitFailure, Err: apiError("patching HCPSession "+hs.Name, err)}
		}
		_, _ = fmt.Fprintf(out, "session %s: abort requested (spec.abortRequested=true; it was %s)\n", hs.Name, stateOf(hs))
		if o.Reason != "" {
			_, _ = fmt.Fprintf(out, "reason recorded in the annotation %s (the HCPSession API has no reason field; the harness is told \"abort requested (spec.abortRequested)\")\n", AnnotationAbortReason)
		}
	}
	if !o.Wait {
		return nil
	}
	return RunWatch(ctx, env, WatchOptions{Session: hs.Name, Timeout: o.Timeout})
}
