package state

import (
	"database/sql"
	"fmt"
	"net/netip"
	"strconv"
)

// The mesh's private network (DESIGN.md rule 11). Each node has a
// WireGuard key pair; its public key, its UDP endpoint and its overlay
// address are replicated in its row. The FSM gives each node its address,
// deterministically, when the node brings its key: the next free host of
// the mesh's overlay prefix after the last one given, never the address of
// a node that exists.

// Overlay settings: the mesh's overlay prefix (a CIDR), OverlayOff for a
// mesh whose nodes already share a private network, or "" for a mesh made
// by a release before the overlay until its first node brings a key.
const (
	OverlayOff = "off"
	// DefaultOverlay is the prefix a mesh gets when `mesh init` is given
	// none, and that a mesh made by an earlier release takes up.
	DefaultOverlay = "100.90.0.0/16"
	// DefaultOverlayPort is a node's WireGuard UDP port.
	DefaultOverlayPort = 51820
)

// ParseOverlay checks an overlay setting: OverlayOff, or an IPv4 prefix
// with room for nodes (between /8 and /29), given as its network address.
func ParseOverlay(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil:
		return p, fmt.Errorf("%q is not a CIDR such as %s (or %q)", s, DefaultOverlay, OverlayOff)
	case !p.Addr().Is4():
		return p, fmt.Errorf("the overlay %s is not IPv4", s)
	case p.Bits() < 8 || p.Bits() > 29:
		return p, fmt.Errorf("the overlay %s is /%d; give a prefix between /8 and /29", s, p.Bits())
	case p.Masked() != p:
		return p, fmt.Errorf("the overlay %s has host bits set; write its network address, %s", s, p.Masked())
	}
	for _, r := range privateRanges {
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return p, nil
		}
	}
	return p, fmt.Errorf("the overlay %s is not in a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10): a public one would route others' addresses into the mesh", s)
}

// privateRanges are where an overlay may be: RFC 1918's, and the shared
// address space of RFC 6598 (where the default is).
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("100.64.0.0/10"),
}

// NodeOverlayRequest brings a node's overlay key and endpoint: a node of a
// mesh made by an earlier release gives them once every node can apply
// them, and one whose key changed gives it again. Prefix is the overlay a
// mesh without one takes up (the first such request sets it).
type NodeOverlayRequest struct {
	Node     string `json:"node"`
	Key      string `json:"key"`
	Endpoint string `json:"endpoint"`
	Prefix   string `json:"prefix,omitempty"`
}

func (*NodeOverlayRequest) Op() string { return OpNodeOverlay }
func (r *NodeOverlayRequest) describe() string {
	return "node " + r.Node + " joined the overlay"
}

func (ap *applier) nodeOverlay(r *NodeOverlayRequest) (bool, error) {
	if err := needNode(ap.tx, r.Node); err != nil {
		return false, err
	}
	if r.Key == "" || r.Endpoint == "" {
		return false, ruleErr(ErrInvalid, "node.overlay needs a key and an endpoint")
	}
	prefix, err := ap.overlay()
	if err != nil {
		return false, err
	}
	if prefix == OverlayOff {
		return false, ruleErr(ErrConflict, "this mesh's overlay is off (mesh init --overlay off)")
	}
	if prefix == "" {
		if _, err := ParseOverlay(r.Prefix); err != nil {
			return false, ruleErr(ErrInvalid, "%v", err)
		}
		prefix = r.Prefix
		if err := exec(ap.tx, `INSERT INTO settings (key, value) VALUES ('overlay', ?)`, prefix); err != nil {
			return false, err
		}
	}
	if err := refuseIf(ap.tx, ruleErr(ErrConflict, "another node already holds that overlay key"), `SELECT 1 FROM nodes WHERE overlay_key = ? AND name != ?`, r.Key, r.Node); err != nil {
		return false, err
	}
	if err := exec(ap.tx, `UPDATE nodes SET overlay_key = ?, overlay_endpoint = ? WHERE name = ?`, r.Key, r.Endpoint, r.Node); err != nil {
		return false, err
	}
	return true, ap.giveOverlayAddress(r.Node, prefix)
}

// overlay is the mesh's overlay setting ("" for a mesh that has none yet).
func (ap *applier) overlay() (string, error) {
	var v string
	err := ap.tx.QueryRow(`SELECT value FROM settings WHERE key = 'overlay'`).Scan(&v)
	if err == sql.ErrNoRows {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the overlay setting: %w", err)
	}
	return v, nil
}

// giveOverlayAddress gives node, which has a key, the next free address of
// prefix after the last one given (wrapping round), unless it has one.
func (ap *applier) giveOverlayAddress(node, prefix string) error {
	var have string
	if err := ap.tx.QueryRow(`SELECT overlay_address FROM nodes WHERE name = ?`, node).Scan(&have); err != nil {
		return fmt.Errorf("read the overlay address of %s: %w", node, err)
	}
	if have != "" {
		return nil
	}
	p, err := ParseOverlay(prefix)
	if err != nil {
		return ruleErr(ErrInvalid, "the mesh's overlay setting %q is damaged: %v", prefix, err)
	}
	used := map[string]bool{}
	addrs, err := listRows(ap.tx, `SELECT overlay_address FROM nodes WHERE overlay_address != ''`)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		used[a] = true
	}
	next := uint32(1)
	var v string
	switch err := ap.tx.QueryRow(`SELECT value FROM settings WHERE key = 'overlay_next'`).Scan(&v); {
	case err == nil:
		n, _ := strconv.ParseUint(v, 10, 32)
		next = uint32(n)
	case err != sql.ErrNoRows:
		return fmt.Errorf("read the next overlay address: %w", err)
	}
	hosts := uint32(1)<<(32-p.Bits()) - 2 // less the network and broadcast addresses
	base := p.Addr().As4()
	b := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	for tried := uint32(0); tried < hosts; tried++ {
		if next < 1 || next > hosts {
			next = 1
		}
		a := b + next
		addr := netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}).String()
		next++
		if used[addr] {
			continue
		}
		if err := exec(ap.tx, `UPDATE nodes SET overlay_address = ? WHERE name = ?`, addr, node); err != nil {
			return err
		}
		return exec(ap.tx, `INSERT INTO settings (key, value) VALUES ('overlay_next', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`, strconv.FormatUint(uint64(next), 10))
	}
	return ruleErr(ErrConflict, "the overlay %s has no free address left for %s", prefix, node)
}

// overlayActive says whether the mesh's names and internal ports are on the
// overlay: its overlay is a prefix and every node has an overlay address.
// Until the last node of a mesh made by an earlier release has brought its
// key, names keep answering the nodes' mesh addresses and ports stay where
// they were published, so that an upgrade node by node never cuts a node
// off.
func (in *Input) overlayActive() bool {
	if in.Overlay == "" || in.Overlay == OverlayOff {
		return false
	}
	for _, n := range in.Nodes {
		if n.OverlayAddress == "" {
			return false
		}
	}
	return len(in.Nodes) > 0
}

// nameAddress is the address the mesh's names give for node n.
func (in *Input) nameAddress(n Node) string {
	if in.overlayActive() {
		return n.OverlayAddress
	}
	return n.Address
}

// publishAddress is where node n publishes its containers' internal ports:
// its overlay address, its mesh address when the overlay is off, or every
// interface ("") while a mesh made by an earlier release upgrades.
func (in *Input) publishAddress(n Node) string {
	switch {
	case in.overlayActive():
		return n.OverlayAddress
	case in.Overlay == OverlayOff:
		return n.Address
	}
	return ""
}
