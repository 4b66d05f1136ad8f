package kubectlhcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// TopologyOptions are the flags of `kubectl hcp topology`.
type TopologyOptions struct {
	// Callee is a Callee's name; Caller a Caller's. Both empty: every
	// Callee and Caller in the namespace.
	Callee, Caller string
	// ManagementURL overrides the management API the connection Secret
	// gives (user:password in it override the Secret's credentials).
	ManagementURL string
	// out prints -o json, yaml, name, …; nil or a table format: the tables.
	out *outputFlags
}

// whatExchange is the What of the shared exchanges' rows.
const whatExchange = "exchange"

func newTopologyCommand(env *Env) *cobra.Command {
	var o TopologyOptions
	cmd := &cobra.Command{
		Use:   "topology [CALLEE]",
		Short: "Show a harness's RabbitMQ topology: vhost, exchanges, queue with depth, binding, user, permissions, and their Ready state",
		Long: `Show what the operator declared on RabbitMQ for a Callee (or, with --caller,
a Caller; with neither, every Callee and Caller in the namespace): the
topology operator's objects (Vhost, Exchanges, Queue, Binding, User,
Permission) with their Ready condition, and the queue's depth and consumers
from the broker's management API when it answers (its URL and credentials
come from the connection Secret the objects reference; --management-url
overrides the URL).`,
		Example: `  kubectl hcp topology lab-cvd
  kubectl hcp topology --caller alpha
  kubectl hcp topology -n lab --management-url http://localhost:15672
  kubectl hcp topology lab-cvd -o json | jq '.items[0].objects[] | select(.ready != "True")'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.out.check(); err != nil {
				return err
			}
			if len(args) > 1 {
				return &ExitError{Code: ExitFailure, Err: errors.New("topology takes at most one CALLEE")}
			}
			if len(args) == 1 {
				if o.Caller != "" {
					return &ExitError{Code: ExitFailure, Err: errors.New("give a CALLEE or --caller, not both")}
				}
				o.Callee = args[0]
			}
			return RunTopology(cmd.Context(), env, o)
		},
	}
	cmd.Flags().StringVar(&o.Caller, "caller", "", "show this Caller's topology instead")
	cmd.Flags().StringVar(&o.ManagementURL, "management-url", "", "the broker's management API (http[s]://[user:password@]host:15672); default the connection Secret's uri")
	o.out = addOutputFlags(cmd, "the same as the default")
	return cmd
}

// HarnessTopology is what the operator declared for one Callee or Caller.
type HarnessTopology struct {
	Kind, Name, Namespace, ID string
	// Vhost, Username and CredentialsSecret are from the object's status.
	Vhost, Username, CredentialsSecret string
	// TopologyReady is the object's TopologyReady condition, if any.
	TopologyReady *metav1.Condition
	// Broker is the broker reference; Management says whether its API
	// answered.
	Broker, Management string
	Items              []TopologyItem
}

// TopologyItem is one topology object.
type TopologyItem struct {
	// What: vhost, exchange, queue, binding, user, permission.
	What string
	// BrokerName is what it is called on the broker.
	BrokerName string
	// Object is kind/name of the topology operator's object.
	Object string
	// Ready is its Ready condition: True, False (reason: message),
	// Unknown, or "not reconciled" without one.
	Ready   string
	Details string
}

// RunTopology shows the topology of the harnesses o selects.
func RunTopology(ctx context.Context, env *Env, o TopologyOptions) error {
	c, ns, err := env.clientAndNamespace()
	if err != nil {
		return err
	}
	var subjects []client.Object
	get := func(obj client.Object, kind, name string) error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
			if apierrors.IsNotFound(err) {
				return &ExitError{Code: ExitFailure, Err: fmt.Errorf("no %s %q in namespace %s (kubectl get %ss -n %s)", kind, name, ns, strings.ToLower(kind), ns)}
			}
			return apiError("reading "+kind+" "+name, err)
		}
		subjects = append(subjects, obj)
		return nil
	}
	switch {
	case o.Callee != "":
		if err := get(&hcpv1alpha1.Callee{}, "Callee", o.Callee); err != nil {
			return err
		}
	case o.Caller != "":
		if err := get(&hcpv1alpha1.Caller{}, "Caller", o.Caller); err != nil {
			return err
		}
	default:
		var callees hcpv1alpha1.CalleeList
		var callers hcpv1alpha1.CallerList
		if err := c.List(ctx, &callees, client.InNamespace(ns)); err != nil {
			return apiError("listing Callees", err)
		}
		if err := c.List(ctx, &callers, client.InNamespace(ns)); err != nil {
			return apiError("listing Callers", err)
		}
		for i := range callees.Items {
			subjects = append(subjects, &callees.Items[i])
		}
		for i := range callers.Items {
			subjects = append(subjects, &callers.Items[i])
		}
		if len(subjects) == 0 && (o.out == nil || o.out.table()) {
			_, _ = fmt.Fprintf(env.Streams.ErrOut, "No Callees or Callers in namespace %s.\n", ns)
			return nil
		}
	}
	if o.out != nil && !o.out.table() {
		return printTopologies(ctx, env, c, subjects, o)
	}
	for i, s := range subjects {
		t, err := gatherTopology(ctx, c, s, o.ManagementURL)
		if err != nil {
			return err
		}
		if i > 0 {
			_, _ = fmt.Fprintln(env.Streams.Out)
		}
		if err := RenderTopology(env.Streams.Out, t); err != nil {
			return err
		}
	}
	return nil
}

// gatherTopology reads a Callee's or Caller's topology objects (its own,
// labelled with it; the shared exchanges and vhost of its vhost on the
// same broker) and, when the management API answers, the queue's depth.
func gatherTopology(ctx context.Context, c client.Reader, obj client.Object, mgmtURL string) (HarnessTopology, error) {
	t := HarnessTopology{Name: obj.GetName(), Namespace: obj.GetNamespace()}
	var conds []metav1.Condition
	switch o := obj.(type) {
	case *hcpv1alpha1.Callee:
		t.Kind, t.ID, t.Vhost, t.Username, t.CredentialsSecret = "Callee", o.ID(), o.Status.Vhost, o.Status.Username, o.Status.CredentialsSecret
		conds = o.Status.Conditions
	case *hcpv1alpha1.Caller:
		t.Kind, t.ID, t.Vhost, t.Username, t.CredentialsSecret = "Caller", o.ID(), o.Status.Vhost, o.Status.Username, o.Status.CredentialsSecret
		conds = o.Status.Conditions
	}
	t.TopologyReady = meta.FindStatusCondition(conds, hcpv1alpha1.ConditionTopologyReady)
	labelKey := hcpv1alpha1.LabelCallee
	if t.Kind == "Caller" {
		labelKey = hcpv1alpha1.LabelCaller
	}
	own := []client.ListOption{client.InNamespace(t.Namespace), client.MatchingLabels{labelKey: resource.LabelValue(t.Name)}}
	var (
		queues      topologyv1beta1.QueueList
		bindings    topologyv1beta1.BindingList
		users       topologyv1beta1.UserList
		permissions topologyv1beta1.PermissionList
		policies    topologyv1beta1.PolicyList
	)
	for _, l := range []struct {
		list client.ObjectList
		kind string
	}{{&queues, "Queues"}, {&bindings, "Bindings"}, {&users, "Users"}, {&permissions, "Permissions"}, {&policies, "Policies"}} {
		if err := c.List(ctx, l.list, own...); err != nil {
			if l.kind == "Policies" && isNoKind(err) {
				continue // a topology operator without the Policy kind
			}
			return t, apiError("listing rabbitmq.com "+l.kind, err)
		}
	}
	// The broker: what the harness's own objects reference.
	var ref *topologyv1beta1.RabbitmqClusterReference
	switch {
	case len(queues.Items) > 0:
		ref = &queues.Items[0].Spec.RabbitmqClusterReference
	case len(users.Items) > 0:
		ref = &users.Items[0].Spec.RabbitmqClusterReference
	}
	if ref != nil {
		shared, err := sharedObjects(ctx, c, *ref, t.Namespace, t.Vhost)
		if err != nil {
			return t, err
		}
		t.Items = append(t.Items, shared...)
	}
	var access brokerAccess
	if ref != nil {
		access = resolveBroker(ctx, c, *ref, t.Namespace, mgmtURL)
		t.Broker = access.Ref
	} else {
		t.Broker = "unknown (no Queue or User object yet)"
	}
	rh, mgmtErr := access.managementClient()
	if ref == nil {
		mgmtErr = errors.New("no broker reference")
	}
	if mgmtErr == nil {
		if _, err := rh.Overview(); err != nil {
			mgmtErr = err
		}
	}
	if mgmtErr != nil {
		t.Management = "unreachable: " + oneLine(mgmtErr.Error(), 200) + " (queue depth unknown)"
	} else {
		t.Management = redactedURL(access.URL) + " answers"
	}
	for _, q := range queues.Items {
		details := q.Spec.Type
		if mgmtErr == nil {
			if qi, err := rh.GetQueue(q.Spec.Vhost, q.Spec.Name); err != nil {
				details += ", depth unknown: " + oneLine(err.Error(), 120)
			} else {
				details += fmt.Sprintf(", %d messages (%d ready, %d unacked), %d consumers", qi.Messages, qi.MessagesReady, qi.MessagesUnacknowledged, qi.Consumers)
			}
		}
		t.Items = append(t.Items, TopologyItem{What: "queue", BrokerName: q.Spec.Name, Object: "Queue/" + q.Name,
			Ready: readyOf(q.Status.Conditions, q.Generation, q.Status.ObservedGeneration), Details: details})
	}
	for _, b := range bindings.Items {
		t.Items = append(t.Items, TopologyItem{What: "binding", BrokerName: b.Spec.Source + " → " + b.Spec.Destination, Object: "Binding/" + b.Name,
			Ready: readyOf(b.Status.Conditions, b.Generation, b.Status.ObservedGeneration), Details: "routing key " + b.Spec.RoutingKey})
	}
	for _, u := range users.Items {
		name := u.Status.Username
		if name == "" {
			name = t.Username
		}
		details := "credentials Secret " + orDash(t.CredentialsSecret)
		if len(u.Spec.Tags) > 0 {
			tags := make([]string, len(u.Spec.Tags))
			for i, tg := range u.Spec.Tags {
				tags[i] = string(tg)
			}
			details += ", tags " + strings.Join(tags, ",")
		} else {
			details += ", no tags"
		}
		t.Items = append(t.Items, TopologyItem{What: "user", BrokerName: name, Object: "User/" + u.Name,
			Ready: readyOf(u.Status.Conditions, u.Generation, u.Status.ObservedGeneration), Details: details})
	}
	for _, p := range permissions.Items {
		user := p.Spec.User
		if user == "" {
			user = t.Username
		}
		perms := p.Spec.Permissions
		t.Items = append(t.Items, TopologyItem{What: "permission", BrokerName: user + " on " + p.Spec.Vhost, Object: "Permission/" + p.Name,
			Ready:   readyOf(p.Status.Conditions, p.Generation, p.Status.ObservedGeneration),
			Details: fmt.Sprintf("configure %s, write %s, read %s", quoteRegex(perms.Configure), quoteRegex(perms.Write), quoteRegex(perms.Read))})
	}
	for _, p := range policies.Items {
		t.Items = append(t.Items, TopologyItem{What: "policy", BrokerName: p.Spec.Name, Object: "Policy/" + p.Name,
			Ready: readyOf(p.Status.Conditions, p.Generation, p.Status.ObservedGeneration), Details: policyDetails(p.Spec)})
	}
	return t, nil
}

// policyDetails is a Policy's pattern, target and definition, keys sorted.
func policyDetails(p topologyv1beta1.PolicySpec) string {
	s := "pattern " + p.Pattern
	if p.ApplyTo != "" {
		s += " on " + p.ApplyTo
	}
	if p.Definition != nil {
		var def map[string]any
		if err := json.Unmarshal(p.Definition.Raw, &def); err == nil && len(def) > 0 {
			parts := make([]string, 0, len(def))
			for _, k := range slices.Sorted(maps.Keys(def)) {
				parts = append(parts, fmt.Sprintf("%s=%v", k, def[k]))
			}
			s += ": " + strings.Join(parts, ", ")
		}
	}
	return s
}

// RenderTopology writes one harness's topology.
func RenderTopology(w io.Writer, t HarnessTopology) error {
	head := fmt.Sprintf("%s %s/%s (id %s)", t.Kind, t.Namespace, t.Name, orDash(t.ID))
	if c := t.TopologyReady; c != nil {
		head += fmt.Sprintf(": TopologyReady=%s", c.Status)
		if c.Reason != "" {
			head += " (" + c.Reason + ")"
		}
	} else {
		head += ": no TopologyReady condition yet"
	}
	_, _ = fmt.Fprintln(w, head)
	if c := t.TopologyReady; c != nil && c.Status != metav1.ConditionTrue && c.Message != "" {
		_, _ = fmt.Fprintf(w, "  %s\n", oneLine(c.Message, 300))
	}
	_, _ = fmt.Fprintf(w, "  vhost %s, broker %s\n", orDash(t.Vhost), t.Broker)
	_, _ = fmt.Fprintf(w, "  management API: %s\n", t.Management)
	if len(t.Items) == 0 {
		_, _ = fmt.Fprintln(w, "  no topology objects (the operator has not declared any yet)")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "  KIND\tNAME ON THE BROKER\tOBJECT\tREADY\tDETAILS")
	for _, it := range t.Items {
		_, _ = fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", it.What, it.BrokerName, it.Object, it.Ready, it.Details)
	}
	return tw.Flush()
}
