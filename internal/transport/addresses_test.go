package transport_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/internal/transport/transporttest"
)

func TestDialRejectsAnAddressWithoutAPort(t *testing.T) {
	if _, err := transport.Dial(context.Background(), transport.Options{URL: "amqp://u:p@h:5672/v", Addresses: []string{"h"}}); err == nil {
		t.Error("Dial accepted an address without a port")
	}
}

// A cluster without a load balancer: the first node refuses connections,
// so the Conn connects to the second (the URL's own host does not exist).
// When that node dies (its connections cut, and it accepts TCP but closes
// before the AMQP handshake, as a node still booting does), the Conn
// reconnects to the third.
func TestAddressesFailOverToTheNextNode(t *testing.T) {
	e := newEnv(t)
	refused := closedPort(t)
	second := transporttest.NewProxy(t, e.broker.AMQPAddr)
	third := transporttest.NewProxy(t, e.broker.AMQPAddr)
	m := newMetrics()
	c := e.dialURL(e.broker.URLVia("nowhere.invalid:5672", e.vhost), "failover", m, func(o *transport.Options) {
		o.Addresses = []string{refused, second.Addr(), third.Addr()}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("not connected through the second node: %v", err)
	}
	third.Down(true)
	second.Down(true)
	second.Cut()
	eventually(t, 5*time.Second, "the connection lost", func() bool { return !c.Ready() })
	third.Down(false)
	eventually(t, 15*time.Second, "reconnected through the third node", c.Ready)
	if n := m.reconnectCount("amqp"); n != 1 {
		t.Errorf("reconnects reported: %d, want 1", n)
	}
}

// closedPort is a local address where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// A connection that stayed up for StableAfter starts the backoff over when
// it is lost, however often that happens (a cluster restarted node by
// node); one lost sooner counts as a flap and doubles the wait.
func TestBackoffStartsOverAfterAStableConnection(t *testing.T) {
	e := newEnv(t)
	proxy := transporttest.NewProxy(t, e.broker.AMQPAddr)
	clk := &recordingClock{}
	c := e.dialURL(e.broker.URLVia(proxy.Addr(), e.vhost), "stable", nil, func(o *transport.Options) {
		o.Clock, o.Rand = clk, func() float64 { return 0.5 }
		o.BackoffMin, o.BackoffMax, o.StableAfter = time.Second, time.Minute, 300*time.Millisecond
	})
	lose := func(upFor time.Duration) time.Duration {
		t.Helper()
		eventually(t, 10*time.Second, "connected", c.Ready)
		time.Sleep(upFor)
		n := len(clk.recorded())
		proxy.Cut()
		eventually(t, 10*time.Second, "a redial scheduled", func() bool { return len(clk.recorded()) > n })
		return clk.recorded()[n]
	}
	for i := range 3 {
		if d := lose(500 * time.Millisecond); d != 500*time.Millisecond {
			t.Errorf("loss %d of a stable connection: redial after %v, want 500ms (half of BackoffMin: a fresh start)", i+1, d)
		}
	}
	if d := lose(0); d != time.Second {
		t.Errorf("a flap: redial after %v, want 1s (BackoffMin: one failure)", d)
	}
}
