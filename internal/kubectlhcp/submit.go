package kubectlhcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// SubmitOptions are the flags of `kubectl hcp submit`.
type SubmitOptions struct {
	// Caller is the Caller object (name) whose sidecar submits.
	Caller     string
	Callee     string
	Capability string
	Intent     string
	// Inputs is a JSON object, @FILE, or @- (stdin).
	Inputs      string
	DataClass   string
	MaxDuration string
	MaxRisk     string
	MessageID   string
	// SidecarURL reaches the sidecar directly instead of a port-forward.
	SidecarURL string
	// DecisionTimeout bounds the wait for task_accepted/task_rejected.
	DecisionTimeout time.Duration
	Watch           bool
	Plain           bool
	Timeout         time.Duration
	// SessionNamespace is where the callee writes the HCPSession (the
	// Callee's namespace); default the command's namespace.
	SessionNamespace string
}

func newSubmitCommand(env *Env) *cobra.Command {
	var o SubmitOptions
	cmd := &cobra.Command{
		Use:   "submit --caller C --callee X --capability Y [--inputs JSON|@file.json] [--watch]",
		Short: "Submit a task through a Caller's sidecar, wait for the callee's answer, optionally follow the session",
		Long: `Submit a task as the Caller's app would: POST /hcp/v1/tasks to the hcp-sidecar
in a Ready pod of the Caller (through a port-forward via the API server, as
kubectl port-forward does; or --sidecar-url when the sidecar is reachable
directly). Then wait for the callee's answer (task_accepted or task_rejected)
and, with --watch, follow the session until it ends.

The sidecar's API listens on the pod's loopback only. Clusters whose nodes do
not serve port-forward (the project's local stack) need --sidecar-url from
inside the pod's network namespace; see docs/kubectl-plugin.md.

Exit codes: 0 accepted (with --watch: COMPLETED), 4 rejected, with --watch
2 FAILED, 3 ABORTED, 5 deleted, 6 --timeout; 1 an error or no answer.`,
		Example: `  kubectl hcp submit --caller alpha --callee lab-cvd --capability cvd.run-synthesis \
      --inputs '{"steps":10,"step_ms":500}' --data-class T2 --watch
  kubectl hcp submit --caller alpha --callee lab-cvd --capability cvd.run-synthesis --inputs @task.json
  kubectl hcp submit --caller alpha --callee lab-cvd --capability cvd.run-synthesis --sidecar-url http://127.0.0.1:9090`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return RunSubmit(cmd.Context(), env, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Caller, "caller", "", "the Caller (object name) whose sidecar submits the task (required)")
	f.StringVar(&o.Callee, "callee", "", "callee id to run the task (required)")
	f.StringVar(&o.Capability, "capability", "", "capability to invoke (required)")
	f.StringVar(&o.Intent, "intent", "", "what the task is for, in words (default: \"submitted with kubectl hcp\")")
	f.StringVar(&o.Inputs, "inputs", "{}", "inputs: a JSON object, @FILE with one, or @- to read it from stdin")
	f.StringVar(&o.DataClass, "data-class", "", "constraints.data_classification: T1..T4 (default: the capability's)")
	f.StringVar(&o.MaxDuration, "max-duration", "", "constraints.max_duration, ISO 8601 (PT10M)")
	f.StringVar(&o.MaxRisk, "max-risk", "", "constraints.max_risk_level: R1..R5")
	f.StringVar(&o.MessageID, "message-id", "", "the task's message_id (a UUID v4): makes a repeated submit idempotent")
	f.StringVar(&o.SidecarURL, "sidecar-url", "", "the Caller sidecar's API (http://127.0.0.1:9090 from inside its pod); default: port-forward to a Ready pod of the Caller")
	f.DurationVar(&o.DecisionTimeout, "decision-timeout", 2*time.Minute, "how long to wait for the callee's answer")
	f.BoolVarP(&o.Watch, "watch", "w", false, "follow the session until it ends; the exit code is its outcome")
	f.BoolVar(&o.Plain, "plain", false, "with --watch: plain lines instead of progress bars")
	f.DurationVar(&o.Timeout, "timeout", 0, "with --watch: give up following after this long (exit code 6)")
	f.StringVar(&o.SessionNamespace, "session-namespace", "", "namespace of the Callee, where its HCPSessions are (default: -n)")
	return cmd
}

// buildSubmitRequest validates the flags and builds the request body. in is
// stdin for @-.
func buildSubmitRequest(o SubmitOptions, in io.Reader) (SubmitRequest, error) {
	var missing []string
	for _, f := range []struct{ name, v string }{{"--caller", o.Caller}, {"--callee", o.Callee}, {"--capability", o.Capability}} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return SubmitRequest{}, fmt.Errorf("missing %s", strings.Join(missing, ", "))
	}
	inputs, err := readInputs(o.Inputs, in)
	if err != nil {
		return SubmitRequest{}, err
	}
	req := SubmitRequest{MessageID: o.MessageID, CalleeID: o.Callee, Capability: o.Capability, Intent: o.Intent, Inputs: inputs}
	if req.Intent == "" {
		req.Intent = "submitted with kubectl hcp"
	}
	if o.DataClass != "" {
		dc, err := task.ParseDataClass(strings.ToUpper(o.DataClass))
		if err != nil {
			return SubmitRequest{}, fmt.Errorf("--data-class: %w", err)
		}
		req.Constraints.DataClassification = dc
	}
	if o.MaxRisk != "" {
		r, err := task.ParseRiskLevel(strings.ToUpper(o.MaxRisk))
		if err != nil {
			return SubmitRequest{}, fmt.Errorf("--max-risk: %w", err)
		}
		req.Constraints.MaxRiskLevel = r
	}
	if o.MaxDuration != "" {
		d, err := task.ParseDuration(o.MaxDuration)
		if err != nil {
			return SubmitRequest{}, fmt.Errorf("--max-duration %q: %w (ISO 8601, e.g. PT10M)", o.MaxDuration, err)
		}
		req.Constraints.MaxDuration = task.Duration(d)
	}
	return req, nil
}

