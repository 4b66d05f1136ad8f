package kubectlhcp

import (
	"net"
	"strings"
	"testing"
)

// A cluster's amqpURL lists its nodes: each is probed, and a silent one is
// named.
func TestAMQPCheckProbesEveryNode(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = up.Close() }()
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = gone.Close()
	node, silent := "amqp://"+up.Addr().String(), "amqp://"+gone.Addr().String()

	if c := amqpCheck("b", node+", "+node); c.Status != CheckOK || !strings.Contains(c.Detail, up.Addr().String()+", "+up.Addr().String()) {
		t.Errorf("two live nodes: %+v", c)
	}
	if c := amqpCheck("b", node+","+silent); c.Status != CheckWarn || !strings.Contains(c.Detail, gone.Addr().String()) || strings.Contains(c.Detail, up.Addr().String()) {
		t.Errorf("one silent node: %+v", c)
	}
	if c := amqpCheck("b", node+",::"); c.Status != CheckFail {
		t.Errorf("an unparsable node: %+v", c)
	}
}
