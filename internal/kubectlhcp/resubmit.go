package kubectlhcp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// The session's checkpoint ConfigMap (internal/sidecar/checkpoint: the
// plugin does not import the sidecar) keeps the task the harness was
// given, inputs included, once the harness has checkpointed.
const (
	checkpointConfigMapPrefix = "hcp-session-"
	checkpointTaskKey         = "task.json"
)

// ResubmitOptions are the flags of `kubectl hcp resubmit`.
type ResubmitOptions struct {
	Session string
	// Force resubmits a session that has not ended.
	Force bool
	// CallerNamespace is where the Caller is (default: the session's).
	CallerNamespace string
	// Submit carries --caller, the overrides (--inputs, --intent,
	// --data-class, --max-duration, --max-risk) and how to submit and
	// follow; its Callee and Capability are the session's.
	Submit SubmitOptions
	out    *outputFlags
}

func newResubmitCommand(env *Env) *cobra.Command {
	var o ResubmitOptions
	cmd := &cobra.Command{
		Use:   "resubmit SESSION [--watch] [--inputs JSON|@file.json] [--force]",
		Short: "Submit a session's task again, as a new task, through its Caller's sidecar",
		Long: `Submit the task of an ended session again: a new task_submit with a new
message_id, the same callee, capability, intent, inputs and constraints,
through the sidecar of the Caller that submitted it (as submit does). It
prints the new session.

Where the task comes from: the callee, capability, intent, data class and
max duration are on the HCPSession; the inputs (and the exact constraints)
only in its checkpoint ConfigMap hcp-session-SESSION, which exists once the
harness has checkpointed. Without it, give --inputs. --intent, --inputs,
--data-class, --max-duration and --max-risk override what is copied; a
deadline is a point in time and is never copied.

Refused: a session that has not ended (PENDING, RUNNING, PAUSED, ABORTING),
since the task would run twice at once, unless --force; a session whose
inputs are not stored, unless --inputs.`,
		Example: `  kubectl hcp resubmit 4b1c
  kubectl hcp resubmit 4b1c --watch
  kubectl hcp resubmit 4b1c --inputs @task.json --data-class T1 -o name`,
		Args: oneSession,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.out.check(); err != nil {
				return err
			}
			if o.Submit.Watch && !o.out.table() {
				return &ExitError{Code: ExitFailure, Err: fmt.Errorf("-o %s and --watch: give one (kubectl hcp watch follows the session -o name printed)", o.out.format())}
			}
			o.Session = args[0]
			return RunResubmit(cmd.Context(), env, o, cmd.Flags().Changed)
		},
	}
	f := cmd.Flags()
	s := &o.Submit
	f.BoolVar(&o.Force, "force", false, "resubmit a session that has not ended (the task then runs twice at once)")
	f.StringVar(&s.Caller, "caller", "", "the Caller (object name) whose sidecar submits (default: the one whose id is the session's caller)")
	f.StringVar(&o.CallerNamespace, "caller-namespace", "", "the Caller's namespace (default: the session's)")
	f.StringVar(&s.Intent, "intent", "", "override the intent")
	f.StringVar(&s.Inputs, "inputs", "", "override the inputs: a JSON object, @FILE with one, or @- (stdin)")
	f.StringVar(&s.DataClass, "data-class", "", "override constraints.data_classification: T1..T4")
	f.StringVar(&s.MaxDuration, "max-duration", "", "override constraints.max_duration, ISO 8601 (PT10M)")
	f.StringVar(&s.MaxRisk, "max-risk", "", "override constraints.max_risk_level: R1..R5")
	f.StringVar(&s.SidecarURL, "sidecar-url", "", "the Caller sidecar's API; default: port-forward to a Ready pod of the Caller")
	f.DurationVar(&s.DecisionTimeout, "decision-timeout", 2*time.Minute, "how long to wait for the callee's answer")
	f.BoolVarP(&s.Watch, "watch", "w", false, "follow the new session until it ends; the exit code is its outcome")
	f.BoolVar(&s.Plain, "plain", false, "with --watch: plain lines instead of progress bars")
	f.DurationVar(&s.Timeout, "timeout", 0, "with --watch: give up following after this long (exit code 6)")
	o.out = addOutputFlags(cmd, "the new session's row with risk, stage, sequence, pod and reason")
	return cmd
}

