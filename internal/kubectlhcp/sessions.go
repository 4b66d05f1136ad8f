package kubectlhcp

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// SessionsOptions are the flags of `kubectl hcp sessions`.
type SessionsOptions struct {
	AllNamespaces bool
	Callee        string
	Caller        string
	State         string
	Wide          bool
	// out prints -o json, yaml, name, …; nil or a table format: the table.
	out *outputFlags
}

func newSessionsCommand(env *Env) *cobra.Command {
	var o SessionsOptions
	cmd := &cobra.Command{
		Use:     "sessions",
		Aliases: []string{"session", "hcps"},
		Short:   "List HCP sessions with state, progress, age, duration and last event",
		Example: `  kubectl hcp sessions
  kubectl hcp sessions -A --state RUNNING,PAUSED
  kubectl hcp sessions --callee lab-cvd --caller alpha -o wide
  kubectl hcp sessions -o json | jq -r '.items[] | [.metadata.name, .columns.durationSeconds] | @tsv'
  kubectl hcp sessions -o name`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.out.check(); err != nil {
				return err
			}
			o.Wide = o.out.wide()
			return RunSessions(cmd.Context(), env, o)
		},
	}
	cmd.Flags().BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "list sessions in every namespace")
	cmd.Flags().StringVar(&o.Callee, "callee", "", "only sessions of this callee id")
	cmd.Flags().StringVar(&o.Caller, "caller", "", "only sessions of this caller id")
	cmd.Flags().StringVar(&o.State, "state", "", "only sessions in these states (comma-separated: PENDING, RUNNING, PAUSED, ABORTING, ABORTED, COMPLETED, FAILED, REJECTED)")
	o.out = addOutputFlags(cmd, "also risk, stage, sequence, pod and reason")
	return cmd
}

// RunSessions lists the sessions o selects as a table on env's Out.
func RunSessions(ctx context.Context, env *Env, o SessionsOptions) error {
	states, err := parseStates(o.State)
	if err != nil {
		return &ExitError{Code: ExitFailure, Err: err}
	}
	c, err := env.client()
	if err != nil {
		return err
	}
	sessions, err := listSessions(ctx, env, c, o.AllNamespaces, o.Callee, o.Caller, states)
	if err != nil {
		return err
	}
	if o.out != nil && !o.out.table() {
		obj, err := sessionsObject(sessions, env.now(), o.out.showManagedFields(), o.out.format() == formatName)
		if err != nil {
			return err
		}
		return o.out.print(env.Streams.Out, obj)
	}
	if len(sessions) == 0 {
		where := "in any namespace"
		if !o.AllNamespaces {
			ns, _ := env.namespace()
			where = "in namespace " + ns
		}
		_, _ = fmt.Fprintf(env.Streams.ErrOut, "No sessions found %s%s.\n", where, filterText(o.Callee, o.Caller, states))
		return nil
	}
	return RenderSessions(env.Streams.Out, sessions, env.now(), o.AllNamespaces, o.Wide)
}

func filterText(callee, caller string, states []hcpv1alpha1.SessionState) string {
	var parts []string
	if callee != "" {
		parts = append(parts, "callee "+callee)
	}
	if caller != "" {
		parts = append(parts, "caller "+caller)
	}
	if len(states) > 0 {
		s := make([]string, len(states))
		for i, x := range states {
			s[i] = string(x)
		}
		parts = append(parts, "state "+strings.Join(s, "|"))
	}
	if len(parts) == 0 {
		return ""
	}
	return " matching " + strings.Join(parts, ", ")
}

// listSessions lists sessions of one namespace (or all), by callee and
// caller id (the labels the callee sidecar sets, and the spec, which is
// authoritative), and by state (status.state: the hcp.io/state label is for
// selection only and may lag). Sorted by creation, oldest first.
func listSessions(ctx context.Context, env *Env, c client.Reader, all bool, callee, caller string, states []hcpv1alpha1.SessionState) ([]hcpv1alpha1.HCPSession, error) {
	var opts []client.ListOption
	if !all {
		ns, err := env.namespace()
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.InNamespace(ns))
	}
	labels := client.MatchingLabels{}
	if callee != "" {
		labels[hcpv1alpha1.LabelCalleeID] = callee
	}
	if caller != "" {
		labels[hcpv1alpha1.LabelCallerID] = caller
	}
	if len(labels) > 0 {
		opts = append(opts, labels)
	}
	var list hcpv1alpha1.HCPSessionList
	if err := c.List(ctx, &list, opts...); err != nil {
		return nil, apiError("listing HCPSessions", err)
	}
	out := list.Items[:0]
	for _, hs := range list.Items {
		if callee != "" && hs.Spec.CalleeID != callee || caller != "" && hs.Spec.CallerID != caller {
			continue
		}
		if len(states) > 0 && !slices.Contains(states, stateOf(&hs)) {
			continue
		}
		out = append(out, hs)
	}
	sortSessions(out)
	return out, nil
}

