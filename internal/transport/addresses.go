package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// checkAddresses checks that each address is HOST:PORT.
func checkAddresses(addrs []string) error {
	for _, a := range addrs {
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
			return fmt.Errorf("broker address %q: want HOST:PORT", a)
		}
	}
	return nil
}

// dialNode opens the TCP connection of one dial: to addr (the URL's host)
// when there are no Addresses, else to the first of them that accepts,
// trying each once in order from nextAddr. It remembers the node that
// accepted, so the next dial starts there.
func (c *Conn) dialNode(ctx context.Context, d *net.Dialer, network, addr string) (net.Conn, string, error) {
	n := len(c.opts.Addresses)
	if n == 0 {
		nc, err := d.DialContext(ctx, network, addr)
		return nc, addr, err
	}
	var errs []error
	for i := range n {
		j := (c.nextAddr + i) % n
		a := c.opts.Addresses[j]
		nc, err := d.DialContext(ctx, network, a)
		if err == nil {
			c.nextAddr = j
			return nc, a, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, "", errors.Join(errs...)
}

// skipNode makes the next dial start from the node after the one that
// accepted the last: its TCP connection opened, but the AMQP handshake
// failed (a node still booting, or paused as a partition's minority).
func (c *Conn) skipNode() {
	if n := len(c.opts.Addresses); n > 0 {
		c.nextAddr = (c.nextAddr + 1) % n
	}
}
