package kubectlhcp

import (
	"context"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// kubectl hcp doctor, by file:
//
//	doctor.go            the command, and which checks run in which order
//	doctor_install.go    the CRDs, the hcp-operator and the topology operator
//	doctor_harnesses.go  the Callees' and Callers' brokers, credentials Secrets and policies
//	doctor_broker.go     one broker: its connection Secret, management API and AMQP
//	doctor_msgsize.go    one broker's max_message_size, probed over AMQP
//	doctor_admission.go  the admission policies and webhooks
//	doctor_report.go     Check, and the report printed from the checks

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
operator, each broker the harnesses use (its connection Secret, its
management API, and its max_message_size: at most 8 MiB, probed with one
unroutable message just above it), the credentials Secrets of the Callees
and Callers, a CapabilityPolicy for each Callee, and the admission
policies and webhooks.
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
	deps, err := d.deployments(ctx, operatorLabels)
	out = append(out, operator(deps, err))
	out = append(out, d.calleeSidecarRole(ctx, deps)...)
	out = append(out, d.topologyOperator(ctx))
	if hcpOK {
		out = append(out, d.harnesses(ctx)...)
	}
	out = append(out, d.admission(ctx)...)
	return out
}
