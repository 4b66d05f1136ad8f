package kubectlhcp

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// HarnessTopologyView is what topology -o json|yaml prints for one Callee
// or Caller (cli.hcp.io/v1alpha1, kind HarnessTopology), in a List.
type HarnessTopologyView struct {
	Metadata viewMeta `json:"metadata"`
	// Harness is the Callee or Caller: its kind, name and HCP id.
	Harness struct {
		Kind string `json:"kind"`
		Name string `json:"name"`
		ID   string `json:"id"`
	} `json:"harness"`
	Vhost             string            `json:"vhost,omitempty"`
	Username          string            `json:"username,omitempty"`
	CredentialsSecret string            `json:"credentialsSecret,omitempty"`
	TopologyReady     *metav1.Condition `json:"topologyReady,omitempty"`
	// Broker is the broker reference; Management whether its management
	// API answered ("URL answers", or "unreachable: why").
	Broker     string `json:"broker"`
	Management string `json:"management"`
	// Objects are the table's rows.
	Objects []TopologyObjectView `json:"objects"`
}

// TopologyObjectView is one row: a topology operator object.
type TopologyObjectView struct {
	// What: vhost, exchange, queue, binding, user, permission, policy.
	What       string `json:"what"`
	BrokerName string `json:"brokerName"`
	// Object is Kind/name (Kind/namespace/name outside the harness's
	// namespace).
	Object string `json:"object,omitempty"`
	// Ready: True, or False/Unknown with reason and message, or "not
	// reconciled".
	Ready   string `json:"ready"`
	Details string `json:"details,omitempty"`
}

func topologyView(t HarnessTopology) HarnessTopologyView {
	v := HarnessTopologyView{Metadata: viewMeta{Name: t.Name, Namespace: t.Namespace}, Vhost: t.Vhost, Username: t.Username,
		CredentialsSecret: t.CredentialsSecret, TopologyReady: t.TopologyReady, Broker: t.Broker, Management: t.Management,
		Objects: []TopologyObjectView{}}
	v.Harness.Kind, v.Harness.Name, v.Harness.ID = t.Kind, t.Name, t.ID
	for _, it := range t.Items {
		v.Objects = append(v.Objects, TopologyObjectView(it))
	}
	return v
}

// printTopologies prints the subjects' topologies with -o: a List of
// HarnessTopology, or for -o name the Callees and Callers.
func printTopologies(ctx context.Context, env *Env, c client.Reader, subjects []client.Object, o TopologyOptions) error {
	items := make([]unstructured.Unstructured, 0, len(subjects))
	for _, s := range subjects {
		if o.out.format() == formatName {
			u, err := apiObject(s, false)
			if err != nil {
				return err
			}
			items = append(items, *u)
			continue
		}
		t, err := gatherTopology(ctx, c, s, o.ManagementURL)
		if err != nil {
			return err
		}
		u, err := toObject(topologyView(t), ViewGroupVersion.WithKind("HarnessTopology"))
		if err != nil {
			return err
		}
		items = append(items, *u)
	}
	return o.out.print(env.Streams.Out, list(items))
}
