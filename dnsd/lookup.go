// Package dnsd is the node's resolver: it answers the mesh's names from the
// node's own replica at lookup time, and forwards everything else upstream.
//
// The lookup is pure: an immutable Index, built from the roster after each
// change and swapped in atomically, answers a question with a typed Result.
// The Server only adapts miekg/dns to it. dnsd never imports cluster or state;
// it takes names and addresses in stdlib types.
package dnsd

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"
)

// DefaultTTL bounds how stale an answer can be (plus replication lag).
const DefaultTTL = 5

// Index is an immutable snapshot of the names the mesh answers. Build a new
// one for every change (NewIndex, or With for a few names); never modify one
// that is being served.
type Index struct {
	// domain is the mesh zone, fully qualified and lower-case ("internal.").
	domain string
	// names are the names' addresses, in shards by a hash of the name, so
	// that a change of a few names (With) copies the shards they fall in,
	// not every name of a large fleet.
	names  [shardCount]map[string][]netip.Addr
	serial uint32
	// ns is the address the zone's NS target (ns.DOMAIN) answers with: the
	// resolver's own (set by the server that serves the index).
	ns netip.Addr
	// soaWire is the zone's SOA in wire form with the server's TTL, for the
	// fast path (set by the server that serves the index).
	soaWire []byte
	// overlay is the mesh's overlay prefix (IPv4), invalid when there is
	// none; nodes is the name each node's address on it answers a PTR
	// with. The reverse names inside the prefix are answered here
	// (reverse.go, WithOverlay).
	overlay netip.Prefix
	nodes   map[netip.Addr]string
}

// shardCount is how many shards the names are kept in: at 10,000 names,
// a change copies about 40.
const shardCount = 256

// shardOf is the shard of a name (FNV-1a), given as a string or as bytes.
func shardOf[T string | []byte](k T) int {
	h := uint32(2166136261)
	for i := 0; i < len(k); i++ {
		h = (h ^ uint32(k[i])) * 16777619
	}
	return int(h % shardCount)
}

// get is a name's addresses, the name fully qualified and lower-case.
func (ix *Index) get(k string) ([]netip.Addr, bool) {
	a, ok := ix.names[shardOf(k)][k]
	return a, ok
}

// getBytes is get for a name in bytes, without a copy of it.
func (ix *Index) getBytes(k []byte) ([]netip.Addr, bool) {
	a, ok := ix.names[shardOf(k)][string(k)]
	return a, ok
}

// forServer is ix as a server serves it: ns.DOMAIN answering with addr, the
// SOA packed with ttl (a shallow copy: the maps are shared and never
// written).
func (ix *Index) forServer(addr netip.Addr, ttl uint32) *Index {
	c := *ix
	c.ns = addr
	c.soaWire = packSOA(&c, ttl)
	return &c
}

// NewIndex builds an index. names maps a name (any case, with or without the
// final dot) to its addresses; domain is the mesh domain; serial is the
// replica's version, used as the SOA serial.
func NewIndex(domain string, names map[string][]netip.Addr, serial uint32) *Index {
	ix := &Index{domain: fqdn(domain), serial: serial}
	for i := range ix.names {
		ix.names[i] = map[string][]netip.Addr{}
	}
	for n, addrs := range names {
		k := fqdn(n)
		sh := ix.names[shardOf(k)]
		sh[k] = sortedAddrs(append(sh[k], addrs...))
	}
	return ix
}

func sortedAddrs(a []netip.Addr) []netip.Addr {
	a = slices.Clone(a)
	slices.SortFunc(a, netip.Addr.Compare)
	return a
}

// With is ix with the names of changes answering their addresses instead,
// and those given no address removed; serial is the new version. It copies
// only the shards those names fall in: ix is left as it is, and the two
// share every other shard (neither is ever written).
func (ix *Index) With(changes map[string][]netip.Addr, serial uint32) *Index {
	next := *ix
	next.serial, next.ns, next.soaWire = serial, netip.Addr{}, nil
	var copied [shardCount]bool
	for n, addrs := range changes {
		k := fqdn(n)
		i := shardOf(k)
		if !copied[i] {
			copied[i] = true
			next.names[i] = maps.Clone(ix.names[i])
			if next.names[i] == nil {
				next.names[i] = map[string][]netip.Addr{}
			}
		}
		if len(addrs) == 0 {
			delete(next.names[i], k)
		} else {
			next.names[i][k] = sortedAddrs(addrs)
		}
	}
	return &next
}

