package kubectlhcp

import (
	"context"
	"fmt"
	"slices"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// admission checks the sidecar ValidatingAdmissionPolicies and any
// admission webhook for hcp.io or rabbitmq.com.
func (d *doctor) admission(ctx context.Context) []Check {
	return []Check{d.admissionPolicies(ctx), d.admissionWebhooks(ctx)}
}

// admissionPolicies checks the *sidecar-sessions ValidatingAdmissionPolicies
// and their bindings.
func (d *doctor) admissionPolicies(ctx context.Context) Check {
	var policies admissionregistrationv1.ValidatingAdmissionPolicyList
	var bindings admissionregistrationv1.ValidatingAdmissionPolicyBindingList
	if err := d.c.List(ctx, &policies); err != nil {
		return Check{Name: checkAdmissionPolicies, Status: CheckWarn, Detail: "cannot list ValidatingAdmissionPolicies: " + oneLine(err.Error(), 150)}
	}
	if err := d.c.List(ctx, &bindings); err != nil {
		return Check{Name: checkAdmissionPolicies, Status: CheckWarn, Detail: "cannot list ValidatingAdmissionPolicyBindings: " + oneLine(err.Error(), 150)}
	}
	var found, unbound []string
	for _, p := range policies.Items {
		if !strings.HasSuffix(p.Name, "sidecar-sessions") {
			continue
		}
		bound := slices.ContainsFunc(bindings.Items, func(b admissionregistrationv1.ValidatingAdmissionPolicyBinding) bool {
			return b.Spec.PolicyName == p.Name
		})
		if bound {
			found = append(found, p.Name)
		} else {
			unbound = append(unbound, p.Name)
		}
	}
	switch {
	case len(unbound) > 0:
		return Check{Name: checkAdmissionPolicies, Status: CheckFail, Detail: "no binding for " + strings.Join(unbound, ", ") + ": the policy is not enforced",
			Fix: "reinstall them with their bindings: helm upgrade (sidecarAdmissionPolicy.enabled=true) or kubectl apply -k config/admission"}
	case len(found) == 0:
		return Check{Name: checkAdmissionPolicies, Status: CheckFail, Detail: "no *sidecar-sessions ValidatingAdmissionPolicy: a sidecar's ServiceAccount may write any HCPSession in its namespace, not only its own Callee's (docs/rbac.md)",
			Fix: "helm upgrade --set sidecarAdmissionPolicy.enabled=true, or kubectl apply -k config/admission (Kubernetes 1.30 or later)"}
	}
	return Check{Name: checkAdmissionPolicies, Status: CheckOK, Detail: strings.Join(found, ", ") + " bound"}
}

// admissionWebhooks checks that every webhook covering hcp.io or
// rabbitmq.com is backed by ready endpoints.
func (d *doctor) admissionWebhooks(ctx context.Context) Check {
	var vwc admissionregistrationv1.ValidatingWebhookConfigurationList
	var mwc admissionregistrationv1.MutatingWebhookConfigurationList
	type hook struct {
		config string
		svc    *admissionregistrationv1.ServiceReference
		fail   bool
	}
	var hooks []hook
	relevant := func(rules []admissionregistrationv1.RuleWithOperations) bool {
		for _, r := range rules {
			for _, g := range r.APIGroups {
				if g == "*" || g == hcpv1alpha1.GroupVersion.Group || g == topologyv1beta1.GroupVersion.Group {
					return true
				}
			}
		}
		return false
	}
	if err := d.c.List(ctx, &vwc); err == nil {
		for _, c := range vwc.Items {
			for _, w := range c.Webhooks {
				if relevant(w.Rules) {
					hooks = append(hooks, hook{"ValidatingWebhookConfiguration " + c.Name + " " + w.Name, w.ClientConfig.Service, w.FailurePolicy == nil || *w.FailurePolicy == admissionregistrationv1.Fail})
				}
			}
		}
	}
	if err := d.c.List(ctx, &mwc); err == nil {
		for _, c := range mwc.Items {
			for _, w := range c.Webhooks {
				if relevant(w.Rules) {
					hooks = append(hooks, hook{"MutatingWebhookConfiguration " + c.Name + " " + w.Name, w.ClientConfig.Service, w.FailurePolicy == nil || *w.FailurePolicy == admissionregistrationv1.Fail})
				}
			}
		}
	}
	if len(hooks) == 0 {
		return Check{Name: checkAdmissionWebhooks, Status: CheckOK, Detail: "none for hcp.io or rabbitmq.com (none is needed; the topology operator's are optional)"}
	}
	var bad, good []string
	for _, h := range hooks {
		if h.svc == nil {
			good = append(good, h.config+" (URL)")
			continue
		}
		ready, err := d.serviceReady(ctx, h.svc.Namespace, h.svc.Name)
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("%s → Service %s/%s: %v", h.config, h.svc.Namespace, h.svc.Name, err))
		case !ready && h.fail:
			bad = append(bad, fmt.Sprintf("%s → Service %s/%s has no ready endpoints and failurePolicy Fail: writes it covers are refused", h.config, h.svc.Namespace, h.svc.Name))
		case !ready:
			bad = append(bad, fmt.Sprintf("%s → Service %s/%s has no ready endpoints (failurePolicy Ignore: skipped)", h.config, h.svc.Namespace, h.svc.Name))
		default:
			good = append(good, h.config)
		}
	}
	if len(bad) > 0 {
		return Check{Name: checkAdmissionWebhooks, Status: CheckFail, Detail: strings.Join(bad, "; "),
			Fix: "start the webhook's pods, or delete a configuration left behind by an uninstalled operator"}
	}
	return Check{Name: checkAdmissionWebhooks, Status: CheckOK, Detail: strings.Join(good, ", ") + ": backed by ready endpoints"}
}

// serviceReady reports whether a Service has a ready endpoint.
func (d *doctor) serviceReady(ctx context.Context, ns, name string) (bool, error) {
	svc := &corev1.Service{}
	if err := d.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
		return false, err
	}
	var slices discoveryv1.EndpointSliceList
	if err := d.c.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
		return false, err
	}
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				return true, nil
			}
		}
	}
	return false, nil
}
