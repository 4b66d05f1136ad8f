package testbed

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Cluster is hack/rabbitmq-cluster.sh's three RabbitMQ nodes on this host:
// Broker talks to node 1 (management API and AMQP), Addresses are every
// node's AMQP HOST:PORT, node 1 first.
type Cluster struct {
	Broker    *Broker
	Addresses []string
}

// StartRabbitMQCluster runs `hack/rabbitmq-cluster.sh up` (it starts the
// three nodes, or reuses them) and returns node 1's management API URL and
// every node's AMQP HOST:PORT on this host, node 1 first.
func StartRabbitMQCluster(ctx context.Context) (mgmt string, addrs []string, err error) {
	urls, _, err := runScript(ctx, "rabbitmq-cluster.sh", "up")
	if err != nil {
		return "", nil, err
	}
	if mgmt, _, err = runScript(ctx, "rabbitmq-cluster.sh", "management"); err != nil {
		return "", nil, err
	}
	for raw := range strings.SplitSeq(urls, ",") {
		u, err := url.Parse(raw)
		if err != nil || u.Port() == "" {
			return "", nil, fmt.Errorf("hack/rabbitmq-cluster.sh up printed %q; want its nodes' AMQP URLs", urls)
		}
		addrs = append(addrs, u.Host)
	}
	return mgmt, addrs, nil
}

// EnsureRabbitMQCluster starts the three nodes, or reuses them, once
// RabbitMQ is installed (EnsureRabbitMQ installs it). They are left
// running: starting them takes a minute or two, and `make test` stops them
// at its end (hack/rabbitmq-cluster.sh down).
func EnsureRabbitMQCluster(t testing.TB) *Cluster {
	t.Helper()
	base := EnsureRabbitMQ(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	mgmt, addrs, err := StartRabbitMQCluster(ctx)
	if err != nil {
		t.Fatalf("testbed: the three-node RabbitMQ cluster: %v", err)
	}
	c := &Cluster{Addresses: addrs}
	if c.Broker, err = NewBroker(mgmt, base.Username, base.Password); err != nil {
		t.Fatal(err)
	}
	c.Broker.AMQPURL = "amqp://" + addrs[0]
	return c
}

// Node runs `hack/rabbitmq-cluster.sh CMD N` (kill, start, partition,
// heal) on node n (1..3).
func (c *Cluster) Node(ctx context.Context, cmd string, n int) error {
	return RabbitMQClusterCmd(ctx, cmd, fmt.Sprint(n))
}

// RabbitMQClusterCmd runs `hack/rabbitmq-cluster.sh ARGS...` (kill N,
// start N, partition N, heal N, restart).
func RabbitMQClusterCmd(ctx context.Context, args ...string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, filepath.Join(root, "hack", "rabbitmq-cluster.sh"), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("hack/rabbitmq-cluster.sh %s: %w\n%s", strings.Join(args, " "), err, tail(string(out), 2000))
	}
	return nil
}
