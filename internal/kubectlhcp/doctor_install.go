package kubectlhcp

import (
	"context"
	"fmt"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// crds checks that group's CRDs exist and are Established.
func (d *doctor) crds(ctx context.Context, name, group string, plurals []string, fix string) Check {
	var missing, notEstablished, ok []string
	for _, p := range plurals {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := d.c.Get(ctx, client.ObjectKey{Name: p + "." + group}, crd); err != nil {
			if apierrors.IsNotFound(err) {
				missing = append(missing, p)
				continue
			}
			return Check{Name: name, Status: CheckFail, Detail: "cannot read CRDs: " + err.Error(), Fix: "needs get on customresourcedefinitions (cluster-scoped)"}
		}
		established := false
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				established = true
			}
		}
		if established {
			ok = append(ok, p)
		} else {
			notEstablished = append(notEstablished, p)
		}
	}
	switch {
	case len(missing) > 0:
		return Check{Name: name, Status: CheckFail, Detail: "missing: " + strings.Join(dotGroup(missing, group), ", "), Fix: fix}
	case len(notEstablished) > 0:
		return Check{Name: name, Status: CheckFail, Detail: "not Established: " + strings.Join(dotGroup(notEstablished, group), ", "),
			Fix: "kubectl describe crd " + notEstablished[0] + "." + group + " says why (a name conflict, an invalid schema)"}
	}
	return Check{Name: name, Status: CheckOK, Detail: strings.Join(ok, ", ") + " established"}
}

func dotGroup(plurals []string, group string) []string {
	out := make([]string, len(plurals))
	for i, p := range plurals {
		out[i] = p + "." + group
	}
	return out
}

// deployments lists the Deployments labelled name in every namespace.
func (d *doctor) deployments(ctx context.Context, labels client.MatchingLabels) ([]appsv1.Deployment, error) {
	var list appsv1.DeploymentList
	if err := d.c.List(ctx, &list, labels); err != nil {
		return nil, err
	}
	return list.Items, nil
}

func available(dep *appsv1.Deployment) string {
	want := int32(1)
	if dep.Spec.Replicas != nil {
		want = *dep.Spec.Replicas
	}
	return fmt.Sprintf("%s/%s %d/%d available", dep.Namespace, dep.Name, dep.Status.AvailableReplicas, want)
}

// operatorLabels select the manager's Deployment (the chart's and
// config/manager's labels).
var operatorLabels = client.MatchingLabels{"app.kubernetes.io/name": "hcp-operator", "app.kubernetes.io/component": "manager"}

// operator checks the hcp-operator manager Deployments, deps (listed with
// operatorLabels; err the list's error).
func operator(deps []appsv1.Deployment, err error) Check {
	const name = "hcp-operator"
	if err != nil {
		return Check{Name: name, Status: CheckFail, Detail: "cannot list Deployments: " + err.Error(), Fix: "needs list on deployments in every namespace"}
	}
	if len(deps) == 0 {
		return Check{Name: name, Status: CheckFail, Detail: "no Deployment labelled app.kubernetes.io/name=hcp-operator, app.kubernetes.io/component=manager",
			Fix: "helm install hcp-operator charts/hcp-operator -n hcp-system --create-namespace (docs/install.md)"}
	}
	var ready, scaled, broken []string
	for i := range deps {
		dep := &deps[i]
		switch {
		case dep.Spec.Replicas != nil && *dep.Spec.Replicas == 0:
			scaled = append(scaled, dep.Namespace+"/"+dep.Name)
		case dep.Status.AvailableReplicas >= 1:
			ready = append(ready, available(dep))
		default:
			broken = append(broken, available(dep))
		}
	}
	switch {
	case len(ready) > 0 && len(broken) == 0:
		detail := strings.Join(ready, "; ")
		if len(scaled) > 0 {
			detail += "; scaled to zero: " + strings.Join(scaled, ", ")
		}
		return Check{Name: name, Status: CheckOK, Detail: detail}
	case len(broken) > 0:
		return Check{Name: name, Status: CheckFail, Detail: strings.Join(broken, "; ") + " (not available)",
			Fix: "kubectl describe deploy -n " + deps[0].Namespace + " and kubectl logs -n " + deps[0].Namespace + " deploy/" + deps[0].Name + " say why"}
	}
	return Check{Name: name, Status: CheckFail, Detail: "scaled to zero: " + strings.Join(scaled, ", "),
		Fix: "kubectl scale deploy -n " + deps[0].Namespace + " " + deps[0].Name + " --replicas=1"}
}

// topologyOperator checks that the messaging-topology-operator runs: its
// Deployment, or (when it runs outside the cluster, as on the local stack)
// the evidence of its work: the operator's topology objects are Ready at
// their current generation.
func (d *doctor) topologyOperator(ctx context.Context) Check {
	const name = "topology operator"
	fix := "install the RabbitMQ messaging-topology-operator (docs/install.md); it declares what the Vhost, Exchange, Queue, Binding, User and Permission objects describe"
	deps, err := d.deployments(ctx, client.MatchingLabels{"app.kubernetes.io/name": "messaging-topology-operator"})
	if err == nil {
		for i := range deps {
			if deps[i].Status.AvailableReplicas >= 1 {
				return Check{Name: name, Status: CheckOK, Detail: available(&deps[i])}
			}
		}
		if len(deps) > 0 {
			return Check{Name: name, Status: CheckFail, Detail: available(&deps[0]) + " (not available)",
				Fix: "kubectl logs -n " + deps[0].Namespace + " deploy/" + deps[0].Name}
		}
	}
	var queues topologyv1beta1.QueueList
	if err := d.c.List(ctx, &queues, client.MatchingLabels{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue}); err != nil {
		return Check{Name: name, Status: CheckFail, Detail: "no Deployment labelled app.kubernetes.io/name=messaging-topology-operator, and Queues cannot be listed: " + err.Error(), Fix: fix}
	}
	current, stale := 0, 0
	for _, q := range queues.Items {
		if readyOf(q.Status.Conditions, q.Generation, q.Status.ObservedGeneration) == "True" && q.Status.ObservedGeneration == q.Generation {
			current++
		} else {
			stale++
		}
	}
	switch {
	case current > 0 && stale == 0:
		return Check{Name: name, Status: CheckOK, Detail: fmt.Sprintf("no Deployment found, but it is at work: %s Ready at their current generation (it runs outside the cluster?)", plural(current, "hcp Queue object", "hcp Queue objects"))}
	case current > 0:
		return Check{Name: name, Status: CheckWarn, Detail: fmt.Sprintf("no Deployment found; %d hcp Queue objects Ready, %d not (yet)", current, stale),
			Fix: "kubectl get queues.rabbitmq.com -A shows which; their Ready condition says why"}
	case len(queues.Items) > 0:
		return Check{Name: name, Status: CheckFail, Detail: fmt.Sprintf("no Deployment found and none of the %d hcp Queue objects is Ready", len(queues.Items)), Fix: fix}
	}
	return Check{Name: name, Status: CheckFail, Detail: "no Deployment labelled app.kubernetes.io/name=messaging-topology-operator (and no hcp Queue objects to see it at work)", Fix: fix}
}
