package kubectlhcp

import (
	"context"
	"fmt"
	"slices"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// kubectl hcp describe, by file:
//
//	describe.go           the command; what it reads of a session
//	describe_timeline.go  the session's timeline, from its status and Events
//	describe_decision.go  the L3 decision, from its status and Events
//	describe_render.go    the description printed as kubectl describe does

// annotationDecidingPod is the callee sidecar's annotation naming the pod
// that decided the task (internal/sidecar/callee.AnnotationDecidingPod;
// the plugin does not import the sidecar).
const annotationDecidingPod = "hcp.io/deciding-pod"

// reasonAccepted is status.reason when the gate admitted the task.
const reasonAccepted = "accepted"

func newDescribeCommand(env *Env) *cobra.Command {
	var out *outputFlags
	cmd := &cobra.Command{
		Use:   "describe SESSION",
		Short: "Show a session: its timeline, the L3 decision that admitted it, the owning pod, its Events",
		Example: `  kubectl hcp describe 4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10
  kubectl hcp describe 4b1c -n lab
  kubectl hcp describe 4b1c -o json | jq .decision`,
		Args: oneSession,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.check(); err != nil {
				return err
			}
			return RunDescribe(cmd.Context(), env, args[0], out)
		},
	}
	out = addOutputFlags(cmd, "the same as the default")
	return cmd
}

// oneSession is cobra.ExactArgs(1) with an error that says what is
// missing: the session.
func oneSession(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return &ExitError{Code: ExitFailure, Err: fmt.Errorf("%s takes SESSION (got %d arguments); see %s --help", cmd.CommandPath(), len(args), cmd.CommandPath())}
	}
	return nil
}

// Description is what describe shows of a session.
type Description struct {
	Session *hcpv1alpha1.HCPSession
	// Pod is the owning pod (status.podName), nil when it is gone or unset;
	// PodErr says why it could not be read.
	Pod    *corev1.Pod
	PodErr string
	// Events are the Kubernetes Events about the session.
	Events []corev1.Event
	// EventsErr says why the Events could not be listed.
	EventsErr string
	// Policies are the CapabilityPolicies that select the session's callee
	// now (status.matchedCallees): where to look when the admitting rule is
	// no longer recorded.
	Policies []string
}

// RunDescribe shows the session named name; out (nil: the description)
// is -o.
func RunDescribe(ctx context.Context, env *Env, name string, out *outputFlags) error {
	c, ns, err := env.clientAndNamespace()
	if err != nil {
		return err
	}
	hs, err := getSession(ctx, c, ns, name)
	if err != nil {
		return &ExitError{Code: ExitFailure, Err: err}
	}
	if out != nil && out.format() == formatName {
		obj, err := apiObject(hs, false)
		if err != nil {
			return err
		}
		return out.print(env.Streams.Out, obj)
	}
	d := Description{Session: hs}
	if pod := hs.Status.PodName; pod != "" {
		p := &corev1.Pod{}
		switch err := c.Get(ctx, client.ObjectKey{Namespace: hs.Namespace, Name: pod}, p); {
		case err == nil:
			d.Pod = p
		case apierrors.IsNotFound(err):
			d.PodErr = "gone"
		default:
			d.PodErr = err.Error()
		}
	}
	var policies hcpv1alpha1.CapabilityPolicyList
	if err := c.List(ctx, &policies, client.InNamespace(hs.Namespace)); err == nil {
		for _, p := range policies.Items {
			if slices.Contains(p.Status.MatchedCallees, hs.Spec.CalleeID) {
				d.Policies = append(d.Policies, p.Name)
			}
		}
	}
	var events corev1.EventList
	if err := c.List(ctx, &events, client.InNamespace(hs.Namespace), client.MatchingFieldsSelector{Selector: fields.AndSelectors(
		fields.OneTermEqualSelector("involvedObject.name", hs.Name),
		fields.OneTermEqualSelector("involvedObject.kind", "HCPSession"),
	)}); err != nil {
		d.EventsErr = err.Error()
	} else {
		for _, e := range events.Items {
			if e.InvolvedObject.UID == "" || e.InvolvedObject.UID == hs.UID {
				d.Events = append(d.Events, e)
			}
		}
	}
	if out != nil && !out.table() {
		obj, err := descriptionObject(d, env.now(), out.showManagedFields())
		if err != nil {
			return err
		}
		return out.print(env.Streams.Out, obj)
	}
	return RenderDescription(env.Streams.Out, d, env.now())
}
