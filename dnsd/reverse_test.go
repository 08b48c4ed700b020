package dnsd

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// overlayIndex is testIndex answering the reverse names of prefix, with
// nodes mapping overlay addresses to node names.
func overlayIndex(prefix string, nodes map[string]string) *Index {
	byAddr := map[netip.Addr]string{}
	for a, n := range nodes {
		byAddr[netip.MustParseAddr(a)] = n
	}
	return testIndex().WithOverlay(netip.MustParsePrefix(prefix), byAddr)
}

// revSOA is the SOA of a reverse zone of the overlay, as the tests'
// index gives it.
func revSOA(zone string) string {
	return zone + " 5 IN SOA ns.internal. hostmaster.internal. 42 60 30 600 5"
}

// The reverse names of the overlay are answered here: a node's address
// with its name, every other name inside the prefix NXDOMAIN; the reverse
// names outside it are forwarded, also those of the zone around a prefix
// that does not end on an octet boundary.
func TestReverseNamesOfTheOverlay(t *testing.T) {
	def := overlayIndex("100.90.0.0/16", map[string]string{"100.90.0.1": "ace.internal", "100.90.1.2": "novox.internal."})
	twelve := overlayIndex("172.16.0.0/12", map[string]string{"172.20.0.5": "ace.internal"})
	ten := overlayIndex("100.64.0.0/10", map[string]string{"100.127.0.1": "ace.internal"})
	small := overlayIndex("10.1.2.8/29", map[string]string{"10.1.2.9": "ace.internal"})
	nxdomain, ok := dns.RcodeNameError, dns.RcodeSuccess
	zone := revSOA("90.100.in-addr.arpa.")
	for _, tc := range []struct {
		ix      *Index
		name    string
		qtype   uint16
		forward bool
		rcode   int
		answer  []string
		ns      []string
	}{
		// A node's overlay address, in any case and for PTR or ANY.
		{def, "1.0.90.100.in-addr.arpa.", dns.TypePTR, false, ok, []string{"1.0.90.100.in-addr.arpa. 5 IN PTR ace.internal."}, nil},
		{def, "2.1.90.100.in-addr.arpa.", dns.TypePTR, false, ok, []string{"2.1.90.100.in-addr.arpa. 5 IN PTR novox.internal."}, nil},
		{def, "1.0.90.100.IN-ADDR.Arpa.", dns.TypePTR, false, ok, []string{"1.0.90.100.IN-ADDR.Arpa. 5 IN PTR ace.internal."}, nil},
		{def, "1.0.90.100.in-addr.arpa.", dns.TypeANY, false, ok, []string{"1.0.90.100.in-addr.arpa. 5 IN PTR ace.internal."}, nil},
		// Other types there: NODATA.
		{def, "1.0.90.100.in-addr.arpa.", dns.TypeA, false, ok, nil, []string{zone}},
		// Unused addresses and networks of the prefix: NXDOMAIN, with the
		// zone's SOA; a network with a node's address under it is there.
		{def, "9.0.90.100.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{zone}},
		{def, "255.255.90.100.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{zone}},
		{def, "7.90.100.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{zone}},
		{def, "0.90.100.in-addr.arpa.", dns.TypePTR, false, ok, nil, []string{zone}},
		// The zone's apex.
		{def, "90.100.in-addr.arpa.", dns.TypeSOA, false, ok, []string{zone}, nil},
		{def, "90.100.in-addr.arpa.", dns.TypeNS, false, ok, []string{"90.100.in-addr.arpa. 5 IN NS ns.internal."}, nil},
		{def, "90.100.in-addr.arpa.", dns.TypePTR, false, ok, nil, []string{zone}},
		// Malformed names inside the prefix: NXDOMAIN.
		{def, "300.1.90.100.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{zone}},
		{def, "01.0.90.100.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{zone}},
		{def, "x.1.0.90.100.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{zone}},
		{def, "1.1.0.90.100.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{zone}},
		{def, `1\.0.90.100.in-addr.arpa.`, dns.TypePTR, false, nxdomain, nil, []string{zone}},
		{def, "1..90.100.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{zone}},
		// Outside the prefix: forwarded, malformed or not.
		{def, "1.0.91.100.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{def, "1.0.168.192.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{def, "8.8.8.8.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{def, "100.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{def, "in-addr.arpa.", dns.TypeSOA, true, 0, nil, nil},
		{def, "1.2.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{def, "300.100.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{def, `1.0.90.100\.in-addr.arpa.`, dns.TypePTR, true, 0, nil, nil},
		{def, `x\.in-addr.arpa.`, dns.TypePTR, true, 0, nil, nil},
		{def, "1.0.90.100.in-addr.arpa.example.org.", dns.TypePTR, true, 0, nil, nil},
		{def, "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR, true, 0, nil, nil},
		// A /12: its /16 zones (RFC 6303's 16.172 to 31.172) answered,
		// the rest of 172.in-addr.arpa. forwarded.
		{twelve, "5.0.20.172.in-addr.arpa.", dns.TypePTR, false, ok, []string{"5.0.20.172.in-addr.arpa. 5 IN PTR ace.internal."}, nil},
		{twelve, "6.0.20.172.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{revSOA("20.172.in-addr.arpa.")}},
		{twelve, "255.255.31.172.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{revSOA("31.172.in-addr.arpa.")}},
		{twelve, "16.172.in-addr.arpa.", dns.TypeSOA, false, ok, []string{revSOA("16.172.in-addr.arpa.")}, nil},
		{twelve, "255.255.15.172.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{twelve, "0.0.32.172.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{twelve, "172.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		// A /10 (RFC 6598's shared space, where the default is).
		{ten, "1.0.127.100.in-addr.arpa.", dns.TypePTR, false, ok, []string{"1.0.127.100.in-addr.arpa. 5 IN PTR ace.internal."}, nil},
		{ten, "1.0.64.100.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{revSOA("64.100.in-addr.arpa.")}},
		{ten, "1.0.128.100.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{ten, "1.0.63.100.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		// A /29: its eight addresses, in the /24 zone around them; the
		// rest of that zone, its apex included, forwarded.
		{small, "9.2.1.10.in-addr.arpa.", dns.TypePTR, false, ok, []string{"9.2.1.10.in-addr.arpa. 5 IN PTR ace.internal."}, nil},
		{small, "15.2.1.10.in-addr.arpa.", dns.TypePTR, false, nxdomain, nil, []string{revSOA("2.1.10.in-addr.arpa.")}},
		{small, "16.2.1.10.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{small, "7.2.1.10.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{small, "2.1.10.in-addr.arpa.", dns.TypeSOA, true, 0, nil, nil},
		// Without an overlay (off, or none yet) every reverse name is
		// forwarded, as is every one of an IPv6 prefix.
		{testIndex(), "1.0.90.100.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{testIndex().WithOverlay(netip.Prefix{}, nil), "1.0.90.100.in-addr.arpa.", dns.TypePTR, true, 0, nil, nil},
		{overlayIndex("fd00::/64", nil), "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR, true, 0, nil, nil},
		// The mesh's names are answered as before.
		{def, "ace.internal.", dns.TypeA, false, ok, []string{"ace.internal. 5 IN A 10.0.0.1"}, nil},
	} {
		t.Run(tc.ix.overlay.String()+"/"+tc.name+"/"+dns.TypeToString[tc.qtype], func(t *testing.T) {
			r := tc.ix.Lookup(dns.Question{Name: tc.name, Qtype: tc.qtype, Qclass: dns.ClassINET}, 5)
			if r.Forward != tc.forward {
				t.Fatalf("forward %v, want %v", r.Forward, tc.forward)
			}
			if tc.forward {
				return
			}
			if r.Rcode != tc.rcode || !r.Authoritative {
				t.Errorf("rcode %s (authoritative %v), want %s with authority", dns.RcodeToString[r.Rcode], r.Authoritative, dns.RcodeToString[tc.rcode])
			}
			if got, want := strings.Join(strs(r.Answer), "\n"), strings.Join(rrs(t, tc.answer...), "\n"); got != want {
				t.Errorf("answer\n got %s\nwant %s", got, want)
			}
			if got, want := strings.Join(strs(r.Ns), "\n"), strings.Join(rrs(t, tc.ns...), "\n"); got != want {
				t.Errorf("authority\n got %s\nwant %s", got, want)
			}
		})
	}
}

// Over the wire: the upstream never hears of the overlay's addresses,
// and still answers every other reverse name.
func TestOverlayAddressesNeverReachTheUpstream(t *testing.T) {
	seen := make(chan string, 10)
	up := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		seen <- r.Question[0].Name
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeNameError)
		w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upSrv := &dns.Server{PacketConn: pc, Handler: up}
	go upSrv.ActivateAndServe()
	t.Cleanup(func() { upSrv.Shutdown() })

	s, addr := startServer(t, pc.LocalAddr().String())
	s.SetIndex(overlayIndex("100.90.0.0/16", map[string]string{"100.90.0.1": "ace.internal"}))
	for _, network := range []string{"udp", "tcp"} {
		r := query(t, addr, network, "1.0.90.100.in-addr.arpa.", dns.TypePTR)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.PTR).Ptr != "ace.internal." || !r.Authoritative {
			t.Fatalf("%s: PTR of a node's overlay address: %v", network, r)
		}
		if r := query(t, addr, network, "9.9.90.100.in-addr.arpa.", dns.TypePTR); r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 || !r.Authoritative {
			t.Fatalf("%s: PTR of an unused overlay address: %v", network, r)
		}
	}
	if r := query(t, addr, "udp", "8.8.8.8.in-addr.arpa.", dns.TypePTR); r.Rcode != dns.RcodeNameError || r.Authoritative {
		t.Fatalf("PTR of a public address: %v", r)
	}
	select {
	case name := <-seen:
		if name != "8.8.8.8.in-addr.arpa." {
			t.Fatalf("the upstream was asked %s", name)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the PTR of a public address was not forwarded")
	}
	select {
	case name := <-seen:
		t.Fatalf("the upstream was asked %s too", name)
	default:
	}
}

// The fast path leaves reverse names to the general path, which answers
// them.
func TestFastPathLeavesReverseNames(t *testing.T) {
	s := fastServer(t)
	lo := netip.MustParseAddr("127.0.0.1")
	for _, name := range []string{"1.0.90.100.in-addr.arpa.", "9.0.90.100.in-addr.arpa.", "90.100.in-addr.arpa."} {
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypePTR} {
			if checkAgrees(t, s, queryBytes(t, name, qt, nil), lo) {
				t.Errorf("the fast path answered %s %s", name, dns.TypeToString[qt])
			}
			if generalReply(s, queryBytes(t, name, qt, nil), lo) == nil {
				t.Errorf("%s %s is not answered here", name, dns.TypeToString[qt])
			}
		}
	}
}

// reverseSeeds are reverse names for the fuzz targets: of a node, unused,
// outside the prefix, and malformed.
var reverseSeeds = []string{
	"1.0.90.100.in-addr.arpa.", "9.0.90.100.in-addr.arpa.", "0.90.100.in-addr.arpa.", "90.100.in-addr.arpa.",
	"1.2.in-addr.arpa.", "300.1.90.100.in-addr.arpa.", "x.1.0.90.100.in-addr.arpa.", `1\.0.90.100.in-addr.arpa.`,
	"in-addr.arpa.", "8.8.8.8.in-addr.arpa.", "1.0.90.100.IN-ADDR.ARPA.",
}
