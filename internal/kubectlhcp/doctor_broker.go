package kubectlhcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// broker checks one broker reference: its Secret (labelled for the
// topology operator), its management API, AMQP from this machine, and its
// max_message_size (probed in vhost, one the harnesses use).
func (d *doctor) broker(ctx context.Context, ref topologyv1beta1.RabbitmqClusterReference, ns, vhost string) []Check {
	a := resolveBroker(ctx, d.c, ref, ns, d.mgmtURL)
	name := "broker " + a.Ref
	var out []Check
	amqpURL := ""
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
			if b, err := resource.BrokerFromConnectionSecret(ref, hcpv1alpha1.BrokerSpec{Vhost: vhost}, s); err == nil {
				amqpURL = b.AMQPURL
			}
		}
	}
	out = append(out, d.messageSize(ctx, a, probeTarget(amqpURL, d.mgmtURL), vhost))
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

// messageSize probes the broker's max_message_size (doctor_msgsize.go).
func (d *doctor) messageSize(ctx context.Context, a brokerAccess, target, vhost string) Check {
	if target == "" {
		return messageSizeCheck(a.Ref, sizeProbe{}, errors.New("no AMQP address for this broker from this machine (a RabbitmqCluster's Service is in-cluster: pass --management-url with a host that also serves AMQP on 5672, e.g. after kubectl port-forward svc/NAME 15672 5672)"))
	}
	if vhost == "" {
		vhost = topology.DefaultVhost
	}
	p, err := probeMaxMessageSize(ctx, target, a.Username, a.Password, vhost, DocumentedMaxMessageSize+1)
	return messageSizeCheck(a.Ref, p, err)
}

// amqpCheck dials the amqpURL the sidecars use. It is the pods' view of the
// broker, which this machine may not share: a failure is a warning.
func amqpCheck(name, raw string) Check {
	var hosts, silent []string
	for one := range strings.SplitSeq(raw, ",") {
		u, err := url.Parse(strings.TrimSpace(one))
		if err != nil || u.Host == "" {
			return Check{Name: name, Status: CheckFail, Detail: "amqpURL " + raw + " does not parse", Fix: "set amqpURL to amqp://HOST:PORT or amqps://HOST:PORT, or a cluster's nodes, comma-separated"}
		}
		host := u.Host
		if u.Port() == "" {
			port := "5672"
			if u.Scheme == "amqps" {
				port = "5671"
			}
			host = net.JoinHostPort(u.Hostname(), port)
		}
		hosts = append(hosts, host)
		c, err := net.DialTimeout("tcp", host, 3*time.Second)
		if err != nil {
			silent = append(silent, host+": "+oneLine(err.Error(), 120))
			continue
		}
		_ = c.Close()
	}
	all := strings.Join(hosts, ", ")
	if len(silent) > 0 {
		return Check{Name: name, Status: CheckWarn, Detail: "AMQP (amqpURL, as the sidecars reach it) does not answer from this machine: " + strings.Join(silent, "; "),
			Fix: "fine if only pods can reach it; otherwise the sidecars cannot connect there either (with every node silent, their /readyz fails)"}
	}
	return Check{Name: name, Status: CheckOK, Detail: "AMQP " + all + " (amqpURL) accepts connections from this machine"}
}