// storedTask is what the checkpoint ConfigMap keeps of the task.
type storedTask struct {
	CalleeID    string           `json:"callee_id"`
	Capability  string           `json:"capability"`
	Intent      string           `json:"intent"`
	Inputs      json.RawMessage  `json:"inputs"`
	Constraints task.Constraints `json:"constraints"`
}

// RunResubmit submits the session's task again; changed says which flags
// were given (overrides).
func RunResubmit(ctx context.Context, env *Env, o ResubmitOptions, changed func(string) bool) error {
	c, ns, err := env.clientAndNamespace()
	if err != nil {
		return err
	}
	hs, err := getSession(ctx, c, ns, o.Session)
	if err != nil {
		return &ExitError{Code: ExitFailure, Err: err}
	}
	if st := stateOf(hs); !st.IsTerminal() && !o.Force {
		return &ExitError{Code: ExitFailure, Err: fmt.Errorf("session %s is %s: a resubmit now would run the task twice at once; wait for it to end (kubectl hcp watch %s), abort it (kubectl hcp abort %s --wait), or give --force", hs.Name, st, hs.Name, hs.Name)}
	}
	orig, where, err := originalTask(ctx, c, hs)
	if err != nil {
		return &ExitError{Code: ExitFailure, Err: err}
	}
	so := o.Submit
	so.Callee, so.Capability, so.SessionNamespace = hs.Spec.CalleeID, hs.Spec.Capability, hs.Namespace
	if !changed("intent") {
		so.Intent = hs.Spec.Intent
	}
	if !changed("inputs") {
		if orig == nil {
			return &ExitError{Code: ExitFailure, Err: fmt.Errorf("the inputs of session %s are not stored in the cluster: an HCPSession records none, and %s; give them with --inputs", hs.Name, where)}
		}
		so.Inputs = string(orig.Inputs)
	}
	callerNS := o.CallerNamespace
	if callerNS == "" {
		callerNS = hs.Namespace
	}
	if so.Caller == "" {
		if so.Caller, err = callerNamed(ctx, c, callerNS, hs.Spec.CallerID); err != nil {
			return &ExitError{Code: ExitFailure, Err: err}
		}
	}
	req, err := buildSubmitRequest(so, env.Streams.In)
	if err != nil {
		return &ExitError{Code: ExitFailure, Err: err}
	}
	req.Constraints = resubmitConstraints(req.Constraints, orig, hs, changed)
	out := env.Streams.Out
	if !o.out.table() {
		out = env.Streams.ErrOut // stdout is for the printed object
	}
	if changed("inputs") {
		where = "the inputs from --inputs, the constraints from the HCPSession"
		if orig != nil {
			where = "the inputs from --inputs, the constraints from ConfigMap " + checkpointConfigMapPrefix + hs.Name
		}
	}
	_, _ = fmt.Fprintf(out, "resubmitting session %s (%s on %s for %s, %s); %s\n", hs.Name, hs.Spec.Capability, hs.Spec.CalleeID, hs.Spec.CallerID, stateOf(hs), where)
	env.Namespace = callerNS
	t, err := submitTask(ctx, env, so, req, out)
	if err != nil {
		return err
	}
	if so.Watch {
		return watchSubmitted(ctx, env, so, t)
	}
	return printNewSession(ctx, env, c, hs.Namespace, t.SessionID, o.out)
}

