package dnsd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func testIndex() *Index {
	a := netip.MustParseAddr
	return NewIndex("internal", map[string][]netip.Addr{
		"ace.internal":    {a("10.0.0.1")},
		"novox.internal":  {a("10.0.0.2"), a("fd00::2")},
		"gitea.internal.": {a("10.0.0.2"), a("10.0.0.1")},
		"git.zurag.be":    {a("10.0.0.2")},
	}, 42)
}

func rrs(t *testing.T, lines ...string) []string {
	var out []string
	for _, l := range lines {
		rr, err := dns.NewRR(l)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rr.String())
	}
	return out
}

func strs(r []dns.RR) []string {
	var out []string
	for _, rr := range r {
		out = append(out, rr.String())
	}
	return out
}

const soa = "internal. 5 IN SOA ns.internal. hostmaster.internal. 42 60 30 600 5"

func TestLookup(t *testing.T) {
	ix := testIndex()
	for _, tc := range []struct {
		name    string
		qtype   uint16
		forward bool
		rcode   int
		answer  []string
		ns      []string
	}{
		{"ace.internal.", dns.TypeA, false, dns.RcodeSuccess, []string{"ace.internal. 5 IN A 10.0.0.1"}, nil},
		{"ACE.Internal.", dns.TypeA, false, dns.RcodeSuccess, []string{"ACE.Internal. 5 IN A 10.0.0.1"}, nil},
		{"gitea.internal.", dns.TypeA, false, dns.RcodeSuccess, []string{"gitea.internal. 5 IN A 10.0.0.1", "gitea.internal. 5 IN A 10.0.0.2"}, nil},
		{"novox.internal.", dns.TypeAAAA, false, dns.RcodeSuccess, []string{"novox.internal. 5 IN AAAA fd00::2"}, nil},
		{"ace.internal.", dns.TypeAAAA, false, dns.RcodeSuccess, nil, []string{soa}},
		{"ace.internal.", dns.TypeMX, false, dns.RcodeSuccess, nil, []string{soa}},
		{"nope.internal.", dns.TypeA, false, dns.RcodeNameError, nil, []string{soa}},
		{"internal.", dns.TypeSOA, false, dns.RcodeSuccess, []string{soa}, nil},
		{"internal.", dns.TypeNS, false, dns.RcodeSuccess, []string{"internal. 5 IN NS ns.internal."}, nil},
		{"internal.", dns.TypeA, false, dns.RcodeSuccess, nil, []string{soa}},
		{"git.zurag.be.", dns.TypeA, false, dns.RcodeSuccess, []string{"git.zurag.be. 5 IN A 10.0.0.2"}, nil},
		{"git.zurag.be.", dns.TypeAAAA, false, dns.RcodeSuccess, nil, []string{"zurag.be. 5 IN SOA ns.zurag.be. hostmaster.zurag.be. 42 60 30 600 5"}},
		// Other names of a public domain are the world's, not ours.
		{"www.zurag.be.", dns.TypeA, true, 0, nil, nil},
		{"zurag.be.", dns.TypeMX, true, 0, nil, nil},
		{"example.org.", dns.TypeA, true, 0, nil, nil},
	} {
		t.Run(tc.name+"/"+dns.TypeToString[tc.qtype], func(t *testing.T) {
			r := ix.Lookup(dns.Question{Name: tc.name, Qtype: tc.qtype, Qclass: dns.ClassINET}, 5)
			if r.Forward != tc.forward {
				t.Fatalf("forward %v, want %v", r.Forward, tc.forward)
			}
			if tc.forward {
				return
			}
			if r.Rcode != tc.rcode {
				t.Errorf("rcode %s, want %s", dns.RcodeToString[r.Rcode], dns.RcodeToString[tc.rcode])
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

// startServer runs a resolver on loopback with the test index and an upstream.
func startServer(t *testing.T, upstreams ...string) (*Server, string) {
	t.Helper()
	return startServerWith(t, Config{Addr: "127.0.0.1:0", Upstreams: upstreams})
}

func startServerWith(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	s, err := New(cfg, "internal")
	if err != nil {
		t.Fatal(err)
	}
	s.SetIndex(testIndex())
	addr, err := s.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, addr
}

func query(t *testing.T, addr, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	c := &dns.Client{Net: network}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s query %s: %v", network, name, err)
	}
	return r
}

// startUpstream runs an upstream of our own on loopback that answers
// example.org with 192.0.2.80, and returns its address.
func startUpstream(t *testing.T) string { return startUpstreamSeeing(t, nil) }

// startUpstreamSeeing is startUpstream that sends each query it gets to
// seen (when not nil).
func startUpstreamSeeing(t *testing.T, seen chan<- *dns.Msg) string {
	t.Helper()
	up := dns.NewServeMux()
	up.HandleFunc("example.org.", func(w dns.ResponseWriter, r *dns.Msg) {
		if seen != nil {
			seen <- r
		}
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR("example.org. 60 IN A 192.0.2.80")
		m.Answer = []dns.RR{rr}
		w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upSrv := &dns.Server{PacketConn: pc, Handler: up}
	go upSrv.ActivateAndServe()
	t.Cleanup(func() { upSrv.Shutdown() })
	return pc.LocalAddr().String()
}

func TestServerUDPAndTCPAndForward(t *testing.T) {
	s, addr := startServer(t, startUpstream(t))
	for _, network := range []string{"udp", "tcp"} {
		r := query(t, addr, network, "gitea.internal.", dns.TypeA)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 || !r.Authoritative {
			t.Fatalf("%s: %v", network, r)
		}
	}
	if r := query(t, addr, "udp", "nope.internal.", dns.TypeA); r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 {
		t.Fatalf("nxdomain: %v", r)
	}
	if r := query(t, addr, "udp", "example.org.", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "192.0.2.80" {
		t.Fatalf("forwarded: %v", r)
	}
	// A new index answers at once: no restart, no cache.
	s.SetIndex(NewIndex("internal", map[string][]netip.Addr{"gitea.internal": {netip.MustParseAddr("10.0.0.9")}}, 43))
	if r := query(t, addr, "udp", "gitea.internal.", dns.TypeA); len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "10.0.0.9" {
		t.Fatalf("after swap: %v", r)
	}
}

func TestServFailWhenNoUpstreamAnswers(t *testing.T) {
	s, _ := startServer(t, "127.0.0.1:9")
	s.exchange = func(context.Context, *dns.Msg, string, string) (*dns.Msg, error) {
		return nil, errors.New("timeout")
	}
	m := new(dns.Msg)
	m.SetQuestion("example.org.", dns.TypeA)
	r := s.answer(context.Background(), m, netip.MustParseAddr("127.0.0.1"))
	if r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("rcode %s", dns.RcodeToString[r.Rcode])
	}
}

func TestRefusesOutsiders(t *testing.T) {
	s, err := New(Config{Addr: "169.254.53.53:53", Allow: []netip.Prefix{netip.MustParsePrefix("10.88.0.0/16")}}, "internal")
	if err != nil {
		t.Fatal(err)
	}
	s.SetIndex(testIndex())
	m := new(dns.Msg)
	m.SetQuestion("ace.internal.", dns.TypeA)
	for src, want := range map[string]int{
		"127.0.0.1":     dns.RcodeSuccess,
		"169.254.53.53": dns.RcodeSuccess, // rootless containers arrive from the resolver's own address
		"10.88.0.7":     dns.RcodeSuccess,
		"192.0.2.9":     dns.RcodeRefused,
		"10.89.0.2":     dns.RcodeRefused,
	} {
		r := s.answer(context.Background(), m, netip.MustParseAddr(src))
		if r.Rcode != want {
			t.Errorf("from %s: %s, want %s", src, dns.RcodeToString[r.Rcode], dns.RcodeToString[want])
		}
		if want == dns.RcodeRefused && len(r.Answer) != 0 {
			t.Errorf("refused reply from %s carries answers", src)
		}
	}
}

func TestRefusesWildcardBind(t *testing.T) {
	if _, err := New(Config{Addr: "0.0.0.0:53"}, "internal"); err == nil || !strings.Contains(err.Error(), "wildcard") {
		t.Fatalf("wildcard accepted: %v", err)
	}
}

func TestTruncatesLargeUDPAnswers(t *testing.T) {
	names := map[string][]netip.Addr{}
	var many []netip.Addr
	for i := 1; i <= 60; i++ {
		many = append(many, netip.AddrFrom4([4]byte{10, 0, 1, byte(i)}))
	}
	names["big.internal"] = many
	s, addr := startServer(t)
	s.SetIndex(NewIndex("internal", names, 1))
	if r := query(t, addr, "udp", "big.internal.", dns.TypeA); !r.Truncated {
		t.Fatalf("60 A records over plain UDP not truncated (%d answers)", len(r.Answer))
	}
	if r := query(t, addr, "tcp", "big.internal.", dns.TypeA); r.Truncated || len(r.Answer) != 60 {
		t.Fatalf("tcp: truncated=%v, %d answers", r.Truncated, len(r.Answer))
	}
}

// FuzzAnswer feeds arbitrary packets to the handler: no panic, and every reply
// packs into a well-formed message.
func FuzzAnswer(f *testing.F) {
	m := new(dns.Msg)
	m.SetQuestion("ace.internal.", dns.TypeA)
	b, _ := m.Pack()
	f.Add(b)
	m.SetEdns0(1232, true)
	b, _ = m.Pack()
	f.Add(b)
	m.SetQuestion("example.org.", dns.TypeAAAA)
	b, _ = m.Pack()
	f.Add(b)
	for _, name := range reverseSeeds {
		for _, qt := range []uint16{dns.TypePTR, dns.TypeA, dns.TypeSOA} {
			m.SetQuestion(name, qt)
			b, _ = m.Pack()
			f.Add(b)
		}
	}
	s, err := New(Config{Addr: "127.0.0.1:0"}, "internal")
	if err != nil {
		f.Fatal(err)
	}
	// A non-octet prefix, so that names around it are forwarded too.
	s.SetIndex(overlayIndex("100.64.0.0/10", map[string]string{"100.90.0.1": "ace.internal"}))
	s.exchange = func(context.Context, *dns.Msg, string, string) (*dns.Msg, error) {
		return nil, errors.New("no network in fuzzing")
	}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		req := new(dns.Msg)
		if err := req.Unpack(pkt); err != nil {
			return // miekg/dns answers FORMERR itself before the handler
		}
		r := s.answer(context.Background(), req, netip.MustParseAddr("127.0.0.1"))
		if r == nil {
			if !req.Response {
				t.Fatal("no reply to a query")
			}
			return
		}
		r.Truncate(dns.MinMsgSize)
		if _, err := r.Pack(); err != nil {
			t.Fatalf("reply does not pack: %v", err)
		}
	})
}

// BenchmarkLookup measures the index alone at 100 and 10,000 names, with the
// bench/dns.sh query mix (A, unknown name, AAAA).
func BenchmarkLookup(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			names := map[string][]netip.Addr{}
			for i := 0; i < n; i++ {
				names[fmt.Sprintf("n%06d.internal", i)] = []netip.Addr{netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})}
			}
			ix := NewIndex("internal", names, 1)
			qs := make([]dns.Question, 3000)
			for i := range qs {
				k := (i * 7919) % n
				switch i % 3 {
				case 0:
					qs[i] = dns.Question{Name: fmt.Sprintf("n%06d.internal.", k), Qtype: dns.TypeA, Qclass: dns.ClassINET}
				case 1:
					qs[i] = dns.Question{Name: fmt.Sprintf("nope%06d.internal.", k), Qtype: dns.TypeA, Qclass: dns.ClassINET}
				default:
					qs[i] = dns.Question{Name: fmt.Sprintf("n%06d.internal.", k), Qtype: dns.TypeAAAA, Qclass: dns.ClassINET}
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ix.Lookup(qs[i%len(qs)], 5)
			}
		})
	}
}

