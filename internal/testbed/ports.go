package testbed

import (
	"net"
)

// FreeAddrs returns n distinct loopback addresses no one listened on when
// it looked. Each listener stays open until all n are picked, so the
// kernel cannot hand out one port twice (two addresses taken one after the
// other may well be the same). Another process can still take a port
// before the caller binds it; what binds it must fail loudly then.
func FreeAddrs(n int) ([]string, error) {
	addrs := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer func() { _ = l.Close() }()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// FreeAddr is FreeAddrs(1)'s address.
func FreeAddr() (string, error) {
	a, err := FreeAddrs(1)
	if err != nil {
		return "", err
	}
	return a[0], nil
}
