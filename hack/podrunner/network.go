package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// network gives each pod its own network namespace, attached by a veth pair
// to a bridge on this machine that holds the gateway address (the node's
// InternalIP). The range exists only on that bridge and the veths.
type network struct {
	bridge  string
	prefix  netip.Prefix // e.g. 10.250.0.0/16
	gateway netip.Addr   // first address: the bridge, the node
	// extra addresses on the bridge (service VIPs the runner serves).
	extra []netip.Addr

	mu   sync.Mutex
	used map[netip.Addr]string // address → pod UID
	// last is the address handed out last: allocation goes round the range
	// rather than reusing the lowest free address, so that a new pod does
	// not inherit the neighbour (ARP) entries of one that just went.
	last netip.Addr
}

func newNetwork(bridge, cidr string, extra []netip.Addr) (*network, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("pod CIDR %q: %w", cidr, err)
	}
	p = p.Masked()
	if !p.Addr().Is4() || p.Bits() > 30 {
		return nil, fmt.Errorf("pod CIDR %q: want an IPv4 prefix of /30 or wider", cidr)
	}
	return &network{bridge: bridge, prefix: p, gateway: p.Addr().Next(), extra: extra, used: map[netip.Addr]string{}}, nil
}

// bridgeMAC is the bridge's fixed, locally administered MAC address.
const bridgeMAC = "02:68:63:70:00:01"

// ensureBridge creates the bridge with the gateway address, idempotently.
func (n *network) ensureBridge(ctx context.Context) error {
	if _, err := net.InterfaceByName(n.bridge); err != nil {
		if err := ipCmd(ctx, "link", "add", n.bridge, "type", "bridge"); err != nil && !strings.Contains(err.Error(), "File exists") {
			return err
		}
		// A bridge without an address of its own takes the lowest MAC of
		// its ports, so it changes as pods come and go, and every pod's ARP
		// entry for the gateway goes stale (traffic to the API server
		// stalled for tens of seconds). Pin a locally administered one.
		if err := ipCmd(ctx, "link", "set", "dev", n.bridge, "address", bridgeMAC); err != nil {
			return err
		}
	}
	want := []string{fmt.Sprintf("%s/%d", n.gateway, n.prefix.Bits())}
	for _, a := range n.extra {
		want = append(want, a.String()+"/32")
	}
	have := map[string]bool{}
	if ifc, err := net.InterfaceByName(n.bridge); err == nil {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			have[a.String()] = true
		}
	}
	for _, a := range want {
		if have[a] {
			continue
		}
		if err := ipCmd(ctx, "addr", "add", a, "dev", n.bridge); err != nil {
			return err
		}
	}
	return ipCmd(ctx, "link", "set", n.bridge, "up")
}

// allocate picks a free address for a pod: the one it has, else preferred
// (the address its status shows from a previous run) when free, else the
// first free one.
func (n *network) allocate(uid string, preferred netip.Addr) (netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for a, u := range n.used {
		if u == uid {
			return a, nil
		}
	}
	if preferred.IsValid() && n.prefix.Contains(preferred) && n.prefix.Contains(preferred.Next()) && preferred != n.gateway && !slicesContains(n.extra, preferred) {
		if _, taken := n.used[preferred]; !taken {
			n.used[preferred] = uid
			return preferred, nil
		}
	}
	first := n.gateway.Next()
	start := first
	if n.last.IsValid() && n.prefix.Contains(n.last.Next()) {
		start = n.last.Next()
	}
	a := start
	for {
		if !n.prefix.Contains(a.Next()) {
			// a is the broadcast address: wrap.
			a = first
		}
		if _, taken := n.used[a]; !taken && !slicesContains(n.extra, a) {
			n.used[a] = uid
			n.last = a
			return a, nil
		}
		a = a.Next()
		if a == start {
			break
		}
	}
	return netip.Addr{}, errors.New("no free pod address in " + n.prefix.String())
}

func (n *network) release(uid string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for a, u := range n.used {
		if u == uid {
			delete(n.used, a)
		}
	}
}

// netnsName is the pod's network namespace (ip netns name).
func netnsName(uid string) string { return "hcp-" + uid }

// vethName is the host end of the pod's veth pair (at most 15 bytes).
func vethName(uid string) string {
	return "hv" + strings.ReplaceAll(uid, "-", "")[:12]
}

func netnsPath(name string) string { return filepath.Join("/run/netns", name) }

// createSandbox makes the pod's network namespace: loopback up, eth0 with
// the pod's address, default route through the bridge. A leftover namespace
// of the same pod is replaced.
func (n *network) createSandbox(ctx context.Context, uid string, ip netip.Addr) error {
	ns, veth := netnsName(uid), vethName(uid)
	n.deleteSandbox(ctx, uid)
	prefix := fmt.Sprintf("%s/%d", ip, n.prefix.Bits())
	steps := []string{
		"netns add " + ns,
		"link add " + veth + " type veth peer name eth0 netns " + ns,
		"link set " + veth + " master " + n.bridge,
		"link set " + veth + " up",
		"-n " + ns + " link set lo up",
		"-n " + ns + " addr add " + prefix + " dev eth0",
		"-n " + ns + " link set eth0 up",
		"-n " + ns + " route add default via " + n.gateway.String(),
	}
	for _, s := range steps {
		// Names and addresses hold no spaces.
		if err := ipCmd(ctx, strings.Fields(s)...); err != nil {
			n.deleteSandbox(ctx, uid)
			return err
		}
	}
	// Forget what the node knew of the address's previous holder.
	_ = ipCmd(ctx, "neigh", "flush", "to", ip.String(), "dev", n.bridge)
	return nil
}

// deleteSandbox removes the pod's namespace and veth; missing ones are fine.
func (n *network) deleteSandbox(ctx context.Context, uid string) {
	_ = ipCmd(ctx, "link", "del", vethName(uid))
	if _, err := os.Stat(netnsPath(netnsName(uid))); err == nil {
		_ = ipCmd(ctx, "netns", "del", netnsName(uid))
	}
}

// sandboxes lists the pod UIDs that have a network namespace.
func sandboxes() []string {
	entries, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range entries {
		if uid, ok := strings.CutPrefix(e.Name(), "hcp-"); ok {
			out = append(out, uid)
		}
	}
	return out
}

func ipCmd(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "ip", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

func slicesContains(s []netip.Addr, a netip.Addr) bool {
	for _, x := range s {
		if x == a {
			return true
		}
	}
	return false
}

// hostsFile is the kubelet-managed /etc/hosts of a pod.
func hostsFile(ip, hostname, subdomain, namespace string, aliases []hostAlias) []byte {
	var b bytes.Buffer
	b.WriteString("# Kubernetes-managed hosts file.\n")
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n")
	if subdomain != "" {
		fmt.Fprintf(&b, "%s\t%s.%s.%s.svc.cluster.local\t%s\n", ip, hostname, subdomain, namespace, hostname)
	} else {
		fmt.Fprintf(&b, "%s\t%s\n", ip, hostname)
	}
	if len(aliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range aliases {
			fmt.Fprintf(&b, "%s\t%s\n", a.ip, strings.Join(a.hostnames, "\t"))
		}
	}
	return b.Bytes()
}

type hostAlias struct {
	ip        string
	hostnames []string
}