// A network created since the last refresh may ask at once: a query from an
// unknown source reads the allowed sources anew (at most once a second)
// before it is refused.
func TestNewNetworkIsAllowedAtOnce(t *testing.T) {
	nets := []netip.Prefix{netip.MustParsePrefix("10.88.0.0/16")}
	calls := 0
	s, err := New(Config{Addr: "169.254.53.53:53", Allow: nets, Refresh: func() []netip.Prefix { calls++; return nets }}, "internal")
	if err != nil {
		t.Fatal(err)
	}
	s.SetIndex(testIndex())
	m := new(dns.Msg)
	m.SetQuestion("ace.internal.", dns.TypeA)
	// The operator creates a network; the next query from it is answered.
	nets = append(nets, netip.MustParsePrefix("10.89.0.0/24"))
	if r := s.answer(context.Background(), m, netip.MustParseAddr("10.89.0.2")); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("from the new network: %s", dns.RcodeToString[r.Rcode])
	}
	// An outsider is refused, and a flood of them refreshes at most once a second.
	for i := 0; i < 100; i++ {
		if r := s.answer(context.Background(), m, netip.MustParseAddr("192.0.2.9")); r.Rcode != dns.RcodeRefused {
			t.Fatalf("outsider: %s", dns.RcodeToString[r.Rcode])
		}
	}
	if calls > 2 {
		t.Fatalf("%d refreshes for a burst of refused queries", calls)
	}
}