// originalTask reads the task from the session's checkpoint ConfigMap;
// nil when there is none. where says where the task came from, or why
// it is not stored.
func originalTask(ctx context.Context, c client.Reader, hs *hcpv1alpha1.HCPSession) (*storedTask, string, error) {
	name := checkpointConfigMapPrefix + hs.Name
	cm := &corev1.ConfigMap{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: hs.Namespace, Name: name}, cm); {
	case apierrors.IsNotFound(err):
		return nil, "its checkpoint ConfigMap " + name + " (which keeps the task once the harness checkpoints) does not exist", nil
	case apierrors.IsForbidden(err):
		return nil, "its checkpoint ConfigMap " + name + " cannot be read (" + err.Error() + ")", nil
	case err != nil:
		return nil, "", apiError("reading ConfigMap "+name, err)
	}
	raw := cm.Data[checkpointTaskKey]
	var t storedTask
	if err := json.Unmarshal([]byte(raw), &t); err != nil || t.Inputs == nil {
		return nil, "its checkpoint ConfigMap " + name + " has no readable " + checkpointTaskKey, nil
	}
	if t.Capability != hs.Spec.Capability || t.CalleeID != hs.Spec.CalleeID {
		return nil, "", fmt.Errorf("ConfigMap %s holds a task of %s on %s, not the session's %s on %s", name, t.Capability, t.CalleeID, hs.Spec.Capability, hs.Spec.CalleeID)
	}
	return &t, "the task from ConfigMap " + name, nil
}

// resubmitConstraints are the new task's constraints: the flags given,
// else the original task's, else what the HCPSession records (the data
// class and max duration in force). Never the deadline.
func resubmitConstraints(flags task.Constraints, orig *storedTask, hs *hcpv1alpha1.HCPSession, changed func(string) bool) task.Constraints {
	c := flags
	if orig != nil {
		if !changed("data-class") {
			c.DataClassification = orig.Constraints.DataClassification
		}
		if !changed("max-risk") {
			c.MaxRiskLevel = orig.Constraints.MaxRiskLevel
		}
		if !changed("max-duration") {
			c.MaxDuration = orig.Constraints.MaxDuration
		}
		return c
	}
	if !changed("data-class") && hs.Spec.DataClassification != "" {
		if dc, err := task.ParseDataClass(string(hs.Spec.DataClassification)); err == nil {
			c.DataClassification = dc
		}
	}
	if !changed("max-duration") && hs.Spec.MaxDuration != "" {
		if d, err := task.ParseDuration(string(hs.Spec.MaxDuration)); err == nil {
			c.MaxDuration = task.Duration(d)
		}
	}
	return c
}

// callerNamed is the name of the Caller in ns whose id is id.
func callerNamed(ctx context.Context, c client.Reader, ns, id string) (string, error) {
	var callers hcpv1alpha1.CallerList
	if err := c.List(ctx, &callers, client.InNamespace(ns)); err != nil {
		return "", apiError("listing Callers", err)
	}
	var names []string
	for i := range callers.Items {
		if callers.Items[i].ID() == id {
			names = append(names, callers.Items[i].Name)
		}
	}
	switch len(names) {
	case 1:
		return names[0], nil
	case 0:
		return "", fmt.Errorf("no Caller with id %q in namespace %s submits for this session: give --caller NAME (and --caller-namespace NS)", id, ns)
	}
	return "", fmt.Errorf("the Callers %s in namespace %s all have id %q: give --caller NAME", strings.Join(names, ", "), ns, id)
}

// printNewSession prints the new session: its row, or with -o the object.
// The callee writes it before it answers; the read is retried briefly
// for an API server that lags.
func printNewSession(ctx context.Context, env *Env, c client.Reader, ns, name string, out *outputFlags) error {
	hs := &hcpv1alpha1.HCPSession{}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, hs)
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			return &ExitError{Code: ExitFailure, Err: apiError("reading the new HCPSession "+name, err)}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	if out.table() {
		return RenderSessions(env.Streams.Out, []hcpv1alpha1.HCPSession{*hs}, env.now(), false, out.wide())
	}
	var obj *unstructured.Unstructured
	var err error
	if out.format() == formatName {
		obj, err = apiObject(hs, false)
	} else {
		obj, err = sessionObject(hs, env.now(), out.showManagedFields())
	}
	if err != nil {
		return err
	}
	return out.print(env.Streams.Out, obj)
}