// Names is how many names ix answers.
func (ix *Index) Names() int {
	n := 0
	for _, sh := range ix.names {
		n += len(sh)
	}
	return n
}

// Equal says a and b answer the same names with the same addresses, in the
// same zone, and the same reverse names of the overlay (for tests of what
// With builds).
func (a *Index) Equal(b *Index) bool {
	if a.domain != b.domain || a.Names() != b.Names() || a.overlay != b.overlay || !maps.Equal(a.nodes, b.nodes) {
		return false
	}
	for _, sh := range a.names {
		for k, v := range sh {
			w, ok := b.get(k)
			if !ok || !slices.Equal(v, w) {
				return false
			}
		}
	}
	return true
}

func fqdn(n string) string { return dns.Fqdn(strings.ToLower(n)) }

// Result is what the index says about a question.
type Result struct {
	// Forward: the name is not the mesh's to answer; ask upstream.
	Forward bool
	Rcode   int
	Answer  []dns.RR
	Ns      []dns.RR
	// Authoritative is set for answers from the mesh zone.
	Authoritative bool
}

// Lookup answers one question. Names in the mesh domain are answered with
// authority (NXDOMAIN for unknown names, NODATA for a type a name lacks, SOA
// and NS at the apex), and so are the reverse names of the overlay
// (reverse.go). In a public domain only routed names are answered;
// everything else there, and every other name, is forwarded: the public
// domain's own records live elsewhere.
func (ix *Index) Lookup(q dns.Question, ttl uint32) Result {
	name := lower(q.Name)
	if q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY {
		return Result{Forward: true}
	}
	if r, ok := ix.reverse(name, q, ttl); ok {
		return r
	}
	addrs, known := ix.get(name)
	if !known && ix.ns.IsValid() && name == "ns."+ix.domain {
		// The NS record's target must resolve (RFC 1034 4.2.1): to this
		// resolver, unless a module took the name.
		addrs, known = []netip.Addr{ix.ns}, true
	}
	inZone := dns.IsSubDomain(ix.domain, name)
	if !inZone && !known {
		return Result{Forward: true}
	}
	zone := ix.domain
	if !inZone {
		zone = name[strings.IndexByte(name, '.')+1:]
	}
	r := Result{Rcode: dns.RcodeSuccess, Authoritative: true}
	switch {
	case name == ix.domain && q.Qtype == dns.TypeSOA:
		r.Answer = []dns.RR{ix.soa(zone, ttl)}
		return r
	case name == ix.domain && q.Qtype == dns.TypeNS:
		r.Answer = []dns.RR{&dns.NS{Hdr: hdr(zone, dns.TypeNS, ttl), Ns: "ns." + zone}}
		return r
	case !known && name != ix.domain:
		r.Rcode = dns.RcodeNameError
		r.Ns = []dns.RR{ix.soa(zone, ttl)}
		return r
	}
	for _, a := range addrs {
		switch {
		case a.Is4() && (q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY):
			r.Answer = append(r.Answer, &dns.A{Hdr: hdr(q.Name, dns.TypeA, ttl), A: a.AsSlice()})
		case a.Is6() && (q.Qtype == dns.TypeAAAA || q.Qtype == dns.TypeANY):
			r.Answer = append(r.Answer, &dns.AAAA{Hdr: hdr(q.Name, dns.TypeAAAA, ttl), AAAA: a.AsSlice()})
		}
	}
	if len(r.Answer) == 0 {
		r.Ns = []dns.RR{ix.soa(zone, ttl)} // NODATA
	}
	return r
}

// lower folds ASCII case without allocating when there is nothing to fold.
func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

func hdr(name string, t uint16, ttl uint32) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
}

func (ix *Index) soa(zone string, ttl uint32) dns.RR { return ix.soaOf(zone, zone, ttl) }

// soaOf is zone's SOA naming the name server and mailbox of domain: the
// zone itself, or the mesh domain for the overlay's reverse zones (whose
// name server is this resolver, ns.DOMAIN).
func (ix *Index) soaOf(zone, domain string, ttl uint32) dns.RR {
	return &dns.SOA{
		Hdr: hdr(zone, dns.TypeSOA, ttl), Ns: "ns." + domain, Mbox: "hostmaster." + domain,
		Serial: ix.serial, Refresh: 60, Retry: 30, Expire: 600, Minttl: ttl,
	}
}
