package overlay

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
)

// IsolateTable is the nftables table (family ip) that keeps each module's
// containers to themselves on a rootful node (reconciler/network.go gives
// each module a bridge of its own). It is apart from the overlay's table:
// a node without the overlay needs it as much.
const IsolateTable = "mesh-modules"

// ModuleBridges begins the interface name of every module's bridge
// (reconciler.BridgePrefix, which a test holds equal).
const ModuleBridges = "meshm"

// isolateRule is the one rule of the table's forward chain: a new
// connection into a module's bridge is dropped unless Podman's port
// forwarding sent it there (a published port, which every node of the mesh
// may reach anyway) or it stays on the bridge it came from (the module's
// own containers, which reach the forward hook only where br_netfilter is
// loaded). What it drops: another module's container, a container of the
// operator's own on Podman's default bridge, a host of the LAN or a peer
// of the overlay routing a container's address to this node.
func isolateRule() rule {
	return rule{
		text: fmt.Sprintf(`oifname "%s*" ct state new ct status & dnat == 0 fib daddr . iif oif missing drop`, ModuleBridges),
		exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(ModuleBridges)},
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hostOrder(expr.CtStateBitNEW), Xor: hostOrder(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: hostOrder(0)},
			&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hostOrder(ipsDstNAT), Xor: hostOrder(0)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: hostOrder(0)},
			&expr.Fib{Register: 1, FlagDADDR: true, FlagIIF: true, ResultOIF: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: hostOrder(0)},
			&expr.Verdict{Kind: expr.VerdictDrop},
		},
	}
}

// ipsDstNAT is conntrack's status bit of a connection whose destination
// was translated (IPS_DST_NAT in linux/netfilter/nf_conntrack_common.h).
const ipsDstNAT = 1 << 5

// hostOrder is v in the host's byte order, the order of conntrack's state and
// status bits and of an interface index in a register.
func hostOrder(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }

// InstallIsolation makes the isolation table hold exactly its rule, in one
// transaction.
func InstallIsolation() error {
	c, t, err := emptyTable(IsolateTable)
	if err != nil {
		return err
	}
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "into-modules", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: isolateRule().exprs})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install the modules' packet filter (nftables table ip %s): %w", IsolateTable, err)
	}
	return nil
}

// DeleteIdleBridge removes the bridge called name when it is there with no
// interface attached: what is left of a module's network whose
// configuration went without `podman network rm` (Podman's CNI backend
// deletes a network's bridge only then). Left, it kept the subnet of the
// network it served, and the module's next network, given another subnet,
// could not use it ("already has an IP address different from ...").
// One with interfaces attached (containers of another Podman on this host)
// is left, and said.
func DeleteIdleBridge(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("look for interface %s: %w", name, err)
	}
	if l.Type() != "bridge" {
		return fmt.Errorf("an interface named %s is there and is not a bridge; remove it (ip link del %s)", name, name)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list interfaces: %w", err)
	}
	for _, o := range links {
		if o.Attrs().MasterIndex == l.Attrs().Index {
			return fmt.Errorf("the bridge %s is left from a network that is gone, and %s is still attached to it (a container of another Podman on this host?); remove it when that is over (ip link del %s)", name, o.Attrs().Name, name)
		}
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("remove the bridge %s left from a network that is gone: %w", name, err)
	}
	return nil
}