// Config.Observe sees every answered query, UDP (the batch path), TCP and
// forwarded, with its rcode.
func TestObserveSeesEveryAnswer(t *testing.T) {
	upstream := startUpstream(t)
	var mu sync.Mutex
	seen := map[string]int{}
	_, addr := startServerWith(t, Config{Addr: "127.0.0.1:0", Upstreams: []string{upstream}, Observe: func(rcode int, forwarded bool, took time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		seen[fmt.Sprintf("%s/%v", dns.RcodeToString[rcode], forwarded)]++
	}})
	query(t, addr, "udp", "gitea.internal.", dns.TypeA)
	query(t, addr, "tcp", "gitea.internal.", dns.TypeA)
	query(t, addr, "udp", "nope.internal.", dns.TypeA)
	query(t, addr, "udp", "example.org.", dns.TypeA)
	want := map[string]int{"NOERROR/false": 2, "NXDOMAIN/false": 1, "NOERROR/true": 1}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		got := fmt.Sprint(seen)
		mu.Unlock()
		if got == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("observed %s, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// held counts the queries an upstream holds: now and at most.
type held struct {
	mu        sync.Mutex
	now, peak int
}

func (h *held) get() (now, peak int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now, h.peak
}

// silentUpstream starts a server of cfg, with floodOver, whose upstream
// never answers (it holds each query until its budget ends) but for the
// names in answers, which it answers at once with an A record.
func silentUpstream(t *testing.T, cfg Config, over time.Duration, answers ...string) (*Server, string, *held) {
	t.Helper()
	cfg.Addr, cfg.Upstreams = "127.0.0.1:0", []string{"192.0.2.53:53"}
	s, err := New(cfg, "internal")
	if err != nil {
		t.Fatal(err)
	}
	s.floodOver = over
	up := &held{}
	s.exchange = func(ctx context.Context, m *dns.Msg, upstream, network string) (*dns.Msg, error) {
		if slices.Contains(answers, m.Question[0].Name) {
			r := new(dns.Msg)
			r.SetReply(m)
			r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 7)})
			return r, nil
		}
		up.mu.Lock()
		up.now++
		up.peak = max(up.peak, up.now)
		up.mu.Unlock()
		<-ctx.Done()
		up.mu.Lock()
		up.now--
		up.mu.Unlock()
		return nil, ctx.Err()
	}
	s.SetIndex(testIndex())
	addr, err := s.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, addr, up
}

