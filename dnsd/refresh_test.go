package dnsd

import (
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// outsideAddr is one of this host's addresses that is not loopback, for a
// client the resolver on 127.0.0.1 does not allow; the test is skipped on
// a host that has none.
func outsideAddr(t *testing.T) netip.Addr {
	t.Helper()
	as, _ := net.InterfaceAddrs()
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			return p.Addr()
		}
	}
	t.Fatal("no address other than loopback on this host: the test needs one to ask from as an outsider")
	return netip.Addr{}
}

func udpAsk(t *testing.T, from netip.Addr, to, name string, wait time.Duration) (*dns.Msg, error) {
	t.Helper()
	c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(to)))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	b, _ := m.Pack()
	c.Write(b)
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return nil, err
	}
	r := new(dns.Msg)
	return r, r.Unpack(buf[:n])
}

// A query from a source not allowed reads the allowed sources anew (Config.
// Refresh: Podman's API, which may be slow, restarting or hung), but never
// on the goroutine that reads the queries: anybody who can reach the
// address (a host of the LAN, a peer of the overlay) sent one datagram a
// second and every container's lookups, the mesh's names among them, waited
// for Podman. One refresh runs at a time, and the query that asked for it
// is still answered once it is over (a new network may ask at once).
func TestRefreshNeverHoldsUpTheQueries(t *testing.T) {
	outside := outsideAddr(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	release := make(chan struct{})
	var calls atomic.Int32
	refresh := func() []netip.Prefix {
		calls.Add(1)
		<-release // Podman hangs
		return []netip.Prefix{netip.PrefixFrom(outside, 32)}
	}
	// One UDP socket, so the outsider's query and the container's share it.
	startServerWith(t, Config{Addr: addr, Sockets: &Sockets{UDP: []net.PacketConn{pc}, TCP: l}, Refresh: refresh})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	asked := make(chan *dns.Msg, 1)
	go func() {
		r, _ := udpAsk(t, outside, addr, "ace.internal.", 5*time.Second)
		asked <- r
	}()
	for deadline := time.Now().Add(2 * time.Second); calls.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a query from a source not allowed did not refresh the allowed sources")
		}
	}
	// While Podman hangs, a container's lookups are answered at once.
	for i := 0; i < 3; i++ {
		r, err := udpAsk(t, netip.MustParseAddr("127.0.0.1"), addr, "ace.internal.", time.Second)
		if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			t.Fatalf("a container's lookup while a refresh hangs: %v %v", r, err)
		}
	}
	// More outsiders, more than a second on: still one refresh at a time.
	time.Sleep(1100 * time.Millisecond)
	for i := 0; i < 5; i++ {
		udpAsk(t, outside, addr, "ace.internal.", 100*time.Millisecond)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d refreshes running at once, want 1", n)
	}
	// The refresh ends: the source it allows is answered.
	close(release)
	released = true
	select {
	case r := <-asked:
		if r == nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			t.Fatalf("the query that asked for the refresh: %v", r)
		}
	case <-time.After(6 * time.Second):
		t.Fatal("the query that asked for the refresh was never answered")
	}
}

// Sources that may not query (a host of the LAN that routes the resolver's
// address to the node, a peer of the overlay) hold TCP connections open as
// long as they like (REFUSED, then idle 8 s, 128 queries on one); counted
// within the same bound as the containers, a few of them held every place
// and every container's lookups over TCP (any answer too long for UDP)
// were turned away. They have places of their own.
func TestOutsidersCannotTakeTheContainersTCPPlaces(t *testing.T) {
	outside := outsideAddr(t)
	_, addr := startServerWith(t, Config{Addr: "127.0.0.1:0", MaxTCP: 2, MaxTCPPerSource: 2})
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < 2; i++ {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(outside, 0)), Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c) // says nothing, or is REFUSED and asks again
	}
	time.Sleep(100 * time.Millisecond) // the server accepted them
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	dc := &dns.Conn{Conn: c}
	defer dc.Close()
	m := new(dns.Msg)
	m.SetQuestion("ace.internal.", dns.TypeA)
	dc.SetDeadline(time.Now().Add(2 * time.Second))
	if err := dc.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	r, err := dc.ReadMsg()
	if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Fatalf("a container's TCP lookup while outsiders hold connections: %v %v", r, err)
	}
}
