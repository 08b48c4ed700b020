package dnsd

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// A query is forwarded upstream as its question and EDNS record only, and
// a UDP query with more records than a query has (miekg/dns's own rule
// over TCP) is not unpacked nor answered: a 4 kB query of hundreds of
// records held some 100 kB while it was forwarded.
func TestQueriesCarryOnlyTheirQuestion(t *testing.T) {
	seen := make(chan *dns.Msg, 4)
	_, addr := startServer(t, startUpstreamSeeing(t, seen))

	rr := func(s string) dns.RR {
		r, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	m := new(dns.Msg)
	m.SetQuestion("example.org.", dns.TypeA)
	m.Answer = []dns.RR{rr("example.org. 60 IN A 198.51.100.1")}
	m.Ns = []dns.RR{rr("example.org. 60 IN NS ns.example.org.")}
	m.Extra = []dns.RR{rr("ns.example.org. 60 IN A 198.51.100.2")}
	m.SetEdns0(1232, true)
	for _, network := range []string{"udp", "tcp"} {
		c := &dns.Client{Net: network, Timeout: 5 * time.Second}
		r, _, err := c.Exchange(m, addr)
		if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Fatalf("%s: %v %v", network, r, err)
		}
		got := <-seen
		if len(got.Answer) != 0 || len(got.Ns) != 0 || len(got.Extra) != 1 || got.IsEdns0() == nil || !got.IsEdns0().Do() {
			t.Errorf("%s: upstream was sent %v", network, got)
		}
	}

	// Over UDP, a query of more records than a query has gets nothing.
	big := m.Copy()
	big.Compress = true
	for range 200 {
		big.Answer = append(big.Answer, rr("example.org. 60 IN A 198.51.100.3"))
	}
	if b, err := big.Pack(); err != nil || len(b) > maxQuery {
		t.Fatalf("the query of many records is %d bytes (%v), past what the reader reads", len(b), err)
	}
	c := &dns.Client{Net: "udp", Timeout: 500 * time.Millisecond, UDPSize: 65000}
	if r, _, err := c.Exchange(big, addr); err == nil {
		t.Errorf("a query of 201 answer records was answered: %v", r)
	}
	select {
	case got := <-seen:
		t.Errorf("a query of 201 answer records was forwarded: %d answers", len(got.Answer))
	default:
	}
	if r, _, err := (&dns.Client{Net: "udp", Timeout: 5 * time.Second}).Exchange(m, addr); err != nil || len(r.Answer) != 1 {
		t.Fatalf("after it, a plain query: %v %v", r, err)
	}
}