// Issue 13 item 5: a flood of names the upstream never answers holds at
// most MaxForwarding queries (and sockets) at once; the rest get SERVFAIL
// at once, and the mesh's own names are answered throughout.
func TestForwardingIsBounded(t *testing.T) {
	const limit = 8
	over := make(chan struct{}, 4)
	s, addr, up := silentUpstream(t, Config{MaxForwarding: limit, AfterFlood: func() { over <- struct{}{} }}, 300*time.Millisecond)
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const flood = 300
	// Read while sending: answers that wait in the client's socket buffer
	// would overflow it and be dropped by the kernel.
	got := make(chan int, 1)
	go func() {
		servfail := 0
		conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 4096)
		for servfail < flood-limit {
			n, err := conn.Read(buf)
			if err != nil {
				break
			}
			r := new(dns.Msg)
			if r.Unpack(buf[:n]) == nil && r.Rcode == dns.RcodeServerFailure {
				servfail++
			}
		}
		got <- servfail
	}()
	start := time.Now()
	for i := 0; i < flood; i++ {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("r%d.example.org.", i), dns.TypeA)
		b, _ := m.Pack()
		conn.Write(b)
		if i%5 == 4 {
			time.Sleep(time.Millisecond) // nor outrun the server's
		}
	}
	if servfail := <-got; servfail < flood-limit {
		t.Fatalf("%d of the %d queries past the cap got SERVFAIL within %s", servfail, flood-limit, time.Since(start))
	}
	// The mesh's own names are answered while the cap is full.
	if r := query(t, addr, "udp", "gitea.internal.", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
		t.Fatalf("a mesh name during the flood: %v", r)
	}
	if _, peak := up.get(); peak > limit || peak == 0 {
		t.Fatalf("%d queries were forwarded at once; the cap is %d", peak, limit)
	}
	// Once the flood is over, the server says so, once.
	select {
	case <-over:
	case <-time.After(5 * time.Second):
		t.Fatal("AfterFlood was not called after the flood")
	}
	select {
	case <-over:
		t.Fatal("AfterFlood was called twice for one flood")
	case <-time.After(3 * s.floodOver):
	}
}

