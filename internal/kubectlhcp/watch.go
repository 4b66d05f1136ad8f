package kubectlhcp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// WatchOptions are the flags of `kubectl hcp watch`.
type WatchOptions struct {
	// Session to watch (a name or an unambiguous prefix); empty with All.
	Session string
	// All follows every running session (and those that start meanwhile)
	// in the namespace, or in every namespace with AllNamespaces.
	All           bool
	AllNamespaces bool
	Callee        string
	Caller        string
	// Plain forces plain lines even on a terminal.
	Plain bool
	// Timeout bounds the watch; 0 waits as long as it takes.
	Timeout time.Duration
}

func newWatchCommand(env *Env) *cobra.Command {
	var o WatchOptions
	cmd := &cobra.Command{
		Use:   "watch (SESSION | --all)",
		Short: "Follow sessions live: a progress bar each, state changes as they happen; exit with the outcome",
		Long: `Follow one session (or, with --all, every running session and those that
start meanwhile) through a watch on the API server: a progress bar per
session and each state change as it happens. When stdout is not a terminal,
or with --plain, one line per change instead.

The exit code is the session's outcome: 0 COMPLETED, 2 FAILED, 3 ABORTED,
4 REJECTED, 5 deleted before it ended, 6 --timeout passed, 1 an error.
With --all, the largest code among the sessions followed.`,
		Example: `  kubectl hcp watch 4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10
  kubectl hcp watch 4b1c            # a unique prefix of the name is enough
  kubectl hcp watch --all -A
  kubectl hcp watch 4b1c --plain --timeout 10m | tee session.log`,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case o.All && len(args) > 0:
				return &ExitError{Code: ExitFailure, Err: errors.New("give a SESSION or --all, not both")}
			case !o.All && len(args) != 1:
				return &ExitError{Code: ExitFailure, Err: errors.New("give one SESSION (kubectl hcp sessions lists them), or --all")}
			case len(args) == 1:
				o.Session = args[0]
			}
			if !o.All && (o.AllNamespaces || o.Callee != "" || o.Caller != "") {
				return &ExitError{Code: ExitFailure, Err: errors.New("-A, --callee and --caller go with --all")}
			}
			return RunWatch(cmd.Context(), env, o)
		},
	}
	cmd.Flags().BoolVar(&o.All, "all", false, "follow every running session, and those that start while watching")
	cmd.Flags().BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "with --all: in every namespace")
	cmd.Flags().StringVar(&o.Callee, "callee", "", "with --all: only sessions of this callee id")
	cmd.Flags().StringVar(&o.Caller, "caller", "", "with --all: only sessions of this caller id")
	cmd.Flags().BoolVar(&o.Plain, "plain", false, "plain lines instead of progress bars, even on a terminal")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", 0, "give up after this long (exit code 6); 0: no limit")
	return cmd
}

// RunWatch follows the sessions o names until they end, and returns an
// *ExitError with their outcome (nil for COMPLETED).
func RunWatch(ctx context.Context, env *Env, o WatchOptions) error {
	c, err := env.client()
	if err != nil {
		return err
	}
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	var v view
	if o.Plain || !env.terminal() {
		v = &plainView{w: env.Streams.Out, now: env.now}
	} else {
		v = newBarView(env.Streams.Out, env.now)
	}
	w := &watcher{env: env, c: c, v: v, seen: map[string]*hcpv1alpha1.HCPSession{}, codes: map[string]int{}, ended: map[string]bool{}}
	code, err := w.run(ctx, o)
	v.close()
	if err != nil {
		return err
	}
	return exitWith(code)
}

// watcher follows sessions through one watch on the API server.
type watcher struct {
	env *Env
	c   client.WithWatch
	v   view
	// seen is the last version of each session followed; codes the outcome
	// of those that ended.
	seen  map[string]*hcpv1alpha1.HCPSession
	codes map[string]int
	// ended (--all) are the sessions that had ended when the watch began:
	// never shown, even when their status changes later (the caller's
	// acknowledgements are written after the end).
	ended map[string]bool
}

func (w *watcher) run(ctx context.Context, o WatchOptions) (int, error) {
	listOpts, match, err := w.scope(ctx, o)
	if err != nil {
		return ExitFailure, err
	}
	first := true
	for {
		// (Re)list: the current versions, and the resourceVersion to watch
		// from. Relisting after a broken watch catches up with what it
		// missed (a session that ended or went meanwhile).
		var list hcpv1alpha1.HCPSessionList
		if err := w.c.List(ctx, &list, listOpts...); err != nil {
			if ctx.Err() != nil {
				return w.timedOut(ctx)
			}
			return ExitFailure, apiError("listing HCPSessions", err)
		}
		present := map[string]bool{}
		items := list.Items
		sortSessions(items)
		for i := range items {
			hs := &items[i]
			if !match(hs) {
				continue
			}
			present[key(hs)] = true
			// --all follows sessions running when it starts, and every
			// session that appears later.
			if first && o.All && stateOf(hs).IsTerminal() {
				w.ended[key(hs)] = true
			}
			w.observe(hs)
		}
		for k, hs := range w.seen {
			if _, ended := w.codes[k]; !ended && !present[k] {
				w.gone(hs)
			}
		}
		if first && !o.All && len(w.seen) == 0 {
			return ExitFailure, fmt.Errorf("HCPSession %s disappeared", o.Session)
		}
		if first && o.All && len(w.seen) == 0 {
			w.v.note("No running sessions" + filterText(o.Callee, o.Caller, nil) + "; nothing to watch.")
			return ExitOK, nil
		}
		first = false
		if w.done() {
			return w.code(), nil
		}
		code, again, err := w.follow(ctx, &list, listOpts, match)
		if err != nil || !again {
			return code, err
		}
	}
}

