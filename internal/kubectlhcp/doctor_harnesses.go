package kubectlhcp

import (
	"context"
	"fmt"
	"slices"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// harnesses checks each broker the Callees and Callers use, their
// credentials Secrets, and that each Callee has a policy.
func (d *doctor) harnesses(ctx context.Context) []Check {
	var inNS []client.ListOption
	where := "in every namespace"
	if d.ns != "" {
		inNS = append(inNS, client.InNamespace(d.ns))
		where = "in namespace " + d.ns
	}
	var callees hcpv1alpha1.CalleeList
	var callers hcpv1alpha1.CallerList
	if err := d.c.List(ctx, &callees, inNS...); err != nil {
		return []Check{{Name: checkHarnesses, Status: CheckFail, Detail: "cannot list Callees: " + err.Error()}}
	}
	if err := d.c.List(ctx, &callers, inNS...); err != nil {
		return []Check{{Name: checkHarnesses, Status: CheckFail, Detail: "cannot list Callers: " + err.Error()}}
	}
	if len(callees.Items)+len(callers.Items) == 0 {
		return []Check{{Name: checkHarnesses, Status: CheckWarn, Detail: "no Callees or Callers " + where + ": nothing to check the broker and credentials with",
			Fix: "apply one (kubectl apply -k config/samples), or run kubectl hcp doctor -A"}}
	}
	var out []Check

	// Brokers: the references of the harnesses' own topology objects.
	var queues topologyv1beta1.QueueList
	if err := d.c.List(ctx, &queues, append([]client.ListOption{client.MatchingLabels{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue}}, inNS...)...); err != nil {
		out = append(out, Check{Name: "broker", Status: CheckFail, Detail: "cannot list Queues: " + err.Error()})
	} else {
		seen := map[string]bool{}
		for _, q := range queues.Items {
			ref := q.Spec.RabbitmqClusterReference
			k := refString(ref, q.Namespace)
			if seen[k] {
				continue
			}
			seen[k] = true
			out = append(out, d.broker(ctx, ref, q.Namespace, q.Spec.Vhost)...)
		}
		if len(seen) == 0 {
			out = append(out, Check{Name: "broker", Status: CheckFail, Detail: "the Callees and Callers " + where + " have no Queue objects: the operator declared no topology",
				Fix: "kubectl describe callee shows the Ready condition's reason (BrokerNotConfigured, BrokerSecretNotFound…)"})
		}
	}

	// Credentials Secrets.
	var problems, fine []string
	secretOK := func(ns, name string, keys ...string) string {
		if name == "" {
			return "no credentials Secret in its status yet"
		}
		s := &corev1.Secret{}
		if err := d.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
			return "Secret " + name + ": " + err.Error()
		}
		var missing []string
		for _, k := range keys {
			if len(s.Data[k]) == 0 {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			return "Secret " + name + " lacks " + strings.Join(missing, ", ")
		}
		return ""
	}
	keys := []string{resource.CredentialsUsernameKey, resource.CredentialsPasswordKey, resource.CredentialsURIKey}
	for i := range callees.Items {
		c := &callees.Items[i]
		id := "Callee " + c.Namespace + "/" + c.Name
		if p := secretOK(c.Namespace, c.Status.CredentialsSecret, keys...); p != "" {
			problems = append(problems, id+": "+p)
		} else if p := secretOK(c.Namespace, c.Status.CredentialsSecret, resource.TokenPrivateKeyKey, resource.TokenVerifyKeysKey); p != "" {
			problems = append(problems, id+": session-token key: "+p)
		} else {
			fine = append(fine, id)
		}
	}
	for i := range callers.Items {
		c := &callers.Items[i]
		id := "Caller " + c.Namespace + "/" + c.Name
		if p := secretOK(c.Namespace, c.Status.CredentialsSecret, keys...); p != "" {
			problems = append(problems, id+": "+p)
		} else {
			fine = append(fine, id)
		}
	}
	if len(problems) > 0 {
		out = append(out, Check{Name: "credentials Secrets", Status: CheckFail, Detail: strings.Join(problems, "; "),
			Fix: "the operator creates them: kubectl describe the Callee or Caller (its Ready condition) and read the manager's log"})
	} else {
		out = append(out, Check{Name: "credentials Secrets", Status: CheckOK, Detail: fmt.Sprintf("present with username, password and uri for %s (%s)", plural(len(fine), "harness", "harnesses"), strings.Join(firstN(fine, 4), ", "))})
	}

	// Policies: default deny, so a Callee no policy selects runs nothing.
	var policies hcpv1alpha1.CapabilityPolicyList
	if err := d.c.List(ctx, &policies, inNS...); err == nil {
		var unmatched []string
		for i := range callees.Items {
			c := &callees.Items[i]
			matched := slices.ContainsFunc(policies.Items, func(p hcpv1alpha1.CapabilityPolicy) bool {
				return p.Namespace == c.Namespace && slices.Contains(p.Status.MatchedCallees, c.ID())
			})
			if !matched {
				unmatched = append(unmatched, c.Namespace+"/"+c.Name)
			}
		}
		if len(unmatched) > 0 {
			out = append(out, Check{Name: checkPolicies, Status: CheckWarn, Detail: "no CapabilityPolicy selects Callee " + strings.Join(unmatched, ", ") + ": every task for it is rejected not_authorized (default deny)",
				Fix: "apply a CapabilityPolicy whose calleeSelector matches it (docs/policy.md)"})
		} else if len(callees.Items) > 0 {
			out = append(out, Check{Name: checkPolicies, Status: CheckOK, Detail: fmt.Sprintf("every Callee is selected by a CapabilityPolicy (%s)", plural(len(policies.Items), "policy", "policies"))})
		}
	}
	return out
}