// RFC 3225: the DO bit of a query is copied into the response.
func TestDOBitIsCopied(t *testing.T) {
	_, addr := startServer(t)
	for _, do := range []bool{true, false} {
		m := new(dns.Msg)
		m.SetQuestion("gitea.internal.", dns.TypeA)
		m.SetEdns0(1232, do)
		r, _, err := (&dns.Client{Net: "udp"}).Exchange(m, addr)
		if err != nil {
			t.Fatal(err)
		}
		if o := r.IsEdns0(); o == nil || o.Do() != do {
			t.Fatalf("DO=%v in the query, OPT %v in the answer", do, o)
		}
	}
}

// The zone's NS target resolves, to the resolver itself.
func TestNSTargetResolves(t *testing.T) {
	_, addr := startServer(t)
	ns := query(t, addr, "udp", "internal.", dns.TypeNS)
	if len(ns.Answer) != 1 {
		t.Fatalf("NS: %v", ns)
	}
	target := ns.Answer[0].(*dns.NS).Ns
	r := query(t, addr, "udp", target, dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "127.0.0.1" {
		t.Fatalf("%s: %v", target, r)
	}
}

// A datagram longer than the resolver reads (the 4096 bytes it advertises)
// arrives cut short; it is dropped whole rather than answered from its first
// part, and the next query is answered as usual.
func TestDropsDatagramsLongerThanItReads(t *testing.T) {
	_, addr := startServer(t)
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(id uint16, pad int) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion("ace.internal.", dns.TypeA)
		m.Id = id
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(append(b, make([]byte, pad)...)); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 4096)
		n, err := conn.Read(buf)
		if err != nil {
			return nil
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil {
			t.Fatalf("answer does not unpack: %v", err)
		}
		return r
	}
	// Trailing bytes within what it reads are no reason to drop a query.
	if r := ask(1, 100); r == nil || r.Id != 1 {
		t.Fatalf("query with 100 trailing bytes: got %v, want an answer", r)
	}
	if r := ask(2, 5000); r != nil {
		t.Fatalf("datagram of %d bytes answered (id %d), want it dropped", 5000, r.Id)
	}
	if r := ask(3, 0); r == nil || r.Id != 3 || len(r.Answer) == 0 {
		t.Fatalf("query after the long datagram: got %v, want an answer", r)
	}
}