// readInputs reads --inputs: a JSON object inline, @FILE or @-.
func readInputs(v string, stdin io.Reader) (json.RawMessage, error) {
	data := []byte(v)
	src := "--inputs"
	if name, ok := strings.CutPrefix(v, "@"); ok {
		var err error
		switch name {
		case "":
			return nil, errors.New("--inputs @: give a file name after @ (or @- for stdin)")
		case "-":
			src = "--inputs @- (stdin)"
			data, err = io.ReadAll(io.LimitReader(stdin, 8<<20))
		default:
			src = "--inputs file " + name
			data, err = os.ReadFile(name)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("%s: not a JSON object: %w", src, err)
	}
	if obj == nil {
		return nil, fmt.Errorf("%s: not a JSON object (null)", src)
	}
	return json.RawMessage(strings.TrimSpace(string(data))), nil
}

// RunSubmit submits the task, waits for the callee's answer and, with
// Watch, follows the session.
func RunSubmit(ctx context.Context, env *Env, o SubmitOptions) error {
	req, err := buildSubmitRequest(o, env.Streams.In)
	if err != nil {
		return &ExitError{Code: ExitFailure, Err: err}
	}
	t, err := submitTask(ctx, env, o, req, env.Streams.Out)
	if err != nil {
		return err
	}
	if !o.Watch {
		_, _ = fmt.Fprintf(env.Streams.Out, "follow it with: kubectl hcp watch %s\n", t.SessionID)
		return nil
	}
	return watchSubmitted(ctx, env, o, t)
}

// watchSubmitted follows the session of an accepted task, in the
// Callee's namespace.
func watchSubmitted(ctx context.Context, env *Env, o SubmitOptions, t TaskView) error {
	if o.SessionNamespace != "" {
		env.Namespace = o.SessionNamespace
	}
	return RunWatch(ctx, env, WatchOptions{Session: t.SessionID, Plain: o.Plain, Timeout: o.Timeout})
}

// submitTask posts req to the Caller sidecar o names (port-forward, or
// o.SidecarURL) and waits for the callee's answer, saying what happens on
// out. An accepted task's view; an ExitError otherwise (ExitRejected for
// a rejection).
func submitTask(ctx context.Context, env *Env, o SubmitOptions, req SubmitRequest, out io.Writer) (TaskView, error) {
	base := o.SidecarURL
	var fwd *forward
	if base == "" {
		f, pod, err := forwardToCaller(ctx, env, o.Caller)
		if err != nil {
			return TaskView{}, &ExitError{Code: ExitFailure, Err: err}
		}
		defer f.Close()
		fwd, base = f, f.URL
		_, _ = fmt.Fprintf(env.Streams.ErrOut, "Submitting through pod %s/%s (port-forward %s)\n", pod.Namespace, pod.Name, f.URL)
	}
	sc := newSidecarClient(base)
	t, err := sc.submit(ctx, req)
	if err != nil {
		if fwd != nil && fwd.problems() != "" {
			err = fmt.Errorf("%w (port-forward: %s; a node without port-forward needs --sidecar-url)", err, fwd.problems())
		}
		return t, &ExitError{Code: ExitFailure, Err: fmt.Errorf("submitting the task: %w", err)}
	}
	_, _ = fmt.Fprintf(out, "task %s submitted to %s (%s); session %s\n", t.MessageID, req.CalleeID, req.Capability, t.SessionID)
	if t.Warning != "" {
		_, _ = fmt.Fprintf(out, "warning: %s\n", t.Warning)
	}
	t, err = waitDecision(ctx, sc, t, o.DecisionTimeout)
	if fwd != nil {
		fwd.Close()
	}
	if err != nil {
		return t, &ExitError{Code: ExitFailure, Err: err}
	}
	_, _ = fmt.Fprintln(out, decisionLine(t))
	switch t.Status {
	case taskAccepted:
		return t, nil
	case taskRejected:
		return t, exitWith(ExitRejected)
	default:
		return t, exitWith(ExitFailure)
	}
}

// Task statuses of the Caller sidecar (TaskView.Status).
const (
	taskPending  = "pending"
	taskAccepted = "accepted"
	taskRejected = "rejected"
)

// decisionLine says what the callee answered.
func decisionLine(t TaskView) string {
	switch t.Status {
	case taskAccepted:
		s := "accepted: session " + t.SessionID
		if t.RiskLevel != "" {
			s += ", risk " + t.RiskLevel
		}
		return s
	case taskRejected:
		return fmt.Sprintf("rejected: %s: %s", t.ReasonCode, t.Message)
	case "unanswered":
		return "unanswered: the callee did not answer any of the sidecar's publishes (is it running? kubectl hcp doctor)"
	case "expired":
		return "expired: the task's expires_at or deadline passed before the callee answered"
	}
	return "status " + t.Status
}

// waitDecision polls the sidecar's record of the task until the callee
// answered (a rejected task writes nothing to the API server: the sidecar
// is the only place that knows).
func waitDecision(ctx context.Context, sc *sidecarClient, t TaskView, timeout time.Duration) (TaskView, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for t.Status == taskPending || t.Status == "" {
		select {
		case <-ctx.Done():
			return t, fmt.Errorf("no answer from callee %s within %s (the sidecar keeps republishing the task %s; kubectl hcp sessions shows it once accepted)", t.CalleeID, timeout, t.MessageID)
		case <-tick.C:
		}
		nt, err := sc.task(ctx, t.MessageID)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			return t, fmt.Errorf("reading task %s from the Caller sidecar: %w", t.MessageID, err)
		}
		t = nt
	}
	return t, nil
}

