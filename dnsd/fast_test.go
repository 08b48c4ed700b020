package dnsd

import (
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// fastServer serves a few names, one with more addresses than 512
// bytes hold, and the reverse names of an overlay.
func fastServer(t testing.TB) *Server {
	s, err := New(Config{Addr: "127.0.0.1:0"}, "internal")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string][]netip.Addr{
		"ace.internal":   {netip.MustParseAddr("10.0.0.1")},
		"novox.internal": {netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")},
		"git.zurag.be":   {netip.MustParseAddr("10.0.0.2")},
		"v6.internal":    {netip.MustParseAddr("fd00::6")},
	}
	for i := 0; i < 40; i++ {
		names["many.internal"] = append(names["many.internal"], netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}))
	}
	// The overlay's reverse names are the general path's alone.
	overlay := map[netip.Addr]string{netip.MustParseAddr("100.90.0.1"): "ace.internal"}
	s.SetIndex(NewIndex("internal", names, 42).WithOverlay(netip.MustParsePrefix("100.90.0.0/16"), overlay))
	return s
}

// generalReply is the reply the general path gives to pkt, packed as the
// UDP server sends it, or nil when it gives none.
func generalReply(s *Server, pkt []byte, src netip.Addr) []byte {
	req := new(dns.Msg)
	if req.Unpack(pkt) != nil {
		return nil
	}
	resp, forward := s.local(req, src)
	if forward || resp == nil {
		return nil
	}
	b, err := udpReply(resp, req, nil)
	if err != nil {
		return nil
	}
	return b
}

func queryBytes(t testing.TB, name string, qtype uint16, edns func(m *dns.Msg)) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 4242
	if edns != nil {
		edns(m)
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkAgrees fails when the fast path answers pkt differently from the
// general one; it says whether the fast path answered.
func checkAgrees(t *testing.T, s *Server, pkt []byte, src netip.Addr) bool {
	fast, _, ok := s.fastReply(s.index.Load(), pkt, src, make([]byte, 0, 512))
	if !ok {
		return false
	}
	general := generalReply(s, pkt, src)
	if general == nil {
		t.Fatalf("the fast path answered %x, the general path does not", pkt)
	}
	f, g := new(dns.Msg), new(dns.Msg)
	if err := f.Unpack(fast); err != nil {
		t.Fatalf("the fast path's reply to %x does not unpack: %v (%x)", pkt, err, fast)
	}
	if err := g.Unpack(general); err != nil {
		t.Fatal(err)
	}
	if f.String() != g.String() {
		t.Fatalf("query %x\nfast path:\n%s\ngeneral path:\n%s", pkt, f, g)
	}
	return true
}

func TestFastPathTakesTheCommonQueries(t *testing.T) {
	s := fastServer(t)
	lo := netip.MustParseAddr("127.0.0.1")
	for _, tc := range []struct {
		name  string
		qtype uint16
		edns  func(*dns.Msg)
		fast  bool
	}{
		{"ace.internal.", dns.TypeA, nil, true},
		{"ACE.Internal.", dns.TypeA, nil, true},
		{"novox.internal.", dns.TypeAAAA, nil, true},
		{"ace.internal.", dns.TypeAAAA, nil, true},                                      // NODATA
		{"nope.internal.", dns.TypeA, nil, true},                                        // NXDOMAIN
		{"ace.internal.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, true) }, true}, // DO copied
		{"ace.internal.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false); m.CheckingDisabled = true; m.RecursionDesired = false }, true},
		{"ace.internal.", dns.TypeA, func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
		}, true},
		{"many.internal.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(4096, false) }, true},
		// Options other than cookies (client subnet here) take the general path.
		{"ace.internal.", dns.TypeA, func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(192, 0, 2, 0)})
		}, false},
		// The general path's: truncation, other types, the apex, routed and
		// forwarded names, ns.DOMAIN, EDNS versions, other opcodes.
		{"many.internal.", dns.TypeA, nil, false},
		{"ace.internal.", dns.TypeMX, nil, false},
		{"internal.", dns.TypeA, nil, false},
		{"git.zurag.be.", dns.TypeA, nil, false},
		{"example.org.", dns.TypeA, nil, false},
		{"ns.internal.", dns.TypeA, nil, false},
		{"ace.internal.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false); m.IsEdns0().SetVersion(1) }, false},
		{"ace.internal.", dns.TypeA, func(m *dns.Msg) { m.Opcode = dns.OpcodeStatus }, false},
		{`a\.b.internal.`, dns.TypeA, nil, false},
	} {
		pkt := queryBytes(t, tc.name, tc.qtype, tc.edns)
		if got := checkAgrees(t, s, pkt, lo); got != tc.fast {
			t.Errorf("%s %s: fast path %v, want %v", tc.name, dns.TypeToString[tc.qtype], got, tc.fast)
		}
	}
	// A source that is not allowed is refused by the general path.
	if checkAgrees(t, s, queryBytes(t, "ace.internal.", dns.TypeA, nil), netip.MustParseAddr("192.0.2.9")) {
		t.Error("the fast path answered a source that is not allowed")
	}
}

// FuzzFastPathAgrees: whenever the fast path answers a datagram, its reply
// is the general path's, record for record.
func FuzzFastPathAgrees(f *testing.F) {
	for _, name := range append([]string{"ace.internal.", "NOVOX.internal.", "nope.internal.", "many.internal.", "v6.internal.", "internal.", "git.zurag.be."}, reverseSeeds...) {
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
			f.Add(queryBytes(f, name, qt, nil))
			f.Add(queryBytes(f, name, qt, func(m *dns.Msg) { m.SetEdns0(1232, true) }))
		}
	}
	s := fastServer(f)
	lo := netip.MustParseAddr("127.0.0.1")
	f.Fuzz(func(t *testing.T, pkt []byte) {
		checkAgrees(t, s, pkt, lo)
	})
}

// BenchmarkServeQuery: one query answered, datagram to datagram, by the
// fast path and by the general path.
func BenchmarkServeQuery(b *testing.B) {
	s := fastServer(b)
	lo := netip.MustParseAddr("127.0.0.1")
	for _, q := range []struct {
		label string
		pkt   []byte
	}{
		{"A", queryBytes(b, "ace.internal.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false) })},
		{"NXDOMAIN", queryBytes(b, "nope.internal.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false) })},
	} {
		b.Run("fast/"+q.label, func(b *testing.B) {
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, _, ok := s.fastReply(s.index.Load(), q.pkt, lo, buf); !ok {
					b.Fatal("not fast")
				}
			}
		})
		b.Run("general/"+q.label, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if generalReply(s, q.pkt, lo) == nil {
					b.Fatal("no reply")
				}
			}
		})
	}
}
