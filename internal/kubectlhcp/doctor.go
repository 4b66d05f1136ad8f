package kubectlhcp

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	"github.com/spf13/cobra"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// CheckStatus is the outcome of one doctor check.
type CheckStatus int

const (
	CheckOK CheckStatus = iota
	// CheckWarn: worth knowing, does not fail the doctor.
	CheckWarn
	CheckFail
)

// Check is one doctor check: what it looked at, what it found, and how to
// fix it when it failed.
type Check struct {
	Name   string
	Status CheckStatus
	Detail string
	Fix    string
}

// Names of checks that several code paths report.
const (
	checkHarnesses         = "harnesses"
	checkAdmissionPolicies = "admission policies"
	checkAdmissionWebhooks = "admission webhooks"
	checkPolicies          = "policies"
)

// DoctorOptions are the flags of `kubectl hcp doctor`.
type DoctorOptions struct {
	// AllNamespaces checks the harnesses of every namespace; else those of
	// the command's namespace. Cluster-wide checks (CRDs, operators,
	// admission) run either way.
	AllNamespaces bool
	ManagementURL string
}

func newDoctorCommand(env *Env) *cobra.Command {
	var o DoctorOptions
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check an installation: CRDs, the operator, the topology operator, the broker, credentials Secrets, admission",
		Long: `Check what HCP needs and print each check with ✓ (fine), ! (worth knowing)
or ✗ (broken) and how to fix it: the four hcp.io CRDs and the topology
operator's rabbitmq.com CRDs, the hcp-operator Deployment, the topology
operator, each broker the harnesses use (its connection Secret and
management API), the credentials Secrets of the Callees and Callers, a
CapabilityPolicy for each Callee, and the admission policies and webhooks.
Harnesses are those of the namespace (-n), or of all namespaces with -A.
Exit code 1 when a check fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return RunDoctor(cmd.Context(), env, o)
		},
	}
	cmd.Flags().BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "check the Callees and Callers of every namespace")
	cmd.Flags().StringVar(&o.ManagementURL, "management-url", "", "the broker's management API, overriding the connection Secrets' uri")
	return cmd
}

// RunDoctor runs every check and prints them; an *ExitError when one
// failed.
func RunDoctor(ctx context.Context, env *Env, o DoctorOptions) error {
	c, err := env.client()
	if err != nil {
		return err
	}
	d := &doctor{c: c, mgmtURL: o.ManagementURL}
	if !o.AllNamespaces {
		if d.ns, err = env.namespace(); err != nil {
			return err
		}
	}
	checks := d.run(ctx)
	RenderChecks(env.Streams.Out, checks)
	for _, ch := range checks {
		if ch.Status == CheckFail {
			return exitWith(ExitFailure)
		}
	}
	return nil
}

type doctor struct {
	c       client.Reader
	ns      string // "" = every namespace
	mgmtURL string
}

func (d *doctor) run(ctx context.Context) []Check {
	var out []Check
	hcpOK := true
	for _, ch := range []Check{
		d.crds(ctx, "hcp.io CRDs", hcpv1alpha1.GroupVersion.Group, []string{"callees", "callers", "capabilitypolicies", "hcpsessions"},
			"install them: helm install hcp-operator charts/hcp-operator, or kubectl apply --server-side -k config/crd"),
		d.crds(ctx, "rabbitmq.com CRDs", topologyv1beta1.GroupVersion.Group, []string{"vhosts", "exchanges", "queues", "bindings", "users", "permissions", "policies"},
			"install the RabbitMQ messaging-topology-operator (v1.20 or later) with its CRDs, and cluster-operator's RabbitmqCluster CRD (docs/install.md)"),
	} {
		out = append(out, ch)
		if ch.Name == "hcp.io CRDs" && ch.Status == CheckFail {
			hcpOK = false
		}
	}
	out = append(out, d.operator(ctx), d.topologyOperator(ctx))
	if hcpOK {
		out = append(out, d.harnesses(ctx)...)
	}
	out = append(out, d.admission(ctx)...)
	return out
}

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

// operator checks the hcp-operator manager Deployment.
func (d *doctor) operator(ctx context.Context) Check {
	const name = "hcp-operator"
	deps, err := d.deployments(ctx, client.MatchingLabels{"app.kubernetes.io/name": "hcp-operator", "app.kubernetes.io/component": "manager"})
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
			out = append(out, d.broker(ctx, ref, q.Namespace)...)
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
		} else if p := secretOK(c.Namespace, resource.ForCallee(c).TokenSecretName()); p != "" {
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

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func firstN(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("and %d more", len(s)-n))
}

// broker checks one broker reference: its Secret (labelled for the
// topology operator), its management API, and AMQP from this machine.
func (d *doctor) broker(ctx context.Context, ref topologyv1beta1.RabbitmqClusterReference, ns string) []Check {
	a := resolveBroker(ctx, d.c, ref, ns, d.mgmtURL)
	name := "broker " + a.Ref
	var out []Check
	if ref.ConnectionSecret != nil {
		sns := ns
		if ref.Namespace != "" {
			sns = ref.Namespace
		}
		s := &corev1.Secret{}
		if err := d.c.Get(ctx, client.ObjectKey{Namespace: sns, Name: ref.ConnectionSecret.Name}, s); err == nil {
			if s.Labels[resource.LabelTopologyOperator] != resource.TopologyOperatorLabelValue {
				out = append(out, Check{Name: name, Status: CheckFail, Detail: "the Secret lacks the label " + resource.LabelTopologyOperator + "=true: the topology operator cannot see it",
					Fix: fmt.Sprintf("kubectl label secret -n %s %s %s=true", sns, s.Name, resource.LabelTopologyOperator)})
			}
			if amqp := strings.TrimSpace(string(s.Data[resource.ConnectionSecretAMQPURLKey])); amqp != "" {
				out = append(out, amqpCheck(name, amqp))
			}
		}
	}
	rh, err := a.managementClient()
	if err == nil {
		o, oerr := rh.Overview()
		if oerr != nil {
			err = oerr
		} else {
			return append([]Check{{Name: name, Status: CheckOK, Detail: fmt.Sprintf("management API %s answers (RabbitMQ %s, node %s)", redactedURL(a.URL), o.RabbitMQVersion, o.Node)}}, out...)
		}
	}
	return append([]Check{{Name: name, Status: CheckFail, Detail: "management API: " + oneLine(err.Error(), 200),
		Fix: "the topology operator declares through it: check the Secret's uri, username and password; from outside the cluster pass --management-url"}}, out...)
}

// amqpCheck dials the amqpURL the sidecars use. It is the pods' view of the
// broker, which this machine may not share: a failure is a warning.
func amqpCheck(name, raw string) Check {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return Check{Name: name, Status: CheckFail, Detail: "amqpURL " + raw + " does not parse", Fix: "set amqpURL to amqp://HOST:PORT or amqps://HOST:PORT"}
	}
	host := u.Host
	if u.Port() == "" {
		port := "5672"
		if u.Scheme == "amqps" {
			port = "5671"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	c, err := net.DialTimeout("tcp", host, 3*time.Second)
	if err != nil {
		return Check{Name: name, Status: CheckWarn, Detail: "AMQP " + host + " (amqpURL, as the sidecars reach it) does not answer from this machine: " + oneLine(err.Error(), 120),
			Fix: "fine if only pods can reach it; otherwise the sidecars cannot connect either (their /readyz fails)"}
	}
	_ = c.Close()
	return Check{Name: name, Status: CheckOK, Detail: "AMQP " + host + " (amqpURL) accepts connections from this machine"}
}

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

// RenderChecks writes the checks, one line each with ✓, ! or ✗, the fix
// under a failed or warned one, and a summary.
func RenderChecks(w io.Writer, checks []Check) {
	var ok, warn, fail int
	for _, c := range checks {
		mark := "✓"
		switch c.Status {
		case CheckOK:
			ok++
		case CheckWarn:
			mark = "!"
			warn++
		case CheckFail:
			mark = "✗"
			fail++
		}
		_, _ = fmt.Fprintf(w, "%s %s: %s\n", mark, c.Name, c.Detail)
		if c.Status != CheckOK && c.Fix != "" {
			_, _ = fmt.Fprintf(w, "    fix: %s\n", c.Fix)
		}
	}
	_, _ = fmt.Fprintf(w, "\n%d checks: %d passed, %d warnings, %d failed\n", len(checks), ok, warn, fail)
}
