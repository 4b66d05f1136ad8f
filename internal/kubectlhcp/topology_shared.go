package kubectlhcp

import (
	"context"
	"fmt"
	"slices"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// sharedObjects are the Vhost and Exchange objects of the harness's
// (broker, vhost) pair. The operator keeps them in its own namespace (older
// versions kept a copy in each tenant's), labelled with the pair's vhost
// key, which is computed here from the broker reference as the operator
// does. Listed in every namespace; a user who may not gets those of the
// harness's namespace.
func sharedObjects(ctx context.Context, c client.Reader, ref topologyv1beta1.RabbitmqClusterReference, ns, vhost string) ([]TopologyItem, error) {
	spec := hcpv1alpha1.BrokerSpec{Vhost: vhost}
	var b resource.Broker
	if ref.ConnectionSecret != nil {
		sns := ns
		if ref.Namespace != "" {
			sns = ref.Namespace
		}
		secret := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: sns, Name: ref.ConnectionSecret.Name}, secret); err != nil {
			return []TopologyItem{{What: whatExchange, BrokerName: "hcp.commands, hcp.events", Ready: "unknown", Details: "the connection Secret that names the broker cannot be read: " + oneLine(err.Error(), 120)}}, nil
		}
		var err error
		if b, err = resource.BrokerFromConnectionSecret(ref, spec, secret); err != nil {
			return []TopologyItem{{What: whatExchange, BrokerName: "hcp.commands, hcp.events", Ready: "unknown", Details: oneLine(err.Error(), 160)}}, nil
		}
	} else {
		b = resource.BrokerFromCluster(ref, spec, ns)
	}
	sel := client.MatchingLabels{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue, hcpv1alpha1.LabelVhostKey: b.Key()}
	var exchanges topologyv1beta1.ExchangeList
	var vhosts topologyv1beta1.VhostList
	var policies topologyv1beta1.PolicyList
	// Everywhere, or in ns alone when the user may not list more.
	list := func(l client.ObjectList, kind string) error {
		if err := c.List(ctx, l, sel); err != nil {
			if !apierrors.IsForbidden(err) {
				return apiError("listing rabbitmq.com "+kind, err)
			}
			if err := c.List(ctx, l, sel, client.InNamespace(ns)); err != nil {
				return apiError("listing rabbitmq.com "+kind, err)
			}
		}
		return nil
	}
	if err := list(&exchanges, "Exchanges"); err != nil {
		return nil, err
	}
	if err := list(&vhosts, "Vhosts"); err != nil {
		return nil, err
	}
	if err := list(&policies, "Policies"); err != nil && !isNoKind(err) {
		return nil, err
	}
	var out []TopologyItem
	for _, v := range vhosts.Items {
		out = append(out, TopologyItem{What: "vhost", BrokerName: v.Spec.Name, Object: objectRef("Vhost", v.Namespace, v.Name, ns),
			Ready: readyOf(v.Status.Conditions, v.Generation, v.Status.ObservedGeneration), Details: "deletionPolicy " + orDash(v.Spec.DeletionPolicy)})
	}
	slices.SortFunc(exchanges.Items, func(a, b topologyv1beta1.Exchange) int {
		return strings.Compare(a.Spec.Name+a.Namespace, b.Spec.Name+b.Namespace)
	})
	for _, x := range exchanges.Items {
		out = append(out, TopologyItem{What: whatExchange, BrokerName: x.Spec.Name, Object: objectRef("Exchange", x.Namespace, x.Name, ns),
			Ready: readyOf(x.Status.Conditions, x.Generation, x.Status.ObservedGeneration), Details: x.Spec.Type + ", shared by the vhost"})
	}
	for _, p := range policies.Items {
		out = append(out, TopologyItem{What: "policy", BrokerName: p.Spec.Name, Object: objectRef("Policy", p.Namespace, p.Name, ns),
			Ready: readyOf(p.Status.Conditions, p.Generation, p.Status.ObservedGeneration), Details: policyDetails(p.Spec) + ", shared by the vhost"})
	}
	return out, nil
}

// objectRef is Kind/name, with the namespace when it is not the harness's.
func objectRef(kind, ns, name, home string) string {
	if ns != home {
		return kind + "/" + ns + "/" + name
	}
	return kind + "/" + name
}

func quoteRegex(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// readyOf sums up a topology object's Ready condition, and whether the
// topology operator has seen its latest generation.
func readyOf(conds []topologyv1beta1.Condition, generation, observed int64) string {
	for _, c := range conds {
		if c.Type != "Ready" {
			continue
		}
		s := string(c.Status)
		if c.Status != "True" {
			if c.Reason != "" || c.Message != "" {
				s += " (" + strings.TrimPrefix(c.Reason+": "+oneLine(c.Message, 120), ": ") + ")"
			}
		} else if observed != 0 && observed < generation {
			s += " (generation " + fmt.Sprint(generation) + " not yet reconciled)"
		}
		return s
	}
	return "not reconciled (no Ready condition: is the topology operator running?)"
}
