package dnsd

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/miekg/dns"
)

// The reverse names of the overlay (RFC 6303: the reverse zones of private
// space are answered locally). Servers in containers (sshd, postfix, nginx,
// databases) look up the address of every peer that connects; forwarded,
// each lookup of a node's overlay address told the host's upstream (the VPS
// provider's resolver, or a public one) who talks to whom in the mesh, and
// the connection waited for its NXDOMAIN.
//
// A node's overlay address answers a PTR with the node's name; every other
// name inside the prefix is answered NXDOMAIN, with authority. Reverse
// names outside the prefix are forwarded as before (a home router may
// answer its LAN's), also those of the zone around a prefix that does not
// end on an octet boundary (a /12, a /10): what is answered here is decided
// by the address a name stands for, never by the zone it is in.

// inAddrArpa is the tail of every IPv4 reverse name.
const inAddrArpa = "in-addr.arpa."

// WithOverlay is ix answering the reverse names of prefix, the mesh's
// overlay: a PTR for each address of nodes with the name it maps to (its
// node's name, any case, with or without the final dot), NXDOMAIN for every
// other name inside the prefix. An invalid prefix (the overlay is off, or
// the mesh has none yet) leaves every reverse name forwarded, as does an
// IPv6 one: the overlay is IPv4 only (state.ParseOverlay), so ip6.arpa is
// never the mesh's. ix is left as it is.
func (ix *Index) WithOverlay(prefix netip.Prefix, nodes map[netip.Addr]string) *Index {
	next := *ix
	next.overlay, next.nodes = netip.Prefix{}, nil
	if prefix.IsValid() && prefix.Addr().Is4() {
		next.overlay = prefix.Masked()
		next.nodes = make(map[netip.Addr]string, len(nodes))
		for a, n := range nodes {
			if next.overlay.Contains(a) {
				next.nodes[a] = fqdn(n)
			}
		}
	}
	return &next
}

// reverse answers name (lower-case, fully qualified) when it is a reverse
// name inside the overlay; ok is false for every other name.
func (ix *Index) reverse(name string, q dns.Question, ttl uint32) (r Result, ok bool) {
	if !ix.overlay.IsValid() || !strings.HasSuffix(name, inAddrArpa) {
		return Result{}, false
	}
	named, junk, ok := parseReverse4(name)
	// Ours is a name whose octets name a network inside the overlay: an
	// address of it, or a network of whole octets that lies within it. A
	// name of a wider network ("100.in-addr.arpa." for 100.90.0.0/16) is
	// not: other addresses are under it.
	if !ok || named.Bits() < ix.overlay.Bits() || !ix.overlay.Contains(named.Addr()) {
		return Result{}, false
	}
	zone, zoneBits := reverseZone(ix.overlay, named.Addr())
	r = Result{Rcode: dns.RcodeSuccess, Authoritative: true}
	nodata := func() Result {
		r.Ns = []dns.RR{ix.soaOf(zone, ix.domain, ttl)}
		return r
	}
	nxdomain := func() Result {
		r.Rcode = dns.RcodeNameError
		return nodata()
	}
	switch {
	case junk:
		// Nothing of ours has a label that is not an octet, nor
		// anything under an address's name.
		return nxdomain(), true
	case named.IsSingleIP():
		node, known := ix.nodes[named.Addr()]
		if !known {
			return nxdomain(), true
		}
		if q.Qtype != dns.TypePTR && q.Qtype != dns.TypeANY {
			return nodata(), true
		}
		r.Answer = []dns.RR{&dns.PTR{Hdr: hdr(q.Name, dns.TypePTR, ttl), Ptr: node}}
		return r, true
	case named.Bits() == zoneBits:
		switch q.Qtype {
		case dns.TypeSOA:
			r.Answer = []dns.RR{ix.soaOf(zone, ix.domain, ttl)}
			return r, true
		case dns.TypeNS:
			r.Answer = []dns.RR{&dns.NS{Hdr: hdr(zone, dns.TypeNS, ttl), Ns: "ns." + ix.domain}}
			return r, true
		}
		return nodata(), true
	}
	// A network between the zone and the addresses exists when a node's
	// address is under it (an empty non-terminal: NODATA). NXDOMAIN there
	// would tell a resolver that follows RFC 8020 that the node's own
	// name does not exist either.
	for a := range ix.nodes {
		if named.Contains(a) {
			return nodata(), true
		}
	}
	return nxdomain(), true
}

// reverseZone is the reverse zone addr is answered in, and the bits of the
// network it is the name of: the overlay's network rounded to whole octets
// (RFC 6303: 100.64.0.0/10 is the zones 64.100.in-addr.arpa. to
// 127.100.in-addr.arpa.), or the /24 around addr when the overlay is longer
// (an SOA at an address's own name would say that name exists).
func reverseZone(overlay netip.Prefix, addr netip.Addr) (string, int) {
	bits := min((overlay.Bits()+7)/8*8, 24)
	a := addr.As4()
	var b strings.Builder
	for i := bits/8 - 1; i >= 0; i-- {
		b.WriteString(strconv.Itoa(int(a[i])))
		b.WriteByte('.')
	}
	b.WriteString(inAddrArpa)
	return b.String(), bits
}

// parseReverse4 reads name, lower-case and fully qualified, as a name of
// the IPv4 reverse tree: named is the network its octets name, read from
// the right ("2.1.in-addr.arpa." is 1.2.0.0/16, "4.3.2.1.in-addr.arpa." the
// address 1.2.3.4), and junk says more labels follow that are not octets
// (or are a fifth): "x.1.in-addr.arpa.", "300.1.in-addr.arpa.", "01.1.in-addr.arpa.".
// ok is false for a name not under in-addr.arpa.
func parseReverse4(name string) (named netip.Prefix, junk, ok bool) {
	var a [4]byte
	n := 0
	if name != inAddrArpa {
		cut := len(name) - len(inAddrArpa) - 1
		if cut < 0 || name[cut] != '.' || escaped(name, cut) {
			return netip.Prefix{}, false, false // "x\.in-addr.arpa." has a label "x.in-addr"
		}
		for rest := name[:cut]; ; {
			i := strings.LastIndexByte(rest, '.')
			label := rest[i+1:]
			// A dot that is escaped is part of a label, which is then no
			// octet ("2\.1" is one label, not "2" and "1").
			v, isOctet := octet(label)
			if n == 4 || !isOctet || i >= 0 && escaped(rest, i) {
				junk = true
				break
			}
			a[n] = v
			n++
			if i < 0 {
				break
			}
			rest = rest[:i]
		}
	}
	return netip.PrefixFrom(netip.AddrFrom4(a), 8*n), junk, true
}

// octet reads a label as an octet as a reverse name writes it: decimal,
// 0 to 255, without leading zeros.
func octet(label string) (byte, bool) {
	if len(label) == 0 || len(label) > 3 || len(label) > 1 && label[0] == '0' {
		return 0, false
	}
	v := 0
	for i := 0; i < len(label); i++ {
		c := label[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	if v > 255 {
		return 0, false
	}
	return byte(v), true
}

// escaped says the character at i of a name in presentation form is
// escaped: an odd number of backslashes stands before it.
func escaped(s string, i int) bool {
	k := 0
	for j := i - 1; j >= 0 && s[j] == '\\'; j-- {
		k++
	}
	return k%2 == 1
}
