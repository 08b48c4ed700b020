// Package overlay is the node's end of the mesh's private network: a
// WireGuard device run in this process with wireguard-go (userspace, over
// /dev/net/tun: no kernel module), configured from the peer set the node's
// replica gives. It is the only importer of wireguard-go, netlink and
// nftables.
//
// Which peers a node has is decided by Want, a pure function of the nodes;
// Device carries a peer set out (only what changed is told to WireGuard, so
// a live peer's session and roamed endpoint are kept); the packet filter
// (filter.go) drops traffic for the overlay's prefix that did not come
// through the device. See DESIGN.md rule 11.
package overlay

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"mesh/internal/wgkey"
)

// Defaults.
const (
	// DefaultDevice is the overlay's interface name.
	DefaultDevice = "meshwg0"
	// Overhead is what WireGuard adds to a packet over IPv6 (IPv4 is 60):
	// the device's MTU is the underlay's less this.
	Overhead = 80
	// Keepalive keeps a NAT's mapping open toward a peer (seconds).
	Keepalive = 25
	// StaleAfter is when a peer's last handshake counts as old: WireGuard
	// renews a session every two minutes while traffic flows, and the
	// keepalive makes traffic flow.
	StaleAfter = 180 // seconds
)

// Node is a node of the mesh as the overlay sees it: its name, WireGuard
// public key (base64), UDP endpoint (IP:PORT) and overlay address.
type Node struct {
	Name, Key, Endpoint, Address string
}

// Peer is one peer of the device.
type Peer struct {
	Name     string
	KeyHex   string
	Endpoint netip.AddrPort
	Address  netip.Addr
}

// Want is the peer set of node self: every other node that has a key, an
// endpoint and an overlay address, each allowed exactly its own address,
// sorted by name. A node whose key or addresses do not parse is left out,
// and said so in problems; so is a second node with a key or an address
// already taken (the FSM refuses both; a damaged replica must not route
// one node's address to another).
func Want(self string, nodes []Node) (peers []Peer, problems []string) {
	sorted := append([]Node(nil), nodes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	keys, addrs := map[string]string{}, map[netip.Addr]string{}
	for _, n := range sorted {
		if n.Name == self {
			if a, err := netip.ParseAddr(n.Address); err == nil {
				addrs[a] = n.Name
			}
			if k, err := wgkey.PublicHex(n.Key); err == nil {
				keys[k] = n.Name
			}
		}
	}
	for _, n := range sorted {
		if n.Name == self || n.Key == "" || n.Address == "" || n.Endpoint == "" {
			continue
		}
		k, err := wgkey.PublicHex(n.Key)
		if err != nil {
			problems = append(problems, fmt.Sprintf("node %s: %v", n.Name, err))
			continue
		}
		a, err := netip.ParseAddr(n.Address)
		if err != nil || !a.Is4() {
			problems = append(problems, fmt.Sprintf("node %s: overlay address %q is not an IPv4 address", n.Name, n.Address))
			continue
		}
		ep, err := netip.ParseAddrPort(n.Endpoint)
		if err != nil {
			problems = append(problems, fmt.Sprintf("node %s: endpoint %q is not IP:PORT", n.Name, n.Endpoint))
			continue
		}
		if other, dup := keys[k]; dup {
			problems = append(problems, fmt.Sprintf("node %s: its key is also %s's; left out", n.Name, other))
			continue
		}
		if other, dup := addrs[a]; dup {
			problems = append(problems, fmt.Sprintf("node %s: its overlay address %s is also %s's; left out", n.Name, a, other))
			continue
		}
		keys[k], addrs[a] = n.Name, n.Name
		peers = append(peers, Peer{Name: n.Name, KeyHex: k, Endpoint: ep, Address: a})
	}
	return peers, problems
}

// change is what configuring the device from have to want tells WireGuard,
// in its configuration protocol (wireguard.com/xplatform): peers that went
// or whose key changed are removed; new ones are added with their endpoint,
// their one allowed address and the keepalive; a peer whose endpoint or
// address moved in the state gets them again. A peer that did not change is
// not mentioned, so its session and an endpoint it roamed to are kept.
// Empty when nothing changes.
func change(have, want []Peer) string {
	old := map[string]Peer{}
	for _, p := range have {
		old[p.KeyHex] = p
	}
	now := map[string]bool{}
	var b strings.Builder
	for _, p := range want {
		now[p.KeyHex] = true
		o, had := old[p.KeyHex]
		if had && o.Endpoint == p.Endpoint && o.Address == p.Address {
			continue
		}
		fmt.Fprintf(&b, "public_key=%s\n", p.KeyHex)
		if !had || o.Endpoint != p.Endpoint {
			fmt.Fprintf(&b, "endpoint=%s\n", p.Endpoint)
		}
		fmt.Fprintf(&b, "replace_allowed_ips=true\nallowed_ip=%s/32\n", p.Address)
		if !had {
			fmt.Fprintf(&b, "persistent_keepalive_interval=%d\n", Keepalive)
		}
	}
	for _, p := range have {
		if !now[p.KeyHex] {
			fmt.Fprintf(&b, "public_key=%s\nremove=true\n", p.KeyHex)
		}
	}
	return b.String()
}