// forwardToCaller port-forwards to the sidecar of a Ready pod of the Caller.
func forwardToCaller(ctx context.Context, env *Env, name string) (*forward, *corev1.Pod, error) {
	c, ns, err := env.clientAndNamespace()
	if err != nil {
		return nil, nil, err
	}
	caller := &hcpv1alpha1.Caller{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, caller); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, fmt.Errorf("no Caller %q in namespace %s (kubectl get callers -n %s)", name, ns, ns)
		}
		return nil, nil, apiError("reading Caller "+name, err)
	}
	if caller.Spec.Harness == nil {
		return nil, nil, fmt.Errorf("the Caller %s is external (no spec.harness): it has no sidecar in the cluster to submit through; use its credentials Secret %q from your program, or --sidecar-url", name, caller.Status.CredentialsSecret)
	}
	pod, err := readyPod(ctx, c, ns, client.MatchingLabels{hcpv1alpha1.LabelCaller: name, hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue})
	if err != nil {
		return nil, nil, fmt.Errorf("the Caller %s: %w", name, err)
	}
	cfg, err := env.restConfig()
	if err != nil {
		return nil, nil, err
	}
	f, err := portForward(ctx, cfg, pod, sidecarPort(pod))
	if err != nil {
		return nil, nil, fmt.Errorf("%w; a cluster whose nodes do not serve port-forward needs --sidecar-url", err)
	}
	return f, pod, nil
}

// readyPod is a Ready, not terminating pod among those sel selects.
func readyPod(ctx context.Context, c client.Reader, ns string, sel client.MatchingLabels) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns), sel); err != nil {
		return nil, apiError("listing pods", err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return p, nil
			}
		}
	}
	return nil, fmt.Errorf("no Ready pod among the %d pods labelled %v in namespace %s", len(pods.Items), map[string]string(sel), ns)
}
