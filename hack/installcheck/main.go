// Command installcheck prints what hack/check-install.sh and
// hack/check-dockerfile.sh check the install paths against, taken from the
// operator's own builders (internal/resource) so the checks cannot drift:
//
//	installcheck commands
//	    The command of every container the operator injects, one line each:
//	    its name, then its command words, or "-" when it sets none and so
//	    runs the image's ENTRYPOINT.
//	installcheck children NAMESPACE
//	    A YAML stream of the objects the operator creates for the sample
//	    Callee and Caller (config/samples) in NAMESPACE: ServiceAccounts,
//	    Roles, RoleBindings, Secrets, Deployments and the topology
//	    operator's objects. check-install.sh creates them with a server-side
//	    dry-run as the manager's ServiceAccount: that fails when the chart's
//	    RBAC lacks a permission the manager needs (Kubernetes also refuses a
//	    Role granting more than its creator holds).
package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

func commands() {
	for _, role := range []topology.Role{topology.RoleCallee, topology.RoleCaller} {
		c := resource.SidecarContainer(resource.HarnessParams{
			Subject: resource.Subject{Role: role, Name: "x", Namespace: "x", ID: "x"},
		})
		cmd := "-"
		if len(c.Command) > 0 {
			cmd = strings.Join(c.Command, " ")
		}
		fmt.Printf("%s(%s) %s\n", c.Name, role, cmd)
	}
}

func readSample(path string, into client.Object) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return yaml.Unmarshal(data, into)
}

func children(namespace string) ([]client.Object, error) {
	callee, caller := &hcpv1alpha1.Callee{}, &hcpv1alpha1.Caller{}
	if err := readSample("config/samples/hcp_v1alpha1_callee.yaml", callee); err != nil {
		return nil, err
	}
	if err := readSample("config/samples/hcp_v1alpha1_caller.yaml", caller); err != nil {
		return nil, err
	}
	callee.Namespace, callee.UID = namespace, types.UID("00000000-0000-4000-8000-000000000001")
	caller.Namespace, caller.UID = namespace, types.UID("00000000-0000-4000-8000-000000000002")

	ref := topologyv1beta1.RabbitmqClusterReference{Name: "rabbitmq"}
	cb := resource.BrokerFromCluster(ref, callee.Spec.Broker, namespace)
	rb := resource.BrokerFromCluster(ref, caller.Spec.Broker, namespace)
	objs := []client.Object{resource.Vhost(namespace, cb, cb.Reference, resource.DeletionPolicyRetain)}
	commandsX, eventsX := resource.Exchanges(namespace, cb, cb.Reference)
	objs = append(objs, commandsX, eventsX, resource.DefaultEventLimitsPolicy(namespace, cb, cb.Reference))

	for _, v := range []struct {
		s       resource.Subject
		b       resource.Broker
		harness *hcpv1alpha1.HarnessSpec
		sidecar hcpv1alpha1.SidecarSpec
	}{
		{resource.ForCallee(callee), cb, &callee.Spec.Harness, callee.Spec.Sidecar},
		{resource.ForCaller(caller), rb, caller.Spec.Harness, hcpv1alpha1.SidecarSpec{}},
	} {
		creds, err := resource.CredentialsSecret(v.s, v.b, "dry-run-password")
		if err != nil {
			return nil, err
		}
		if v.s.Role == topology.RoleCallee {
			resource.WithTokenKeys(creds, resource.TokenKeys{PrivatePEM: []byte("dry-run"), PublicPEM: []byte("dry-run"), VerifyPEM: []byte("dry-run")})
		}
		objs = append(objs, creds, resource.ServiceAccount(v.s),
			resource.Binding(v.s, v.b), resource.User(v.s, v.b), resource.Permission(v.s, v.b))
		if v.s.Role == topology.RoleCallee {
			objs = append(objs, resource.CalleeRoleBinding(v.s, resource.DefaultCalleeSidecarClusterRole), resource.CalleeQueue(callee, v.b))
			if p := resource.CalleeLimitsPolicy(callee, v.b); p != nil {
				objs = append(objs, p)
			}
		} else {
			q, err := resource.CallerQueue(caller, v.b)
			if err != nil {
				return nil, err
			}
			p, err := resource.CallerLimitsPolicy(caller, v.b)
			if err != nil {
				return nil, err
			}
			objs = append(objs, resource.Role(v.s), resource.RoleBinding(v.s), q)
			if p != nil { // none with the default limits: the vhost's policy
				objs = append(objs, p)
			}
		}
		if v.harness != nil {
			objs = append(objs, resource.Deployment(resource.HarnessParams{
				Subject: v.s, Harness: *v.harness, Sidecar: v.sidecar, Vhost: v.b.Vhost, Prefetch: 10, SecretsHash: "dry-run",
			}))
		}
	}
	return objs, nil
}

func printChildren(namespace string) error {
	scheme := runtime.NewScheme()
	if err := controller.AddToScheme(scheme); err != nil {
		return err
	}
	objs, err := children(namespace)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	for _, o := range objs {
		gvk, err := apiutil.GVKForObject(o, scheme)
		if err != nil {
			return err
		}
		o.GetObjectKind().SetGroupVersionKind(gvk)
		y, err := yaml.Marshal(o)
		if err != nil {
			return err
		}
		out.WriteString("---\n")
		out.Write(y)
	}
	_, err = os.Stdout.Write(out.Bytes())
	return err
}

func main() {
	var err error
	switch {
	case len(os.Args) == 2 && os.Args[1] == "commands":
		commands()
	case len(os.Args) == 3 && os.Args[1] == "children":
		err = printChildren(os.Args[2])
	default:
		fmt.Fprintln(os.Stderr, "usage: installcheck commands | installcheck children NAMESPACE")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "installcheck:", err)
		os.Exit(1)
	}
}