func sortSessions(s []hcpv1alpha1.HCPSession) {
	slices.SortStableFunc(s, func(a, b hcpv1alpha1.HCPSession) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// RenderSessions writes the sessions as kubectl get does: NAME, CALLEE,
// CALLER, CAPABILITY, STATE, PROGRESS, AGE, DURATION, LAST EVENT; with
// allNamespaces a NAMESPACE column first; wide adds RISK, STAGE, SEQ, POD
// and REASON.
func RenderSessions(w io.Writer, sessions []hcpv1alpha1.HCPSession, now time.Time, allNamespaces, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	head := []string{"NAME", "CALLEE", "CALLER", "CAPABILITY", "STATE", "PROGRESS", "AGE", "DURATION", "LAST EVENT"}
	if allNamespaces {
		head = append([]string{"NAMESPACE"}, head...)
	}
	if wide {
		head = append(head, "RISK", "STAGE", "SEQ", "POD", "REASON")
	}
	_, _ = fmt.Fprintln(tw, strings.Join(head, "\t"))
	for i := range sessions {
		hs := &sessions[i]
		row := []string{hs.Name, hs.Spec.CalleeID, hs.Spec.CallerID, hs.Spec.Capability, string(stateOf(hs)),
			percentText(hs.Status.Progress), age(hs.CreationTimestamp.Time, now), sessionDuration(hs, now), lastEvent(hs, now)}
		if allNamespaces {
			row = append([]string{hs.Namespace}, row...)
		}
		if wide {
			stage := ""
			if p := hs.Status.Progress; p != nil {
				stage = p.Stage
			}
			row = append(row, orNone(string(hs.Spec.RiskLevel)), orNone(stage), fmt.Sprint(hs.Status.LastSequence),
				orNone(hs.Status.PodName), orNone(hs.Status.Reason))
		}
		_, _ = fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// percentText is "40%", or "-" before the first progress event.
func percentText(p *hcpv1alpha1.SessionProgress) string {
	if p == nil || p.Percent == nil {
		return "-"
	}
	return fmt.Sprintf("%d%%", *p.Percent)
}

// age is kubectl's short human duration since t ("<unknown>" for zero).
func age(t, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}

// sessionDuration is how long the session ran: from startedAt to
// completedAt, or to now while it runs; "-" when it never started (a
// PENDING or REJECTED session).
func sessionDuration(hs *hcpv1alpha1.HCPSession, now time.Time) string {
	start := hs.Status.StartedAt
	if start == nil {
		return "-"
	}
	end := now
	if hs.Status.CompletedAt != nil {
		end = hs.Status.CompletedAt.Time
	} else if stateOf(hs).IsTerminal() {
		return "-"
	}
	return spanText(end.Sub(start.Time))
}

// spanText is a duration between two API timestamps, which have whole
// seconds: under a second is "<1s", not a made-up number of milliseconds.
func spanText(d time.Duration) string {
	if d < time.Second {
		return "<1s"
	}
	return shortDuration(d)
}

// shortDuration is a duration in at most two units: 850ms, 12s, 2m5s,
// 1h4m, 3d2h.
func shortDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		m, s := int(d.Minutes()), int(d.Seconds())%60
		if s == 0 {
			return fmt.Sprintf("%dm", m)
		}
		return fmt.Sprintf("%dm%ds", m, s)
	case d < 48*time.Hour:
		h, m := int(d.Hours()), int(d.Minutes())%60
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh%dm", h, m)
	default:
		days, h := int(d.Hours())/24, int(d.Hours())%24
		if h == 0 {
			return fmt.Sprintf("%dd", days)
		}
		return fmt.Sprintf("%dd%dh", days, h)
	}
}

// lastEvent is the last event's sequence and how long ago it was
// published: "#14 3s ago"; "-" before the first.
func lastEvent(hs *hcpv1alpha1.HCPSession, now time.Time) string {
	st := hs.Status
	if st.LastSequence == 0 && st.LastEventAt == nil {
		return "-"
	}
	s := fmt.Sprintf("#%d", st.LastSequence)
	if st.LastEventAt != nil {
		s += " " + ago(st.LastEventAt, now)
	}
	return s
}

func ago(t *metav1.Time, now time.Time) string {
	if t == nil {
		return ""
	}
	d := now.Sub(t.Time)
	if d < time.Second {
		return "just now"
	}
	return duration.HumanDuration(d) + " ago"
}
