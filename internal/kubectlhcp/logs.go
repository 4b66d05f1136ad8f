package kubectlhcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/internal/resource"
)

// kubectl hcp logs, by file:
//
//	logs.go         the command; the container; pods/log through client-go
//	logs_plan.go    which pod's log to show and from when (pure)
//	logs_follow.go  -f: the session's watch and the streams, one at a time

// annotationDefaultContainer is kubectl's annotation naming a pod's
// default container (kubectl logs, exec).
const annotationDefaultContainer = "kubectl.kubernetes.io/default-container"

// LogsOptions are the flags of `kubectl hcp logs`.
type LogsOptions struct {
	Session string
	// Follow follows the session until it ends, across handovers.
	Follow bool
	// Container overrides the harness container (-c hcp-sidecar: the
	// sidecar's log).
	Container  string
	Timestamps bool
	// Prefix prefixes each line with [pod/container].
	Prefix bool
	// Tail: the last lines of the first pod's log (-1: all since the
	// session arrived there).
	Tail int64
	// HandoverGrace bounds how long the log of a pod the session left is
	// still shown (it ends by itself when the pod's container exits).
	HandoverGrace time.Duration
}

// LogSource streams a container's log, each line prefixed with its
// RFC 3339 time and a space (pods/log with timestamps=true). Env.Logs;
// the API server's when nil.
type LogSource interface {
	Logs(ctx context.Context, namespace, pod, container string, o LogRequest) (io.ReadCloser, error)
}

// LogRequest is what is asked of a LogSource.
type LogRequest struct {
	// Since: from this time (zero: all the container kept); the API
	// takes whole seconds.
	Since  time.Time
	Follow bool
	// Tail, when set, is the number of last lines.
	Tail *int64
}

func newLogsCommand(env *Env) *cobra.Command {
	o := LogsOptions{Tail: -1}
	cmd := &cobra.Command{
		Use:   "logs SESSION [-f]",
		Short: "Print the log of the harness running a session; with -f follow it across handovers until it ends",
		Long: `Print the log of the harness container of the pod running the session
(status.podName), from when the session arrived on that pod. With -f,
follow it: when a drain or a lost replica moves the session to another pod,
the old pod's log is shown to its end and the new pod's follows, from when
the session arrived there; the command ends when the session does.

The harness container is the pod's kubectl.kubernetes.io/default-container,
else its first container (the hcp-sidecar is an init container); -c picks
another (-c hcp-sidecar: the sidecar's log). A pod runs several sessions at
once: their lines are all shown.`,
		Example: `  kubectl hcp logs 4b1c
  kubectl hcp logs -f 4b1c --prefix
  kubectl hcp logs 4b1c -c hcp-sidecar --tail 50`,
		Args: oneSession,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Session = args[0]
			return RunLogs(cmd.Context(), env, o)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&o.Follow, "follow", "f", false, "follow the session's log across handovers until the session ends")
	f.StringVarP(&o.Container, "container", "c", "", "the container (default: the harness's)")
	f.BoolVar(&o.Timestamps, "timestamps", false, "prefix each line with its time (RFC 3339, the node's clock)")
	f.BoolVar(&o.Prefix, "prefix", false, "prefix each line with [pod/container]")
	f.Int64Var(&o.Tail, "tail", -1, "the last lines of the first pod's log only (-1: all since the session arrived)")
	f.DurationVar(&o.HandoverGrace, "handover-grace", time.Minute, "with -f: how long the log of a pod the session left is still shown")
	return cmd
}

// RunLogs prints (or with Follow, follows) a session's harness log.
func RunLogs(ctx context.Context, env *Env, o LogsOptions) error {
	c, ns, err := env.clientAndNamespace()
	if err != nil {
		return err
	}
	hs, err := getSession(ctx, c, ns, o.Session)
	if err != nil {
		return &ExitError{Code: ExitFailure, Err: err}
	}
	src, err := env.logSource()
	if err != nil {
		return err
	}
	if o.HandoverGrace <= 0 {
		o.HandoverGrace = time.Minute
	}
	f := &logFollower{env: env, c: c, src: src, o: o, ns: hs.Namespace, name: hs.Name}
	if o.Follow && !stateOf(hs).IsTerminal() {
		return f.follow(ctx, hs)
	}
	t := firstTarget(hs)
	if t.Pod == "" {
		return &ExitError{Code: ExitFailure, Err: fmt.Errorf("session %s is %s and no pod owns it now (kubectl hcp logs -f waits for one)", hs.Name, stateText(hs))}
	}
	s := f.open(ctx, t, time.Time{}, false, tailOf(o.Tail))
	<-s.ended
	if s.err != nil {
		return &ExitError{Code: ExitFailure, Err: s.err}
	}
	return nil
}