// TCP connections are bounded from one source and in all: past either bound
// a new connection is closed before anything is read, the ones open keep
// being answered, and a place given back is taken again.
func TestTCPConnectionsAreBounded(t *testing.T) {
	_, addr := startServerWith(t, Config{Addr: "127.0.0.1:0", MaxTCP: 5, MaxTCPPerSource: 3})
	// dial opens a connection from the loopback address from and asks one
	// query on it; it returns the connection if the query was answered.
	dial := func(from string) (*dns.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		dc := &dns.Conn{Conn: c}
		m := new(dns.Msg)
		m.SetQuestion("ace.internal.", dns.TypeA)
		dc.SetDeadline(time.Now().Add(2 * time.Second))
		if err := dc.WriteMsg(m); err != nil {
			c.Close()
			return nil, err
		}
		r, err := dc.ReadMsg()
		if err != nil {
			c.Close()
			return nil, err
		}
		if r.Id != m.Id || len(r.Answer) == 0 {
			c.Close()
			return nil, fmt.Errorf("answer %v", r)
		}
		return dc, nil
	}
	var open []*dns.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := 0; i < 3; i++ {
		c, err := dial("127.0.0.1")
		if err != nil {
			t.Fatalf("connection %d from 127.0.0.1: %v", i+1, err)
		}
		open = append(open, c)
	}
	if c, err := dial("127.0.0.1"); err == nil {
		c.Close()
		t.Fatal("a 4th connection from one source was answered, want it closed (3 per source)")
	}
	for i := 0; i < 2; i++ {
		c, err := dial("127.0.0.2")
		if err != nil {
			t.Fatalf("connection %d from 127.0.0.2: %v", i+1, err)
		}
		open = append(open, c)
	}
	if c, err := dial("127.0.0.3"); err == nil {
		c.Close()
		t.Fatal("a 6th connection in all was answered, want it closed (5 in all)")
	}
	// The connections open are still answered.
	m := new(dns.Msg)
	m.SetQuestion("novox.internal.", dns.TypeA)
	open[0].SetDeadline(time.Now().Add(2 * time.Second))
	if err := open[0].WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	if r, err := open[0].ReadMsg(); err != nil || len(r.Answer) == 0 {
		t.Fatalf("open connection: %v %v", r, err)
	}
	// One closed: its place is taken again (once the server has seen it go).
	open[0].Close()
	open = open[1:]
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := dial("127.0.0.3")
		if err == nil {
			open = append(open, c)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a place given back was not taken again: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Sockets bound by someone else (the helper that may bind port 53 for a
// rootless agent) are served as they are; ones bound elsewhere than the
// resolver's address are refused.
func TestServesGivenSockets(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	_, bound := startServerWith(t, Config{Addr: addr, Sockets: &Sockets{UDP: []net.PacketConn{pc}, TCP: l}})
	if bound != addr {
		t.Fatalf("bound %s, want %s", bound, addr)
	}
	for _, network := range []string{"udp", "tcp"} {
		if r := query(t, addr, network, "gitea.internal.", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			t.Fatalf("%s on the given sockets: %v", network, r)
		}
	}
	other, _ := net.ListenPacket("udp", "127.0.0.1:0")
	defer other.Close()
	s, err := New(Config{Addr: "127.0.0.1:53", Sockets: &Sockets{UDP: []net.PacketConn{other}, TCP: l}}, "internal")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(); err == nil || !strings.Contains(err.Error(), "not 127.0.0.1:53") {
		t.Fatalf("sockets bound elsewhere: %v", err)
	}
}

// One source holds at most a quarter of the forwarding slots: a container
// flooding names of a domain that never answers no longer takes them all,
// and another container's lookups outside the mesh are still forwarded.
func TestForwardingSharePerSource(t *testing.T) {
	const limit = 8 // a share of 2
	_, addr, up := silentUpstream(t, Config{MaxForwarding: limit}, floodOver, "ok.example.org.")
	flood, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Close()
	const n = 20
	for i := range n {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("r%d.example.org.", i), dns.TypeA)
		b, _ := m.Pack()
		flood.Write(b)
	}
	// The flood's answers: SERVFAIL for all but its share, at once.
	flood.SetReadDeadline(time.Now().Add(3 * time.Second))
	servfail, buf := 0, make([]byte, 4096)
	for servfail < n-limit/4 {
		k, err := flood.Read(buf)
		if err != nil {
			t.Fatalf("%d of the flood's %d queries past its share got SERVFAIL: %v", servfail, n-limit/4, err)
		}
		r := new(dns.Msg)
		if r.Unpack(buf[:k]) == nil && r.Rcode == dns.RcodeServerFailure {
			servfail++
		}
	}
	// Its share reaches the upstream a moment after the SERVFAILs left.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		h, _ := up.get()
		if h > limit/4 || h < limit/4 && time.Now().After(deadline) {
			t.Fatalf("the flooding source holds %d upstream queries, want its share of %d", h, limit/4)
		}
		if h == limit/4 {
			break
		}
	}
	// Another source is still forwarded while the flood holds its share.
	other, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP("127.0.0.2")}, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	m := new(dns.Msg)
	m.SetQuestion("ok.example.org.", dns.TypeA)
	b, _ := m.Pack()
	other.Write(b)
	other.SetReadDeadline(time.Now().Add(3 * time.Second))
	k, err := other.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:k]); err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("another source's lookup during the flood: %v %v", r, err)
	}
}

// With port 0 the TCP socket takes the port UDP picked, which another
// process's connection may hold: Start picks again (CI saw this once).
// A port the operator chose is not changed.
func TestStartPicksAgainWhenTCPPortIsTaken(t *testing.T) {
	taken := 0
	listenTCP = func(network, addr string) (net.Listener, error) {
		if taken < 3 {
			taken++
			return nil, &net.OpError{Op: "listen", Net: network, Err: os.NewSyscallError("bind", syscall.EADDRINUSE)}
		}
		return net.Listen(network, addr)
	}
	t.Cleanup(func() { listenTCP = net.Listen })
	_, addr := startServer(t, startUpstream(t))
	if taken != 3 {
		t.Fatalf("TCP listen tried after %d refusals, want 3", taken)
	}
	if r := query(t, addr, "tcp", "gitea.internal.", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("tcp: %v", r)
	}

	taken = 0
	fixed, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := fixed.LocalAddr().String()
	fixed.Close()
	s, err := New(Config{Addr: port}, "internal")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(); !errors.Is(err, syscall.EADDRINUSE) || taken != 1 {
		s.Close()
		t.Fatalf("fixed port: err %v after %d tries, want EADDRINUSE after 1", err, taken)
	}
}