// scope is what the watch lists and which sessions it follows: one
// session (by name, resolved from a prefix), or with All every session of
// the namespace (or all namespaces), narrowed by callee and caller.
func (w *watcher) scope(ctx context.Context, o WatchOptions) ([]client.ListOption, func(*hcpv1alpha1.HCPSession) bool, error) {
	var (
		listOpts []client.ListOption
		ns       string
		err      error
	)
	if !o.AllNamespaces {
		if ns, err = w.env.namespace(); err != nil {
			return nil, nil, err
		}
		listOpts = append(listOpts, client.InNamespace(ns))
	}
	if !o.All {
		hs, err := getSession(ctx, w.c, ns, o.Session)
		if err != nil {
			return nil, nil, err
		}
		name := hs.Name
		listOpts = append(listOpts, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", name)})
		return listOpts, func(hs *hcpv1alpha1.HCPSession) bool { return hs.Name == name }, nil
	}
	labels := client.MatchingLabels{}
	if o.Callee != "" {
		labels[hcpv1alpha1.LabelCalleeID] = o.Callee
	}
	if o.Caller != "" {
		labels[hcpv1alpha1.LabelCallerID] = o.Caller
	}
	if len(labels) > 0 {
		listOpts = append(listOpts, labels)
	}
	return listOpts, func(hs *hcpv1alpha1.HCPSession) bool {
		return (o.Callee == "" || hs.Spec.CalleeID == o.Callee) && (o.Caller == "" || hs.Spec.CallerID == o.Caller)
	}, nil
}

// follow consumes one watch from list's resourceVersion. again: the watch
// ended early (expired, closed by the server) and must be re-listed.
func (w *watcher) follow(ctx context.Context, list *hcpv1alpha1.HCPSessionList, listOpts []client.ListOption, match func(*hcpv1alpha1.HCPSession) bool) (code int, again bool, err error) {
	opts := append([]client.ListOption{&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true}}}, listOpts...)
	wi, err := w.c.Watch(ctx, &hcpv1alpha1.HCPSessionList{}, opts...)
	if err != nil {
		if ctx.Err() != nil {
			code, err := w.timedOut(ctx)
			return code, false, err
		}
		return ExitFailure, false, apiError("watching HCPSessions", err)
	}
	defer wi.Stop()
	for {
		select {
		case <-ctx.Done():
			code, err := w.timedOut(ctx)
			return code, false, err
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return 0, true, nil
			}
			switch ev.Type {
			case watch.Error:
				if st, ok := ev.Object.(*metav1.Status); ok && st.Code == 410 {
					return 0, true, nil // expired: relist
				}
				return ExitFailure, false, fmt.Errorf("watching HCPSessions: %v", apierrors.FromObject(ev.Object))
			case watch.Bookmark:
				continue
			}
			hs, ok := ev.Object.(*hcpv1alpha1.HCPSession)
			if !ok || !match(hs) {
				continue
			}
			if ev.Type == watch.Deleted {
				if prev, followed := w.seen[key(hs)]; followed {
					if _, ended := w.codes[key(hs)]; !ended {
						w.gone(prev)
					}
				}
			} else {
				w.observe(hs)
			}
			if w.done() {
				return w.code(), false, nil
			}
		}
	}
}

func key(hs *hcpv1alpha1.HCPSession) string { return hs.Namespace + "/" + hs.Name }

// observe shows a version of a session.
func (w *watcher) observe(hs *hcpv1alpha1.HCPSession) {
	k := key(hs)
	if _, ended := w.codes[k]; ended || w.ended[k] {
		return
	}
	prev, known := w.seen[k]
	hs = hs.DeepCopy()
	w.seen[k] = hs
	if !known {
		w.v.add(hs)
		if !stateOf(hs).IsTerminal() {
			return
		}
	} else if changes := diffSession(prev, hs, w.env.now()); len(changes) > 0 {
		w.v.update(hs, changes)
	}
	if s := stateOf(hs); s.IsTerminal() {
		w.codes[k] = outcomeCode(s)
		w.v.end(hs, false)
	}
}

func (w *watcher) gone(hs *hcpv1alpha1.HCPSession) {
	w.codes[key(hs)] = ExitGone
	w.v.end(hs, true)
}

// done: every session followed has ended.
func (w *watcher) done() bool {
	return len(w.seen) > 0 && len(w.codes) == len(w.seen)
}

// code is the largest outcome code of the sessions followed.
func (w *watcher) code() int {
	code := ExitOK
	for _, c := range w.codes {
		code = max(code, c)
	}
	return code
}

func (w *watcher) timedOut(ctx context.Context) (int, error) {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		var running []string
		for k, hs := range w.seen {
			if _, ended := w.codes[k]; !ended {
				running = append(running, fmt.Sprintf("%s %s", hs.Name, stateOf(hs)))
			}
		}
		w.v.note(fmt.Sprintf("timed out; still running: %v", running))
		return ExitTimeout, nil
	}
	return ExitFailure, ctx.Err()
}
