package overlay

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// FilterTable is the nftables table the mesh owns (family ip). It lives
// beside Podman's (netavark's) tables and never touches them: a packet
// dropped in any table is dropped.
const FilterTable = "mesh"

// The interfaces a packet for the overlay's prefix may arrive on: the
// overlay device itself, loopback (this host's own processes, and a
// rootless container's traffic, which slirp4netns sends from the host) and
// Podman's bridges, the modules' own among them (this node's rootful
// containers reaching a port of this node on its overlay address).
// Anything else (the LAN, the Internet) that routes the prefix to this
// node is dropped before routing.
var trustedPrefixes = []string{"lo", "podman", "cni-podman", ModuleBridges}

// rule is one rule of the filter, in the words of nft(8), with its
// expressions.
type rule struct {
	text  string
	exprs []expr.Any
}

// filterRules is the table's rules for prefix and device: the inbound
// chain (raw priority of prerouting) and the forward chain, where TCP
// handshakes that leave through the device get their MSS clamped to its
// MTU (a container's 1500-byte path is wider than the tunnel).
func filterRules(prefix netip.Prefix, device string) (in, fwd []rule) {
	accept := func(name string, exact bool) rule {
		b := []byte(name)
		text := fmt.Sprintf(`iifname "%s*" accept`, name)
		if exact {
			b = append(b, 0)
			text = fmt.Sprintf(`iifname "%s" accept`, name)
		}
		return rule{text, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}}
	}
	in = append(in, accept(device, true), accept(trustedPrefixes[0], true))
	for _, p := range trustedPrefixes[1:] {
		in = append(in, accept(p, false))
	}
	m := maskOf(prefix.Bits())
	in = append(in, rule{fmt.Sprintf("ip daddr %s drop", prefix), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: prefix.Masked().Addr().AsSlice()},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	dev := append([]byte(device), 0)
	fwd = append(fwd, rule{fmt.Sprintf(`oifname "%s" tcp flags & (syn|rst) == syn tcp option maxseg size set rt mtu`, device), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dev},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x06}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x02}},
		&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
		&expr.Exthdr{SourceRegister: 1, Type: 2, Offset: 2, Len: 2, Op: expr.ExthdrOpTcpopt},
	}})
	return in, fwd
}

func maskOf(bits int) []byte {
	m := uint32(0xffffffff) << (32 - bits)
	if bits == 0 {
		m = 0
	}
	return binaryutil.BigEndian.PutUint32(m)
}

// InstallFilter makes the mesh's table hold exactly the filter for prefix
// and device, in one transaction: whatever the table held before (an
// earlier overlay, a damaged edit) goes with it.
func InstallFilter(prefix netip.Prefix, device string) error {
	c, t, err := emptyTable(FilterTable)
	if err != nil {
		return err
	}
	rawPrio := nftables.ChainPriorityRaw
	manglePrio := nftables.ChainPriorityMangle
	accept := nftables.ChainPolicyAccept
	inChain := c.AddChain(&nftables.Chain{Name: "overlay-in", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: rawPrio, Policy: &accept})
	fwdChain := c.AddChain(&nftables.Chain{Name: "overlay-mss", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: manglePrio, Policy: &accept})
	in, fwd := filterRules(prefix, device)
	for _, r := range in {
		c.AddRule(&nftables.Rule{Table: t, Chain: inChain, Exprs: r.exprs})
	}
	for _, r := range fwd {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwdChain, Exprs: r.exprs})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install the overlay's packet filter (nftables table ip %s): %w", FilterTable, err)
	}
	return nil
}

// emptyTable opens a batch that makes the table called name (family ip)
// anew, empty, whatever it held.
func emptyTable(name string) (*nftables.Conn, *nftables.Table, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, nil, fmt.Errorf("talk to nftables: %w", err)
	}
	t := &nftables.Table{Name: name, Family: nftables.TableFamilyIPv4}
	// Deleting a table that does not exist fails the batch: add it first
	// (a no-op when it exists), then delete and make it again.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	return c, t, nil
}

// RemoveFilter deletes the mesh's table, if any.
func RemoveFilter() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: FilterTable, Family: nftables.TableFamilyIPv4}
	c.AddTable(t)
	c.DelTable(t)
	return c.Flush()
}