func tailOf(n int64) *int64 {
	if n < 0 {
		return nil
	}
	return &n
}

func (e *Env) logSource() (LogSource, error) {
	if e.Logs != nil {
		return e.Logs, nil
	}
	cfg, err := e.restConfig()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to the API server: %w", err)
	}
	e.Logs = apiLogs{cs}
	return e.Logs, nil
}

// apiLogs is pods/log through the API server, as kubectl logs does.
type apiLogs struct{ cs kubernetes.Interface }

func (a apiLogs) Logs(ctx context.Context, ns, pod, container string, o LogRequest) (io.ReadCloser, error) {
	opts := &corev1.PodLogOptions{Container: container, Follow: o.Follow, Timestamps: true, TailLines: o.Tail}
	if !o.Since.IsZero() {
		opts.SinceTime = &metav1.Time{Time: o.Since}
	}
	return a.cs.CoreV1().Pods(ns).GetLogs(pod, opts).Stream(ctx)
}

// harnessContainer is the container of pod whose log to show: want if
// set (a container or init container of the pod), else the pod's
// kubectl.kubernetes.io/default-container, else its first container.
func harnessContainer(pod *corev1.Pod, want string) (string, error) {
	names := make([]string, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		names = append(names, c.Name)
	}
	if want != "" {
		if !slices.Contains(names, want) {
			return "", fmt.Errorf("pod %s has no container %q (it has %s)", pod.Name, want, strings.Join(names, ", "))
		}
		return want, nil
	}
	if d := pod.Annotations[annotationDefaultContainer]; d != "" && slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == d }) {
		return d, nil
	}
	for _, c := range pod.Spec.Containers {
		if c.Name != resource.SidecarContainerName {
			return c.Name, nil
		}
	}
	return "", fmt.Errorf("pod %s has no harness container", pod.Name)
}

// logStream is one pod's log being shown.
type logStream struct {
	target logTarget
	cancel context.CancelFunc
	ended  chan struct{}
	// last is the time of the last line shown (after ended).
	last time.Time
	err  error
}

// open shows target's log in the background, lines after `after` only
// (a reopened stream skips what it showed).
func (f *logFollower) open(ctx context.Context, t logTarget, after time.Time, follow bool, tail *int64) *logStream {
	ctx, cancel := context.WithCancel(ctx)
	s := &logStream{target: t, cancel: cancel, ended: make(chan struct{}), last: after}
	go func() {
		defer close(s.ended)
		defer cancel()
		s.err = f.copyLog(ctx, s, follow, tail)
		if ctx.Err() != nil {
			s.err = nil // cut short on purpose
		}
	}()
	return s
}

func (f *logFollower) copyLog(ctx context.Context, s *logStream, follow bool, tail *int64) error {
	pod := &corev1.Pod{}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: s.target.Pod}, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("pod %s is gone, and its log with it", s.target.Pod)
		}
		return apiError("reading pod "+s.target.Pod, err)
	}
	container, err := harnessContainer(pod, f.o.Container)
	if err != nil {
		return err
	}
	since := s.target.Since
	if s.last.After(since) {
		since = s.last
	}
	rc, err := f.src.Logs(ctx, f.ns, pod.Name, container, LogRequest{Since: since.Truncate(time.Second), Follow: follow, Tail: tail})
	if err != nil {
		return apiError(fmt.Sprintf("reading the log of %s/%s", pod.Name, container), err)
	}
	defer func() { _ = rc.Close() }()
	lw := lineWriter{out: f.env.Streams.Out, timestamps: f.o.Timestamps, since: s.target.Since, skip: s.last, last: s.last}
	if f.o.Prefix {
		lw.prefix = "[pod/" + pod.Name + "/" + container + "] "
	}
	err = lw.copy(rc)
	s.last = lw.last
	if err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
		return fmt.Errorf("reading the log of %s/%s: %w", pod.Name, container, err)
	}
	return nil
}
