//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// HCP_E2E_RABBITMQ_CLUSTER=1 runs the suite on the broker as users run it
// in production: hack/rabbitmq-cluster.sh's three RabbitMQ nodes on this
// host (quorum queues replicated across them, pause_minority), brought up
// if they are not running and left running. The chart's connection Secret
// then gives the topology operator node 1's management API and the
// sidecars every node (amqpURL amqp://NODE:5701,amqp://NODE:5702,…, which
// the local node translates to the nodes on 127.0.0.1), so a sidecar whose
// node dies or pauses connects to another. The faults marked cluster (a
// node killed, a node partitioned) run only then; the broker restart of
// the one-node broker does not.

// rabbitmqCluster brings the three nodes up and points the suite at them.
// It runs after the local stack's environment is loaded: the pods reach
// the nodes at the local node's address, HCP_STACK_AMQP_URL's host.
func rabbitmqCluster() error {
	if cfg.existing {
		return errors.New("HCP_E2E_RABBITMQ_CLUSTER=1 needs the local stack (hack/rabbitmq-cluster.sh runs the nodes on this host)")
	}
	defer timed("three-node RabbitMQ cluster")()
	mgmt, addrs, err := testbed.StartRabbitMQCluster(context.Background())
	if err != nil {
		return err
	}
	stack, err := url.Parse(os.Getenv("HCP_STACK_AMQP_URL"))
	if err != nil || stack.Hostname() == "" {
		return fmt.Errorf("HCP_STACK_AMQP_URL %q: no node address for the pods", os.Getenv("HCP_STACK_AMQP_URL"))
	}
	var pods []string
	for _, a := range addrs {
		_, port, _ := net.SplitHostPort(a)
		cfg.rmqNodes = append(cfg.rmqNodes, "amqp://"+a)
		pods = append(pods, "amqp://"+net.JoinHostPort(stack.Hostname(), port))
	}
	for k, v := range map[string]string{
		"HCP_E2E_MANAGEMENT_URL":  mgmt,
		"HCP_E2E_BROKER_AMQP_URL": strings.Join(pods, ","),
		"RABBITMQ_AMQP_URL":       cfg.rmqNodes[0],
	} {
		if err := os.Setenv(k, v); err != nil {
			return err
		}
	}
	return nil
}

// rabbitmqClusterCmd runs hack/rabbitmq-cluster.sh with args (kill N,
// start N, partition N, heal N, restart).
func (s *suite) rabbitmqClusterCmd(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := testbed.RabbitMQClusterCmd(ctx, args...); err != nil {
		t.Fatal(err)
	}
}

// brokerNodeFault is a cluster fault: hurt the node that holds the
// callee sidecars' connections (the first, if they are on several) for d, then undo it (the undo runs even if
// the run fails, and returns once the node is a running member again).
// The sidecars must have moved: afterwards none of their connections is
// on that node. (A fixed node would miss them after the first run: a
// sidecar stays on the node it moved to.)
func (r *samplesRun) brokerNodeFault(t *testing.T, hurt, undo string, d time.Duration) {
	user := r.callee.Status.Username
	nodes := r.connectionNodes(t, user)
	n := strings.TrimSuffix(strings.TrimPrefix(nodes[0], "hcp-r"), "@localhost")
	t.Logf("the callee sidecars are connected to %v: %s %s for %s", nodes, hurt, nodes[0], d)
	r.rabbitmqClusterCmd(t, hurt, n)
	undone := false
	t.Cleanup(func() {
		if !undone {
			r.rabbitmqClusterCmd(t, undo, n)
		}
	})
	time.Sleep(d)
	r.rabbitmqClusterCmd(t, undo, n)
	undone = true
	if after := r.connectionNodes(t, user); slices.Contains(after, nodes[0]) || len(after) == 0 {
		t.Fatalf("after %s of %s the callee sidecars' connections are on %v: they did not move to another node", hurt, nodes[0], after)
	}
}

// connectionNodes are the broker nodes that user's connections in the
// run's vhost are on, sorted, once it has some.
func (r *samplesRun) connectionNodes(t *testing.T, user string) []string {
	t.Helper()
	var nodes []string
	eventually(t, time.Minute, "connections of "+user, func(context.Context) error {
		conns, err := r.broker.API.ListConnectionsOfUser(user)
		if err != nil {
			return err
		}
		nodes = nil
		for _, c := range conns {
			if c.Vhost == r.vhost && !slices.Contains(nodes, c.Node) {
				nodes = append(nodes, c.Node)
			}
		}
		if len(nodes) == 0 {
			return fmt.Errorf("none in vhost %s", r.vhost)
		}
		return nil
	})
	slices.Sort(nodes)
	return nodes
}
